"""What ``to_onnx`` and ``from_onnx`` refuse, and how: weights that are not the
graph's, opsets the writer does not write, files ``onnx.checker`` rejects, inputs of
unknown rank, ``dims`` naming no dim, declared outputs the nodes contradict. Each
refusal is the specific ``mg`` error naming what is wrong; what is accepted runs in
onnxruntime as mlaxgraph computes it."""

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import mlaxgraph as mg  # noqa: E402


def _mlp():
    x = mg.Input(("batch", 8), name="x")
    graph = mg.Graph(x, mg.ops.Linear(4, name="head")(mg.ops.relu(
        mg.ops.Linear(16, name="body")(x))))
    params, state = mg.compile(graph).init(jax.random.key(0))
    return graph, params, state


def test_to_onnx_checks_the_weights_as_apply_does():
    graph, params, state = _mlp()
    with pytest.raises(mg.GraphError, match="layer 'body'.*params has no entry 'body'"):
        graph.to_onnx(None, {}, state)
    wrong = {**params, "body": {"kernel": np.zeros((3, 3), np.float32),
                                "bias": np.zeros(3, np.float32)}}
    with pytest.raises(mg.ShapeError, match=r"(?s)layer .body.*weight body/kernel.*expected: \(8, 16\)"):
        graph.to_onnx(None, wrong, state)
    with pytest.raises(mg.GraphError, match="no weight head/bias"):
        graph.to_onnx(None, {**params, "head": {"kernel": params["head"]["kernel"]}}, state)
    with pytest.raises(mg.GraphError, match=r"to_onnx writes graph .*'s weights into the file: "
                                            r"pass them, graph\.to_onnx\(path, params, state\)"):
        graph.to_onnx(None)
    with pytest.raises(mg.GraphError, match="params has no entry 'body'.*state has it: params and "
                                            "state are swapped"):
        graph.to_onnx(None, state, params)


def test_to_onnx_writes_float64_weights_in_the_graphs_dtype():
    # apply casts weights to the dtype the layer computes in; the file does the same
    graph, params, state = _mlp()
    wide = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    proto = graph.to_onnx(None, wide, state)
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    (got,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    p = {k: {n: np.asarray(v, np.float32) for n, v in layer.items()} for k, layer in wide.items()}
    want = np.maximum(x @ p["body"]["kernel"] + p["body"]["bias"], 0) @ p["head"]["kernel"] \
        + p["head"]["bias"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset, match", [(5, "operator sets 18 to"), (99, "operator sets 18 to"),
                                          ("21", "is an int from 18 to"), (True, "got a bool")])
def test_to_onnx_refuses_opsets_it_does_not_write(opset, match):
    graph, params, state = _mlp()
    with pytest.raises(mg.ConfigError, match=match):
        graph.to_onnx(None, params, state, opset=opset)


def test_to_onnx_opset_range_ends_where_onnx_does():
    graph, params, state = _mlp()
    newest = onnx.defs.onnx_opset_version()
    for opset in (18, newest):  # both ends run in onnxruntime as mlaxgraph computes
        proto = graph.to_onnx(None, params, state, opset=opset)
        onnx.checker.check_model(proto, full_check=True)
        x = np.ones((2, 8), np.float32)
        (got,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
        want, _ = mg.compile(graph).apply(params, state, x)
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
    with pytest.raises(mg.ConfigError, match=f"18 to {newest}"):
        graph.to_onnx(None, params, state, opset=newest + 1)


def _model(nodes, inits=(), xshape=("N", 3), yshape=("N", 3), ytype=TensorProto.FLOAT,
           opset=17, xtype=TensorProto.FLOAT):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", xtype, xshape)],
                          [helper.make_tensor_value_info("y", ytype, yshape)], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _refused_by_checker(model):
    with pytest.raises(Exception) as caught:
        onnx.checker.check_model(model, full_check=True)
    assert not isinstance(caught.value, mg.MlaxGraphError)


def test_from_onnx_refuses_two_writers_of_a_value():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                    helper.make_node("Neg", ["x"], ["y"], name="b")])
    _refused_by_checker(model)
    with pytest.raises(mg.GraphError, match="node 'b' \\(Neg\\) writes 'y', but node 'a' "
                                            "\\(Relu\\) writes it too"):
        mg.from_onnx(model)
    overwrite = _model([helper.make_node("Relu", ["x"], ["x"], name="c")])
    with pytest.raises(mg.GraphError, match="node 'c' .* graph input or an initializer"):
        mg.from_onnx(overwrite)


def test_from_onnx_refuses_an_attribute_the_operator_lacks():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="act", alpha=0.3)])
    _refused_by_checker(model)
    with pytest.raises(mg.GraphError, match="node 'act' \\(Relu\\) has the attribute 'alpha'"
                                            ".*attributes: none"):
        mg.from_onnx(model)
    # LeakyRelu has it: read, and equal to onnxruntime
    leaky = _model([helper.make_node("LeakyRelu", ["x"], ["y"], name="act", alpha=0.3)])
    graph, params, state = mg.from_onnx(leaky)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3)
    got, _ = mg.compile(graph).apply(params, state, x)
    (want,) = ort.InferenceSession(leaky.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_from_onnx_refuses_a_kernel_shape_its_weight_contradicts():
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "W")
    model = _model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv", kernel_shape=[5, 5])],
                   [weight], ("N", 3, 8, 8), ("N", 4, 6, 6))
    _refused_by_checker(model)
    with pytest.raises(mg.ShapeError, match="node 'conv' \\(Conv\\): kernel_shape \\[5, 5\\] "
                                            "disagrees with its weight 'W'"):
        mg.from_onnx(model)
    agreeing = _model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv", kernel_shape=[3, 3])],
                      [weight], ("N", 3, 8, 8), ("N", 4, 6, 6))
    assert mg.from_onnx(agreeing)[0].output_specs[0].shape[1:] == (4, 6, 6)


def test_from_onnx_asks_for_the_shape_of_an_input_of_unknown_rank():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], xshape=None, yshape=None)
    with pytest.raises(mg.ShapeError, match="graph input 'x' has no shape.*shapes=\\{'x'"):
        mg.from_onnx(model)
    graph, params, state = mg.from_onnx(model, shapes={"x": ("batch", 3)})
    assert str(graph.input_specs[0]) == "f32[batch,3]"
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    got, _ = mg.compile(graph).apply(params, state, x)
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(np.asarray(got), want)
    # shapes= must name an input and agree with a declared shape
    declared = _model([helper.make_node("Relu", ["x"], ["y"])])
    assert str(mg.from_onnx(declared, shapes={"x": (2, 3)})[0].input_specs[0]) == "f32[2,3]"
    with pytest.raises(mg.GraphError, match="names 'X', which is no graph input.*near: x"):
        mg.from_onnx(declared, shapes={"X": (2, 3)})
    with pytest.raises(mg.ShapeError, match="the shape \\(2, 4\\); the file declares \\('N', 3\\)"):
        mg.from_onnx(declared, shapes={"x": (2, 4)})
    with pytest.raises(mg.ShapeError, match="each an int >= 0 or a name"):
        mg.from_onnx(declared, shapes={"x": (2, -3)})


def _matmul(ytype=TensorProto.FLOAT, yshape=("N", 3)):
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    return _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [weight], ("N", 4), yshape,
                  ytype)


def test_from_onnx_dims_naming_no_dim_is_an_error_naming_the_near_one():
    with pytest.raises(mg.GraphError, match="dims=.*names 'n', which is no symbolic dim.*near: N"):
        mg.from_onnx(_matmul(), dims={"n": 4})
    assert str(mg.from_onnx(_matmul(), dims={"N": 4})[0].input_specs[0]) == "f32[4,4]"


def test_from_onnx_declared_outputs_are_checked_as_onnxruntime_does():
    # another dtype: onnxruntime refuses the file, and so does from_onnx
    wrong_type = _matmul(TensorProto.INT64)
    with pytest.raises(Exception, match="does not match expected type"):
        ort.InferenceSession(wrong_type.SerializeToString())
    with pytest.raises(mg.DTypeError, match="graph output 'y' is declared int64, but its nodes "
                                            "compute float32"):
        mg.from_onnx(wrong_type)
    # another shape: onnxruntime warns and runs what the nodes compute; so does from_onnx
    wrong_shape = _matmul(yshape=("N", 7))
    (want,) = ort.InferenceSession(wrong_shape.SerializeToString()).run(
        None, {"x": np.ones((2, 4), np.float32)})
    with pytest.warns(UserWarning, match="graph output 'y' is declared \\[\\?, 7\\], but its "
                                         "nodes compute"):
        graph, params, state = mg.from_onnx(wrong_shape)
    got, _ = mg.compile(graph).apply(params, state, np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_zoo_transformer_reads_back_with_its_symbolic_dims():
    # to_onnx writes 0 .. seq - 1 as Range(0, Gather(Shape(ids), 1), 1): read back as
    # ops.arange(seq), the graph keeps batch and seq symbolic and runs at any size
    graph = mg.models.gpt2({"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32,
                            "n_positions": 16})
    params, state = mg.compile(graph).init(jax.random.key(0))
    proto = graph.to_onnx(None, params, state)
    back, params2, state2 = mg.from_onnx(proto)
    assert [str(s) for s in back.input_specs] == ["i32[batch,seq]"]
    assert "arange" in {n.op.op_name for n in back.nodes}
    # the tables are Embeddings again, the tied head (one initializer in the file,
    # read through a Transpose) its attend: the weights keep their paths
    assert sorted(params2) == sorted(params)
    assert {k: np.shape(v) for k, v in params2["wte"].items()} == {"embedding": (32, 16)}
    np.testing.assert_array_equal(np.asarray(params2["wte"]["embedding"]),
                                  np.asarray(params["wte"]["embedding"]))
    ops = {n.name: n.op.op_name for n in back.nodes}
    assert ops["wte"] == ops["wpe"] == ops["wte@1"] == "embedding"
    assert sum(t.dims == [32, 16] for t in proto.graph.initializer) == 1
    session = ort.InferenceSession(proto.SerializeToString())
    model = mg.compile(back)
    for shape in [(2, 8), (1, 5)]:
        ids = np.random.default_rng(0).integers(0, 32, shape).astype(np.int32)
        (want,) = session.run(None, {proto.graph.input[0].name: ids})
        got, _ = model.apply(params2, state2, ids, inference_mode=True)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5)


def test_a_range_over_shape_arithmetic_keeps_its_symbolic_length():
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["s1"]),
             helper.make_node("Squeeze", ["s1", "ax"], ["n"]),
             helper.make_node("Add", ["n", "one"], ["n1"]),
             helper.make_node("Range", ["two", "n1", "one"], ["y"])]
    model = _model(nodes, [c("st", [1]), c("en", [2]), c("ax", [0]), c("one", 1), c("two", 2)],
                   ("b", "L"), [None], TensorProto.INT64)
    graph, params, state = mg.from_onnx(model)
    assert str(graph.output_specs[0]) == "i32[L-1]"
    for length in (6, 3):
        x = np.ones((2, length), np.float32)
        got, _ = mg.compile(graph).apply(params, state, x)
        (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(np.asarray(got), want)


def test_a_gather_from_a_table_is_an_embedding():
    table = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="/tok/Gather", axis=0)], "m",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 4])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph, params, state = mg.from_onnx(model)
    # a negative id counts from the end, as ONNX's Gather: less, add, where before it
    assert [n.op.op_name for n in graph.nodes] == ["input", "less", "add", "where", "embedding"]
    assert list(params) == ["tok"] and list(params["tok"]) == ["embedding"]
    ids = np.asarray([[0, 3, 9], [2, -1, -10]])
    got, _ = mg.compile(graph).apply(params, state, ids.astype(np.int32))
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(want, table[ids])
    # out of range stays a NaN row (onnxruntime refuses the index)
    got, _ = mg.compile(graph).apply(params, state, np.asarray([[10, -11, 1]], np.int32))
    assert np.isnan(np.asarray(got)[0, :2]).all() and not np.isnan(np.asarray(got)[0, 2]).any()
    assert mg.from_onnx(model, layers=False)[0].nodes[-1].op.op_name == "onnx.Gather"
