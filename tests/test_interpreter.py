"""The interpreter (``run``) on small hand-built graphs, against NumPy written here: the
outputs of Linear and relu, of nested blocks and of a block called twice (one set of
weights); the new state of BatchNorm in training; the hook, which sees the inputs and
every step in order and may replace what they give; the keys (``step_key``: the apply
key folded with the crc32 salt of each name of the step's path, checked against a
hand-written ``jax.random.fold_in`` chain, and the key each random step and each block
of a scan receives); and the errors for weights that are missing, mis-shaped or not
floating-point, each naming the layer and the weight."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import close

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler.flatten import flatten
from mlaxgraph.compiler.interpreter import run, step_key

RNG = np.random.default_rng(0)


def normal(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def salt(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def folded(key, *names):
    """``key`` folded with each name's salt, by hand."""
    for name in names:
        key = jax.random.fold_in(key, salt(name))
    return key


def relu(a):
    return np.maximum(a, 0.0)


def dense(x, p):
    return np.asarray(x, np.float64) @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def infer(program, params, state, *inputs, hook=None):
    outputs, new_state = run(program, params, state, inputs, rng=None, inference_mode=True,
                             bindings=None, hook=hook)
    return outputs, new_state


def mlp_graph() -> mg.Graph:
    x = mg.Input(("batch", 5), name="x")
    h = ops.relu(ops.Linear(3, name="fc")(x))
    return mg.Graph(x, ops.Linear(2, name="out")(h), name="mlp")


def mlp_params():
    return {"fc": {"kernel": normal(5, 3), "bias": normal(3)},
            "out": {"kernel": normal(3, 2), "bias": normal(2)}}


def block(width: int = 4) -> mg.Graph:
    x = mg.Input(("batch", width), name="x")
    return mg.Graph(x, ops.relu(ops.Linear(width, name="fc")(x)), name="block")


def shared_twice() -> mg.Graph:
    layer = block().as_block("shared")
    x = mg.Input(("batch", 4), name="x")
    return mg.Graph(x, layer(layer(x)), name="twice")


# --- outputs ---------------------------------------------------------------------------


def test_linear_and_relu_match_numpy():
    program, params, x = flatten(mlp_graph()), mlp_params(), normal(4, 5)
    want = dense(relu(dense(x, params["fc"])), params["out"])
    (got,), new_state = infer(program, params, {}, x)
    assert got.shape == (4, 2) and got.dtype == jnp.float32
    close(got, want)
    assert new_state == {}
    # With the batch bound (output shapes checked against it) and under jit: the same.
    (bound,), _ = run(program, params, {}, (x,), rng=None, inference_mode=True, bindings={"batch": 4})
    close(bound, want)
    jitted = jax.jit(lambda p, x: run(program, p, {}, (x,), rng=None, inference_mode=False,
                                      bindings=None)[0][0])
    close(jitted(params, x), want)


def test_several_outputs_come_in_the_graphs_order():
    x = mg.Input(("batch", 5), name="x")
    h = ops.Linear(3, name="fc")(x)
    program = flatten(mg.Graph(x, [ops.relu(h), h, x]))
    params = {"fc": {"kernel": normal(5, 3), "bias": normal(3)}}
    xs = normal(2, 5)
    outputs, _ = infer(program, params, {}, xs)
    assert len(outputs) == 3
    close(outputs[0], relu(dense(xs, params["fc"])))
    close(outputs[1], dense(xs, params["fc"]))
    np.testing.assert_array_equal(outputs[2], xs)


def test_a_block_called_twice_runs_twice_with_one_set_of_weights():
    program = flatten(shared_twice())
    params = {"shared": {"fc": {"kernel": normal(4, 4), "bias": normal(4)}}}
    x = normal(3, 4)
    (got,), _ = infer(program, params, {}, x)
    p = params["shared"]["fc"]
    close(got, relu(dense(relu(dense(x, p)), p)))


def test_nested_blocks_read_their_weights_by_path():
    x = mg.Input(("batch", 4), name="x")
    middle = mg.Graph(x, ops.Linear(3, name="proj")(block().as_block("inner")(x)), name="middle")
    y = mg.Input(("batch", 4), name="y")
    program = flatten(mg.Graph(y, middle.as_block("mid")(y)))
    params = {"mid": {"inner": {"fc": {"kernel": normal(4, 4), "bias": normal(4)}},
                      "proj": {"kernel": normal(4, 3), "bias": normal(3)}}}
    xs = normal(2, 4)
    (got,), _ = infer(program, params, {}, xs)
    close(got, dense(relu(dense(xs, params["mid"]["inner"]["fc"])), params["mid"]["proj"]))


def test_batchnorm_in_training_returns_its_new_state_at_its_path():
    x = mg.Input(("batch", 3), name="x")
    inner = mg.Graph(x, ops.BatchNorm(name="bn")(x), name="inner")
    y = mg.Input(("batch", 3), name="y")
    program = flatten(mg.Graph(y, inner.as_block("blk")(y)))
    params = {"blk": {"bn": {"scale": normal(3), "bias": normal(3)}}}
    state = {"blk": {"bn": {"mean": normal(3), "var": np.abs(normal(3)) + 0.5}}}
    xs = normal(6, 3) * 2 + 1
    (got,), new_state = run(program, params, state, (xs,), rng=None, inference_mode=False,
                            bindings=None)
    x64 = np.asarray(xs, np.float64)
    mean, var = x64.mean(0), x64.var(0)
    p = params["blk"]["bn"]
    close(got, (x64 - mean) / np.sqrt(var + 1e-5) * p["scale"] + p["bias"])
    close(new_state["blk"]["bn"]["mean"], 0.9 * state["blk"]["bn"]["mean"] + 0.1 * mean)
    close(new_state["blk"]["bn"]["var"], 0.9 * state["blk"]["bn"]["var"] + 0.1 * var)
    # In inference mode: the running statistics, and the state as it was.
    (got,), same = infer(program, params, state, xs)
    s = state["blk"]["bn"]
    close(got, (x64 - s["mean"]) / np.sqrt(np.float64(1) * s["var"] + 1e-5) * p["scale"] + p["bias"])
    close(same["blk"]["bn"]["mean"], s["mean"])


def test_gradients_with_and_without_remat_match_numpy():
    """d/dW of sum(relu(x @ W + b)): x.T @ (x @ W + b > 0), by hand; the same when the
    layer is rematerialized (run under jax.checkpoint)."""
    x = mg.Input(("batch", 5), name="x")
    graph = mg.Graph(x, ops.relu(ops.Linear(3, name="fc")(x)))
    params = {"fc": {"kernel": normal(5, 3), "bias": normal(3)}}
    xs = normal(4, 5)
    active = (dense(xs, params["fc"]) > 0).astype(np.float64)
    want = {"kernel": np.asarray(xs, np.float64).T @ active, "bias": active.sum(0)}
    for remat in (None, {"fc": "full", "relu": "full"}, {"fc": "dots"}):
        program = flatten(graph, remat=remat)

        def loss(p, program=program):
            (y,), _ = run(program, p, {}, (xs,), rng=None, inference_mode=False, bindings=None)
            return y.sum()

        grads = jax.grad(loss)(params)
        close(grads["fc"]["kernel"], want["kernel"])
        close(grads["fc"]["bias"], want["bias"])


# --- the hook --------------------------------------------------------------------------


def test_the_hook_sees_the_inputs_and_every_step_in_order():
    program = flatten(shared_twice())
    params = {"shared": {"fc": {"kernel": normal(4, 4), "bias": normal(4)}}}
    seen = []

    def hook(path, values):
        seen.append((path, [tuple(v.shape) for v in values]))
        return values

    x = normal(3, 4)
    infer(program, params, {}, x, hook=hook)
    assert seen == [("x", [(3, 4)]), ("shared/fc", [(3, 4)]), ("shared/relu", [(3, 4)]),
                    ("shared@1/fc", [(3, 4)]), ("shared@1/relu", [(3, 4)])]
    assert [path for path, _ in seen[1:]] == [s.path for s in program.steps]


def test_what_the_hook_returns_is_what_the_later_steps_read():
    program, params, x = flatten(mlp_graph()), mlp_params(), normal(4, 5)

    def hook(path, values):
        if path == "x":
            return (values[0] * 2,)
        if path == "fc":
            return (values[0] - 1,)
        return values

    (got,), _ = infer(program, params, {}, x, hook=hook)
    close(got, dense(relu(dense(2 * np.asarray(x, np.float64), params["fc"]) - 1), params["out"]))


# --- keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_step_key_folds_in_the_crc32_salt_of_each_name(make_key):
    key = make_key(42)
    for names in [(), ("fc",), ("block0", "attention"), ("a", "b", "c/d")]:
        got, want = step_key(key, names), folded(key, *names)
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(names))
    # The salts themselves, by hand: 31 bits of crc32.
    assert salt("fc") == zlib.crc32(b"fc") % 2**31


def noise(x, rng):
    """``x`` plus uniform noise from ``rng`` (``x`` itself without a key)."""
    return x if rng is None else x + jax.random.uniform(rng, x.shape, x.dtype)


def noisy_block() -> mg.Graph:
    x = mg.Input(("batch", 3), name="x")
    return mg.Graph(x, ops.F(noise, needs_rng=True, name="noise")(x), name="noisy")


def test_each_random_step_gets_the_key_of_its_path():
    layer = noisy_block().as_block("blk")
    x = mg.Input(("batch", 3), name="x")
    top = ops.F(noise, needs_rng=True, name="top")
    program = flatten(mg.Graph(x, top(layer(layer(x)))))
    assert program.random_paths() == ["blk/noise", "blk@1/noise", "top"]
    key, xs = jax.random.key(3), normal(2, 3)
    (got,), _ = run(program, {}, {}, (xs,), rng=key, inference_mode=False, bindings=None)
    # One draw per step, each from the apply key folded with its path's names: each
    # call of the block its own.
    draws = [jax.random.uniform(folded(key, *names), (2, 3), jnp.float32)
             for names in (("blk@1", "noise"), ("blk", "noise"), ("top",))]
    want = np.asarray(xs, np.float64) + sum(np.asarray(d, np.float64) for d in draws)
    close(got, want)
    # In inference mode no key is needed, and none is given to the layers.
    (same,), _ = infer(program, {}, {}, xs)
    np.testing.assert_array_equal(same, xs)


def test_a_steps_key_does_not_depend_on_other_layers():
    def graph(others: tuple[str, ...]) -> mg.Graph:
        """Random layers named ``others`` before the one named ``noise``."""
        x = mg.Input(("batch", 3), name="x")
        outs = [ops.F(noise, needs_rng=True, name=name)(x) for name in others]
        return mg.Graph(x, [ops.F(noise, needs_rng=True, name="noise")(x), *outs])

    key, xs = jax.random.key(0), normal(2, 3)
    outs = [run(flatten(graph(others)), {}, {}, (xs,), rng=key, inference_mode=False,
                bindings=None)[0][0] for others in [(), ("one",), ("another", "and_more")]]
    for out in outs:
        np.testing.assert_array_equal(out, outs[0])


def test_each_block_of_a_scan_gets_the_key_it_would_have_had_unscanned():
    x = mg.Input(("batch", 3), name="x")
    g = noisy_block()
    h = x
    for name in ("b0", "b1", "b2"):
        h = g.as_block(name)(h)
    graph = mg.Graph(x, h)
    scanned = mg.compile(graph, scan_blocks="always").graph
    assert [n.name for n in scanned.nodes] == ["x", "b0..b2"]
    key, xs = jax.random.key(9), normal(2, 3)
    draws = [jax.random.uniform(folded(key, name, "noise"), (2, 3), jnp.float32)
             for name in ("b0", "b1", "b2")]
    want = np.asarray(xs, np.float64) + sum(np.asarray(d, np.float64) for d in draws)
    for g in (graph, scanned):
        (got,), _ = run(flatten(g), {}, {}, (xs,), rng=key, inference_mode=False, bindings=None)
        close(got, want)


# --- weight errors ---------------------------------------------------------------------


def nested_linear():
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Graph(x, ops.Linear(2, name="fc")(x), name="inner")
    y = mg.Input(("batch", 4), name="y")
    return flatten(mg.Graph(y, inner.as_block("blk")(y)))


def good_params():
    return {"blk": {"fc": {"kernel": normal(4, 2), "bias": normal(2)}}}


def error_of(program, params, state=None):
    with pytest.raises(mg.MlaxGraphError) as info:
        run(program, params, state or {}, (normal(3, 4),), rng=None, inference_mode=True,
            bindings=None)
    return info.value


def test_a_missing_layer_entry_names_the_layer():
    error = error_of(nested_linear(), {"blk": {}})
    assert isinstance(error, mg.GraphError)
    assert "blk/fc" in str(error) and "params" in str(error)


def test_a_missing_weight_names_the_weight():
    params = good_params()
    del params["blk"]["fc"]["bias"]
    error = error_of(nested_linear(), params)
    assert isinstance(error, mg.GraphError)
    assert "blk/fc/bias" in str(error)


def test_a_mis_shaped_weight_names_the_weight_and_both_shapes():
    params = good_params()
    params["blk"]["fc"]["kernel"] = normal(2, 4)
    error = error_of(nested_linear(), params)
    assert isinstance(error, mg.ShapeError)
    assert "blk/fc/kernel" in str(error)
    assert "(2, 4)" in str(error) and "(4, 2)" in str(error)


def test_a_weight_that_is_not_an_array_is_a_shape_error():
    params = good_params()
    params["blk"]["fc"]["kernel"] = [[0.0] * 2] * 4
    error = error_of(nested_linear(), params)
    assert isinstance(error, mg.ShapeError)
    assert "blk/fc/kernel" in str(error)


def test_an_integer_weight_names_the_weight_and_its_dtype():
    params = good_params()
    params["blk"]["fc"]["kernel"] = np.ones((4, 2), np.int32)
    error = error_of(nested_linear(), params)
    assert isinstance(error, mg.DTypeError)
    assert "blk/fc/kernel" in str(error) and "int32" in str(error)


def test_missing_state_names_the_layer():
    x = mg.Input(("batch", 4), name="x")
    program = flatten(mg.Graph(x, ops.BatchNorm(name="bn")(x)))
    params = {"bn": {"scale": normal(4), "bias": normal(4)}}
    error = error_of(program, params, {"other": {}})
    assert isinstance(error, mg.GraphError)
    assert "bn" in str(error) and "state" in str(error)
