"""Building graphs: symbolic shapes, names, weight sharing, nested blocks, immutability."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.core.specs import as_dim


def build_cnn():
    x = mg.Input(("batch", 28, 28, 1), "float32", name="image")
    h = ops.Conv(16, (3, 3), padding="SAME", name="conv1")(x)
    h = ops.relu(ops.BatchNorm(name="bn1")(h))
    h = ops.MaxPool((2, 2))(h)
    h = ops.Flatten()(h)
    y = ops.Linear(10, name="logits")(h)
    return mg.Graph(inputs=x, outputs=y, name="cnn")


def test_input_keeps_symbolic_dim_and_dtype():
    x = mg.Input(("batch", 28, 28, 1), "float32", name="image")
    assert str(x.shape) == "(batch, 28, 28, 1)"
    assert x.dtype == np.dtype("float32")


def test_shapes_flow_through_symbolic_arithmetic():
    x = mg.Input(("batch", 7, 7, 32))
    assert ops.Flatten()(x).shape == (as_dim("batch"), 1568)
    y = mg.Input(("2*batch", 4))
    assert ops.Linear(3)(y).shape == (2 * as_dim("batch"), 3)
    assert ops.concat([y, y], axis=0).shape == (4 * as_dim("batch"), 4)


def test_api_example_shapes():
    g = build_cnn()
    assert [str(g.node(n).outputs[0]) for n in ("conv1", "flatten", "logits")] == [
        "f32[batch,28,28,16]", "f32[batch,3136]", "f32[batch,10]"]


def test_same_code_same_graph():
    a, b = build_cnn(), build_cnn()
    assert a == b and hash(a) == hash(b)
    assert str(a) == str(b)
    assert a.summary() == b.summary()


def test_automatic_names_are_per_graph_and_in_call_order():
    def build():
        x = mg.Input(("batch", 4))
        h = ops.Linear(4)(x)
        h = ops.Linear(4)(h)
        return mg.Graph(x, ops.Linear(2, name="linear_1")(h))

    g = build()
    assert [n.name for n in g.nodes] == ["input", "linear", "linear_2", "linear_1"]
    # Names do not depend on how many graphs the process built before.
    assert [n.name for n in build().nodes] == [n.name for n in g.nodes]


def test_two_layers_with_one_name_raise_graph_error():
    x = mg.Input(("batch", 4))
    h = ops.Linear(4, name="dense")(x)
    y = ops.Linear(4, name="dense")(h)
    with pytest.raises(mg.GraphError, match="two different layers are named 'dense'"):
        mg.Graph(x, y)


def test_layer_called_twice_shares_weights():
    x = mg.Input(("batch", 4), name="x")
    shared = ops.Linear(4, name="shared")
    y = ops.add(shared(x), shared(ops.relu(x)))
    g = mg.Graph(x, y)
    assert [n.name for n in g.nodes if n.layer == "shared"] == ["shared", "shared@1"]
    model = mg.compile(g)
    params, _ = model.init(jax.random.key(0))
    assert list(params) == ["shared"]
    xs = jnp.arange(12.0).reshape(3, 4)
    out, _ = model.apply(params, {}, xs)
    k, b = np.asarray(params["shared"]["kernel"]), np.asarray(params["shared"]["bias"])
    expected = (np.asarray(xs) @ k + b) + (np.maximum(np.asarray(xs), 0) @ k + b)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_shared_layer_called_on_other_width_raises():
    shared = ops.Linear(4, name="shared")
    shared(mg.Input(("batch", 4)))
    with pytest.raises(mg.ShapeError, match="called again"):
        shared(mg.Input(("batch", 5)))


def test_nested_block_has_its_own_name_scope_and_nested_params():
    inner_x = mg.Input(("batch", 4), name="x")
    block = mg.Graph(inner_x, ops.relu(ops.Linear(4, name="fc")(inner_x)), name="block")
    x = mg.Input(("batch", 4), name="x")
    y = ops.Linear(2, name="fc")(block(block(x)))
    g = mg.Graph(x, y, name="outer")
    assert [n.name for n in g.nodes] == ["x", "block", "block@1", "fc"]
    params, _ = mg.compile(g).init(jax.random.key(0))
    assert set(params) == {"block", "fc"}
    assert set(params["block"]) == {"fc"}
    assert params["block"]["fc"]["kernel"].shape == (4, 4)
    assert [path for path, _ in g.walk()] == ["x", "block", "block/x", "block/fc", "block/relu",
                                               "block@1", "fc"]


def test_block_binds_its_symbolic_dims_to_the_callers():
    inner = mg.Input(("batch", "height", 8), name="x")
    block = mg.Graph(inner, ops.Flatten()(inner), name="flat")
    x = mg.Input(("batch", 3, 8))
    assert str(block(x).shape) == "(batch, 24)"
    with pytest.raises(mg.ShapeError, match="other input shapes"):
        block(mg.Input(("batch", 3, 9)))


def test_graph_is_immutable_and_hashable():
    g = build_cnn()
    with pytest.raises(AttributeError):
        g.name = "other"
    with pytest.raises(Exception):
        g.nodes[0].name = "other"
    assert {g: 1}[build_cnn()] == 1


def test_graph_with_several_inputs_and_outputs():
    a = mg.Input(("batch", 3), name="a")
    b = mg.Input(("batch", 3), name="b")
    s, p = ops.add(a, b), ops.mul(a, b)
    g = mg.Graph([a, b], [s, p])
    model = mg.compile(g)
    xa, xb = jnp.ones((2, 3)), jnp.full((2, 3), 2.0)
    (out_s, out_p), _ = model.apply({}, {}, xa, xb)
    np.testing.assert_allclose(out_s, 3.0)
    np.testing.assert_allclose(out_p, 2.0)


def test_disconnected_input_is_a_graph_error():
    a = mg.Input(("batch", 3), name="a")
    b = mg.Input(("batch", 3), name="b")
    with pytest.raises(mg.GraphError, match="not in the graph's inputs"):
        mg.Graph(a, ops.add(a, b))


def test_unused_inputs_are_kept_in_order():
    a = mg.Input(("batch", 3), name="a")
    b = mg.Input(("batch", 3), name="b")
    g = mg.Graph([a, b], ops.relu(b))
    assert g.inputs == ("a", "b")
    out, _ = mg.compile(g).apply({}, {}, jnp.ones((2, 3)), -jnp.ones((2, 3)))
    np.testing.assert_allclose(out, 0.0)


def test_layers_are_called_on_symbolic_tensors_only():
    with pytest.raises(mg.GraphError, match="symbolic tensors"):
        ops.Linear(3)(jnp.ones((2, 3)))


def test_unknown_keyword_arguments_are_not_swallowed():
    with pytest.raises(TypeError, match="unexpected keyword"):
        ops.Linear(3)(mg.Input(("batch", 3)), training=True)


def test_source_location_points_at_the_users_line():
    x = mg.Input(("batch", 3))
    y = ops.Linear(3, name="here")(x)  # the line recorded
    node = mg.Graph(x, y).node("here")
    assert node.source.file == __file__
    assert "name=\"here\"" in node.source.code()


def test_f_wraps_any_jax_function_with_inferred_shapes():
    x = mg.Input(("batch", 6))
    y = ops.F(lambda t: jnp.reshape(t, (t.shape[0], 2, 3)).sum(-1))(x)
    assert str(y.shape) == "(batch, 2)"
    g = mg.Graph(x, y)
    out, _ = mg.compile(g).apply({}, {}, jnp.arange(12.0).reshape(2, 6))
    np.testing.assert_allclose(out, np.arange(12.0).reshape(2, 2, 3).sum(-1))


def test_as_block_gives_unshared_named_blocks():
    inner_x = mg.Input(("batch", 4), name="x")
    block = mg.Graph(inner_x, ops.Linear(4, name="fc")(inner_x), name="block")
    x = mg.Input(("batch", 4), name="x")
    y = block.as_block(name="second")(block.as_block()(x))
    g = mg.Graph(x, y)
    assert [n.name for n in g.nodes] == ["x", "block", "second"]
    params, _ = mg.compile(g).init(jax.random.key(0))
    assert set(params) == {"block", "second"}
    assert not np.allclose(params["block"]["fc"]["kernel"], params["second"]["fc"]["kernel"])


def test_reshape_infers_minus_one_over_symbolic_sizes():
    x = mg.Input(("batch", "seq", 4))
    assert str(ops.Reshape((4, -1))(x).shape) == "(batch, 4, seq)"
    assert str(ops.Reshape((-1,))(x).shape) == "(batch, 4*seq)"
    with pytest.raises(mg.ShapeError, match="do not divide by 3"):
        ops.Reshape((3, -1))(x)


def test_none_for_a_dim_says_to_name_it():
    """Keras writes an unknown batch as None; here a symbolic dim is a name."""
    with pytest.raises(mg.ShapeError, match=r'got None: name a symbolic dim, e\.g\. mg\.Input\(\("batch", 16\)\)'):
        mg.Input((None, 16), "float32")
    assert mg.Input(("batch", 16), "float32").spec.shape[1] == 16
