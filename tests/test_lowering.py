"""Lowering: ``make_init`` draws each weight from its own key (the init key folded with
the names of its layer's path and its own, checked against a hand-written
``jax.random.fold_in`` chain), so adding a layer does not change the others' values, a
scan's blocks get the values they would have had unscanned and ``param_dtype`` is
honoured; ``check_inputs`` refuses arrays of another count, shape or dtype, with the
hint for an input whose first dim was fixed; ``make_apply`` returns one array or a
tuple, and refuses a missing state or a missing key for random layers."""

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
from mlaxgraph.compiler.lowering import check_inputs, make_apply, make_init


def normal_init(key, shape, dtype):
    """Standard normals: values the test can draw again from the key it expects."""
    return jax.random.normal(key, shape, dtype)


def folded(key, *names):
    """``key`` folded with the 31-bit crc32 of each name, by hand."""
    for name in names:
        key = jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)
    return key


def expected(key, shape, *names):
    return np.asarray(jax.random.normal(folded(key, *names), shape, jnp.float32))


def init_of(graph, key=None, param_dtype="float32", **options):
    return make_init(flatten(graph, **options), param_dtype)(key if key is not None else jax.random.key(0))


def linear(features, name):
    return ops.Linear(features, kernel_init=normal_init, bias_init=normal_init, name=name)


# --- make_init -------------------------------------------------------------------------


def test_each_weight_is_drawn_from_the_key_of_its_path():
    x = mg.Input(("batch", 3), name="x")
    inner = mg.Graph(x, linear(4, "fc")(x), name="inner")
    y = mg.Input(("batch", 3), name="y")
    graph = mg.Graph(y, linear(2, "head")(inner.as_block("blk")(y)))
    key = jax.random.key(5)
    params, state = init_of(graph, key)
    assert state == {}
    np.testing.assert_array_equal(params["blk"]["fc"]["kernel"], expected(key, (3, 4), "blk", "fc", "kernel"))
    np.testing.assert_array_equal(params["blk"]["fc"]["bias"], expected(key, (4,), "blk", "fc", "bias"))
    np.testing.assert_array_equal(params["head"]["kernel"], expected(key, (4, 2), "head", "kernel"))
    np.testing.assert_array_equal(params["head"]["bias"], expected(key, (2,), "head", "bias"))


def test_weights_of_one_shape_are_drawn_each_from_its_own_key():
    """Weights of one shape and initializer are drawn together: the same values as one
    draw each."""
    x = mg.Input(("batch", 4), name="x")
    names = ["a", "b", "c"]
    graph = mg.Graph(x, [linear(4, name)(x) for name in names])
    key = jax.random.key(1)
    params, _ = init_of(graph, key)
    for name in names:
        close(params[name]["kernel"], expected(key, (4, 4), name, "kernel"), rtol=1e-6, atol=1e-6)
    assert not np.allclose(params["a"]["kernel"], params["b"]["kernel"])


def test_adding_a_layer_does_not_change_the_others_initial_values():
    def graph(extra: bool) -> mg.Graph:
        x = mg.Input(("batch", 6), name="x")
        h = ops.Linear(6, name="first")(x)
        if extra:
            h = ops.BatchNorm(name="added_bn")(ops.Linear(6, name="added")(h))
        h = ops.Linear(6, name="second")(h)  # same shape as "added"'s kernel
        return mg.Graph(x, ops.Linear(3, name="last")(ops.relu(h)))

    key = jax.random.key(7)
    small, _ = init_of(graph(False), key)
    large, large_state = init_of(graph(True), key)
    assert set(large) == {"first", "added", "added_bn", "second", "last"}
    for name in small:
        for weight in small[name]:
            np.testing.assert_array_equal(large[name][weight], small[name][weight],
                                          err_msg=f"{name}/{weight}")
    np.testing.assert_array_equal(large_state["added_bn"]["mean"], np.zeros(6, np.float32))
    np.testing.assert_array_equal(large_state["added_bn"]["var"], np.ones(6, np.float32))


def test_a_layer_keeps_its_values_when_its_block_moves():
    """Keys come from names, not positions: a block's weights are the same wherever it
    is called in the graph."""
    x = mg.Input(("batch", 3), name="x")
    inner = mg.Graph(x, ops.Linear(3, name="fc")(x), name="inner")

    def graph(before: bool) -> mg.Graph:
        y = mg.Input(("batch", 3), name="y")
        h = ops.Linear(3, name="other")(y) if before else y
        h = inner.as_block("blk")(h)
        return mg.Graph(y, h if before else ops.Linear(3, name="other")(h))

    key = jax.random.key(2)
    a, _ = init_of(graph(True), key)
    b, _ = init_of(graph(False), key)
    np.testing.assert_array_equal(a["blk"]["fc"]["kernel"], b["blk"]["fc"]["kernel"])
    np.testing.assert_array_equal(a["other"]["kernel"], b["other"]["kernel"])


def test_a_shared_block_has_one_set_of_weights():
    x = mg.Input(("batch", 3), name="x")
    layer = mg.Graph(x, linear(3, "fc")(x), name="inner").as_block("shared")
    y = mg.Input(("batch", 3), name="y")
    key = jax.random.key(4)
    params, _ = init_of(mg.Graph(y, layer(layer(y))), key)
    assert list(params) == ["shared"] and list(params["shared"]) == ["fc"]
    np.testing.assert_array_equal(params["shared"]["fc"]["kernel"],
                                  expected(key, (3, 3), "shared", "fc", "kernel"))


def test_a_scans_blocks_get_the_values_they_would_have_had_unscanned():
    x = mg.Input(("batch", 3), name="x")
    block = mg.Graph(x, ops.relu(linear(3, "fc")(x)), name="block")
    h = y = mg.Input(("batch", 3), name="y")
    for name in ("b0", "b1", "b2"):
        h = block.as_block(name)(h)
    graph = mg.Graph(y, h)
    scanned = mg.compile(graph, scan_blocks="always").graph
    key = jax.random.key(8)
    params, _ = init_of(scanned, key)
    stacked = params["b0..b2"]["fc"]
    assert stacked["kernel"].shape == (3, 3, 3) and stacked["bias"].shape == (3, 3)
    for i, name in enumerate(("b0", "b1", "b2")):
        close(stacked["kernel"][i], expected(key, (3, 3), name, "fc", "kernel"), rtol=1e-6, atol=1e-6)
        close(stacked["bias"][i], expected(key, (3,), name, "fc", "bias"), rtol=1e-6, atol=1e-6)


def test_default_initializers_and_param_dtype():
    x = mg.Input(("batch", 50), name="x")
    graph = mg.Graph(x, ops.BatchNorm(name="bn")(ops.Linear(40, name="fc")(x)))
    params, state = init_of(graph, jax.random.key(0))
    np.testing.assert_array_equal(params["fc"]["bias"], np.zeros(40, np.float32))
    # LeCun normal: standard deviation 1/sqrt(fan_in) (truncated normal, rescaled).
    assert abs(float(np.std(params["fc"]["kernel"])) - 50 ** -0.5) < 0.15 * 50 ** -0.5
    np.testing.assert_array_equal(params["bn"]["scale"], np.ones(40, np.float32))
    np.testing.assert_array_equal(state["bn"]["var"], np.ones(40, np.float32))
    low, low_state = init_of(graph, jax.random.key(0), param_dtype="bfloat16")
    assert {str(a.dtype) for a in jax.tree.leaves((low, low_state))} == {"bfloat16"}


def test_init_is_pure_and_jittable():
    x = mg.Input(("batch", 4), name="x")
    init = make_init(flatten(mg.Graph(x, linear(2, "fc")(x))), "float32")
    key = jax.random.key(3)
    eager, jitted = init(key), jax.jit(init)(key)
    close(jitted[0]["fc"]["kernel"], eager[0]["fc"]["kernel"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(init(key)[0]["fc"]["kernel"], eager[0]["fc"]["kernel"])
    other = init(jax.random.key(4))[0]["fc"]["kernel"]
    assert not np.allclose(other, eager[0]["fc"]["kernel"])


# --- check_inputs ----------------------------------------------------------------------


def two_inputs() -> mg.Graph:
    a = mg.Input(("batch", 3), name="a")
    b = mg.Input(("batch", "length", 4), "float32", name="b")
    return mg.Graph([a, b], [ops.relu(a), ops.relu(b)], name="two")


def check(graph, *arrays):
    return check_inputs(graph, graph.input_specs, arrays)


def test_check_inputs_returns_the_dims():
    graph = two_inputs()
    dims = check(graph, np.zeros((2, 3), np.float32), np.zeros((2, 7, 4), np.float32))
    assert dims == {"batch": 2, "length": 7}


def test_check_inputs_refuses_another_count():
    with pytest.raises(mg.ShapeError, match=r"takes 2 inputs .*got 1"):
        check(two_inputs(), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("b_shape", [(2, 7, 5), (2, 7), (3, 7, 4)],
                         ids=["last dim", "rank", "batch differs from a's"])
def test_check_inputs_refuses_another_shape_naming_the_input(b_shape):
    with pytest.raises(mg.ShapeError) as info:
        check(two_inputs(), np.zeros((2, 3), np.float32), np.zeros(b_shape, np.float32))
    message = str(info.value)
    assert "'b'" in message, message  # the input, and where it was created
    assert "test_lowering.py" in message, message
    assert str(list(b_shape)) in message  # what it got
    assert "[batch,length,4]" in message  # what it expected


def test_check_inputs_refuses_what_is_not_an_array():
    with pytest.raises(mg.ShapeError):
        check(two_inputs(), [[0.0] * 3] * 2, np.zeros((2, 7, 4), np.float32))


def test_check_inputs_refuses_another_dtype():
    with pytest.raises(mg.DTypeError) as info:
        check(two_inputs(), np.zeros((2, 3), np.int32), np.zeros((2, 7, 4), np.float32))
    assert "int32" in str(info.value) and "f32[batch,3]" in str(info.value)


def test_a_fixed_first_dim_gets_the_symbolic_form_to_write():
    x = mg.Input((28, 28, 1), name="image")  # Keras's habit: no batch dim
    graph = mg.Graph(x, ops.relu(x))
    with pytest.raises(mg.ShapeError) as info:
        check(graph, np.zeros((32, 28, 28, 1), np.float32))
    assert 'mg.Input(("batch", 28, 28, 1))' in str(info.value)
    # A batch dim fixed at another size.
    x = mg.Input((32, 10), name="x")
    graph = mg.Graph(x, ops.relu(x))
    with pytest.raises(mg.ShapeError) as info:
        check(graph, np.zeros((16, 10), np.float32))
    assert 'mg.Input(("batch", 10))' in str(info.value)
    # Any other mismatch gets no hint.
    with pytest.raises(mg.ShapeError) as info:
        check(graph, np.zeros((32, 11), np.float32))
    assert '"batch"' not in str(info.value)


# --- make_apply ------------------------------------------------------------------------


def test_apply_returns_one_array_for_one_output_and_a_tuple_for_several():
    x = mg.Input(("batch", 3), name="x")
    kernel = np.arange(6, dtype=np.float32).reshape(3, 2) - 2
    params = {"fc": {"kernel": kernel, "bias": np.ones(2, np.float32)}}
    xs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    h = ops.Linear(2, name="fc")(x)
    one = make_apply(flatten(mg.Graph(x, h)))
    out, state = one(params, {}, xs)
    close(out, xs.astype(np.float64) @ kernel + 1)
    assert state == {}
    several = make_apply(flatten(mg.Graph(x, [h, ops.relu(h)])))
    outs, _ = several(params, {}, xs)
    assert isinstance(outs, tuple) and len(outs) == 2
    close(outs[1], np.maximum(xs.astype(np.float64) @ kernel + 1, 0))


def test_apply_without_state_says_so():
    x = mg.Input(("batch", 3), name="x")
    apply = make_apply(flatten(mg.Graph(x, ops.Linear(2, name="fc")(x), name="net")))
    params = {"fc": {"kernel": np.ones((3, 2), np.float32), "bias": np.ones(2, np.float32)}}
    with pytest.raises(mg.GraphError, match="state is missing"):
        apply(params, np.ones((4, 3), np.float32))


def test_apply_of_random_layers_without_a_key_names_them():
    x = mg.Input(("batch", 3), name="x")
    inner = mg.Graph(x, ops.Dropout(0.5, name="drop")(x), name="inner")
    y = mg.Input(("batch", 3), name="y")
    apply = make_apply(flatten(mg.Graph(y, ops.Dropout(0.1, name="top")(inner.as_block("blk")(y)))))
    xs = np.ones((2, 3), np.float32)
    with pytest.raises(mg.GraphError) as info:
        apply({}, {}, xs)
    assert "blk/drop" in str(info.value) and "top" in str(info.value)
    assert "rng=" in str(info.value)
    # In inference mode no key is needed (Dropout is the identity), and with one it runs.
    out, _ = apply({}, {}, xs, inference_mode=True)
    np.testing.assert_array_equal(out, xs)
    out, _ = apply({}, {}, xs, rng=jax.random.key(0))
    assert out.shape == (2, 3)


def test_apply_checks_its_inputs():
    x = mg.Input(("batch", 3), name="x")
    apply = make_apply(flatten(mg.Graph(x, ops.relu(x))))
    with pytest.raises(mg.ShapeError):
        apply({}, {}, np.ones((2, 4), np.float32))
    with pytest.raises(mg.DTypeError):
        apply({}, {}, np.ones((2, 3), np.float64))
