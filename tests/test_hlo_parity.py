"""HLO parity: mlaxgraph's train step compiles to the same XLA program as the same step
written by hand in JAX.

For the MLP and the digits CNN of the benchmarks (``benchmarks/models_spec.py``), the
optimized HLO of the jitted train step (forward, backward, Adam update) has exactly as
many dots, convolutions, fusions and converts as the hand-written one
(``benchmarks/models_hand.py``: ``jax.jit`` over a params dict). Exact counts, no
timing.

Compared like with like:
  - a step written over ``model.apply_fn`` vs the bare hand-written step;
  - ``mg.train.Trainer`` (the loss only, its default) vs the hand-written step that
    also counts steps (as ``TrainState.step`` does);
  - ``mg.train.Trainer(..., metrics=("accuracy",))`` vs the hand-written step that
    also counts steps and computes the accuracy.

Only JAX and optax are imported besides mlaxgraph (the peer libraries of the benchmarks
are not needed here). The steps are traced under standard dtype promotion, as optax
needs (``mg.train.Trainer`` sets it around the optimizer itself); the suite's strict
setting stays on elsewhere.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import hlo_stats  # noqa: E402
import models_hand  # noqa: E402
import models_mg  # noqa: E402
import models_spec  # noqa: E402

import mlaxgraph as mg  # noqa: E402

MODELS = ("mlp", "cnn")
KEYS = ("dot", "convolution", "fusion", "convert")


@pytest.fixture(autouse=True)
def _standard_promotion():
    with jax.numpy_dtype_promotion("standard"):
        yield


def _data(name):
    x, y = models_spec.batch(models_spec.SPECS[name])
    return jnp.asarray(x), jnp.asarray(y)


def _hand_hlo(name, count_steps=False, accuracy=False) -> str:
    tx = models_spec.optimizer()
    params, state = models_hand.init(name, jax.random.key(0))
    ts = (params, state, tx.init(params))
    if count_steps:
        ts = (jnp.zeros((), jnp.int32),) + ts
    step = jax.jit(models_hand.make_step_fn(name, tx, count_steps, accuracy), donate_argnums=0)
    x, y = _data(name)
    return step.lower(ts, x, y).compile().as_text()


def _mg_hlo(name, variant) -> str:
    x, y = _data(name)
    run = models_mg.make(name, x, y, jax.random.key(0), variant=variant)
    return run.lower().compile().as_text()


def _assert_same_counts(mine: str, hand: str):
    a, b = hlo_stats.opcode_counts(mine), hlo_stats.opcode_counts(hand)
    got = {k: a.get(k, 0) for k in KEYS}
    want = {k: b.get(k, 0) for k in KEYS}
    assert got == want, f"mlaxgraph {got} vs hand-written {want}; all differences: {hlo_stats.diff(a, b)}"
    assert want["dot"] + want["convolution"] > 0 and want["fusion"] > 0  # the parser found them


@pytest.mark.parametrize("name", MODELS)
def test_apply_step_has_the_hand_written_hlo(name):
    _assert_same_counts(_mg_hlo(name, "apply_step"), _hand_hlo(name))


@pytest.mark.parametrize("name", MODELS)
def test_trainer_has_the_hand_written_hlo(name):
    _assert_same_counts(_mg_hlo(name, "trainer"), _hand_hlo(name, count_steps=True))


@pytest.mark.parametrize("name", MODELS)
def test_trainer_with_accuracy_has_the_hand_written_hlo(name):
    _assert_same_counts(_mg_hlo(name, "trainer_accuracy"),
                        _hand_hlo(name, count_steps=True, accuracy=True))


@pytest.mark.parametrize("name", MODELS)
def test_the_two_steps_compute_the_same_numbers(name):
    """The comparison is of the same computation: from the same params, one step of
    each gives the same loss and the same new params."""
    x, y = _data(name)
    tx = models_spec.optimizer()
    model = mg.compile(models_mg.GRAPHS[name]())
    params, state = model.init(jax.random.key(0))
    copy = jax.tree.map(jnp.array, (params, state, tx.init(params)))
    ours = jax.jit(models_mg.make_apply_step_fn(model, tx))((params, state, tx.init(params)), x, y)
    hand = jax.jit(models_hand.make_step_fn(name, tx))(copy, x, y)
    np.testing.assert_allclose(ours[1], hand[1], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ours[0]), jax.tree.leaves(hand[0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_opcode_counter_reads_hlo_text():
    text = """HloModule m, entry_computation_layout={(f32[2]{0})->(f32[2]{0}, s32[])}

%fused (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %c = f32[2]{0} convert(%p), metadata={op_name="jit(f)/convert_element_type(x)"}
}

ENTRY %main (a: f32[2]) -> (f32[2]{0}, s32[]) {
  %a = f32[2]{0} parameter(0)
  %fusion = f32[2]{0} fusion(%a), kind=kLoop, calls=%fused
  %d = f32[] dot(%a, %a), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %t = (f32[2]{0}, s32[]) tuple(%fusion, %d)
  ROOT %r = (f32[2]{0}, s32[]) tuple(%fusion, %d)
}
"""
    c = hlo_stats.opcode_counts(text)
    assert (c["convert"], c["fusion"], c["dot"], c["tuple"], c["parameter"]) == (1, 1, 1, 2, 2)
