"""Intervention functions read their values at every call, and a sweep over a float or
an array they read compiles once (mlaxgraph.compiler.tap_functions)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg

CONFIG = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}
IDS = (np.arange(16, dtype=np.int32).reshape(2, 8) * 5) % 64


class Traces:
    """A counter the functions below keep (an object: part of the key by identity)."""

    def __init__(self):
        self.n = 0


TRACES = Traces()


STRENGTH = {"ln_f": 0.0}


def steer(value):
    TRACES.n += 1  # runs when traced only
    return value * STRENGTH["ln_f"]


@pytest.fixture(scope="module")
def model():
    m = mg.compile(mg.models.gpt2(CONFIG))
    params, state = m.init(jax.random.key(0))
    plain, _ = m.apply(params, state, IDS, inference_mode=True)
    return m, params, state, np.asarray(plain)


# GPT-2's head is the tied embedding without a bias: the logits are linear in ln_f's
# output, so scaling it by a scales them by a (the NumPy reference).

def test_a_reused_function_reads_the_changed_value_without_compiling_again(model):
    m, params, state, plain = model
    before = TRACES.n
    for a in (0.0, 1.0, 0.5):
        STRENGTH["ln_f"] = a
        out, _ = m.apply(params, state, IDS, inference_mode=True, intervene={"ln_f": steer})
        np.testing.assert_allclose(out, a * plain, rtol=1e-5, atol=1e-5)
    assert TRACES.n - before == 1


def test_a_fresh_lambda_per_value_is_one_compiled_function(model):
    m, params, state, plain = model
    count = Traces()
    for a in (0.25, 2.0, -1.0):
        def scaled(v, a=a):  # a default, a closure and an array: all read each call
            count.n += 1
            return v * a * direction  # noqa: B023 (read at the call, on purpose)

        direction = jnp.full((32,), 1.0 + a)
        out, _ = m.apply(params, state, IDS, inference_mode=True, intervene={"ln_f": scaled})
        np.testing.assert_allclose(out, a * (1.0 + a) * plain, rtol=1e-5, atol=1e-5)
        part = functools.partial(lambda v, s: v * s, s=a)
        out, _ = m.apply(params, state, IDS, inference_mode=True, intervene={"ln_f": part})
        np.testing.assert_allclose(out, a * plain, rtol=1e-5, atol=1e-5)
    assert count.n == 1


def test_python_control_flow_on_a_float_it_reads_still_works(model):
    m, params, state, plain = model
    for a, factor in ((1.0, 2.0), (0.0, 1.0)):
        out, _ = m.apply(params, state, IDS, inference_mode=True,
                         intervene={"ln_f": lambda v: v * 2.0 if a > 0.5 else v})  # noqa: B023
        np.testing.assert_allclose(out, factor * plain, rtol=1e-5, atol=1e-5)


def test_a_list_the_function_appends_to_stays_the_callers(model):
    m, params, state, _ = model
    calls = []
    m.apply(params, state, IDS, inference_mode=True,
            intervene={"ln_f": lambda v: calls.append(v.shape) or v * 2.0})
    assert calls == [(2, 8, 32)]
