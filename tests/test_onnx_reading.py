"""``mg.from_onnx`` on valid files of the less common forms, against onnxruntime (or
onnx's reference implementation where onnxruntime fuses operators into another
computation): 4-bit and float8 initializers, slices and resizes over symbolic dims,
a LoRA-adapted convolution read back."""

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import mlaxgraph as mg  # noqa: E402
from mlaxgraph import ops  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _model(nodes, inputs, inits=(), opset=21, outputs=("y",)):
    g = helper.make_graph(nodes, "m", inputs,
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _ort(model, feeds, optimize=True):
    options = ort.SessionOptions()
    if not optimize:  # onnxruntime fuses DequantizeLinear(int4) + MatMul into MatMulNBits
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _ours(model, *xs, **kwargs):
    graph, params, state = mg.from_onnx(model, **kwargs)
    out, _ = mg.compile(graph).apply(params, state, *xs)
    return out


@pytest.mark.parametrize("code", [TensorProto.INT4, TensorProto.UINT4,
                                  TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_4_bit_and_float8_initializers_dequantized(code):
    """A weight-only quantized MatMul: DequantizeLinear of an int4 / uint4 / float8
    initializer (with a zero point of the same type for the integer ones)."""
    low = 0 if code == TensorProto.UINT4 else -8
    values = RNG.integers(low, low + 16, (4, 3)).reshape(-1).tolist()
    integer = code in (TensorProto.INT4, TensorProto.UINT4)
    weight = helper.make_tensor("W", code, [4, 3], values if integer else
                                [float(v) / 4 for v in values])
    inits = [weight, numpy_helper.from_array(np.asarray(0.1, np.float32), "s")]
    if integer:
        inits.append(helper.make_tensor("z", code, [], [low + 1]))
    model = _model([helper.make_node("DequantizeLinear", ["W", "s"] + (["z"] if integer else []),
                                     ["w"]),
                    helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [2, 4])], inits)
    x = RNG.normal(size=(2, 4)).astype(np.float32)
    (want,) = _ort(model, {"x": x}, optimize=False)
    np.testing.assert_allclose(np.asarray(_ours(model, x)), want, rtol=1e-6, atol=1e-6)
    (reference,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(want, reference, rtol=1e-6, atol=1e-6)


INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


@pytest.mark.parametrize("start, end, step", [
    (1, INT64_MAX, 1), (-3, INT64_MAX, 1), (1, 1000, 1), (0, -1, 1), (2, 4, 1),
    (-5, -2, 1), (-1, INT64_MIN, -1), (3, 0, -1), (INT64_MAX, INT64_MIN, -2), (0, 1000, 2)])
def test_a_slice_over_a_symbolic_dim(start, end, step):
    """Ends past the size (INT64_MAX: the exporters' "to the end"), negative starts,
    backwards steps: read with the dim symbolic, equal to onnxruntime at each size."""
    inits = [numpy_helper.from_array(np.asarray([v], np.int64), k)
             for k, v in (("s", start), ("e", end), ("a", 0), ("t", step))]
    model = _model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["N", 3])], inits)
    graph, params, state = mg.from_onnx(model)
    assert not isinstance(graph.input_specs[0].shape[0], int)
    model_ = mg.compile(graph)
    for n in (1, 2, 5, 9):
        x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        (want,) = _ort(model, {"x": x})
        got, _ = model_.apply(params, state, x)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_to_onnx_of_a_slice_to_the_end_reads_back_symbolic(tmp_path):
    x = mg.Input(("batch", 7), name="x")
    graph = mg.Graph(x, x[1:])
    params, state = mg.compile(graph).init(jax.random.key(0))
    graph.to_onnx(tmp_path / "s.onnx", params, state)
    data = RNG.normal(size=(4, 7)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "s.onnx")).run(None, {"x": data})[0]
    np.testing.assert_array_equal(np.asarray(_ours(str(tmp_path / "s.onnx"), data)), want)


def test_a_resize_by_scales_keeps_a_symbolic_batch():
    """A scale of 1 on the symbolic axis keeps it; a scale of 2 on it asks for its size."""
    model = _model([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
                   [helper.make_tensor_value_info("x", F, ["N", 3, 4, 4])],
                   [numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "sc")],
                   opset=19)
    graph, params, state = mg.from_onnx(model)
    assert str(graph.output_specs[0]) == "f32[N,3,8,8]"
    for n in (1, 3):
        x = RNG.normal(size=(n, 3, 4, 4)).astype(np.float32)
        (want,) = _ort(model, {"x": x})
        got, _ = mg.compile(graph).apply(params, state, x)
        np.testing.assert_array_equal(np.asarray(got), want)
    doubled = _model([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
                     [helper.make_tensor_value_info("x", F, ["N", 3])],
                     [numpy_helper.from_array(np.asarray([2, 1], np.float32), "sc")], opset=19)
    with pytest.raises(mg.ShapeError, match="changes the symbolic dim N.*dims=\\{'N': size\\}"):
        mg.from_onnx(doubled)
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(_ours(doubled, x, dims={"N": 2})),
                                  _ort(doubled, {"x": x})[0])


def test_a_lora_adapted_conv_reads_back_and_applies(tmp_path):
    x = mg.Input(("b", 8, 8, 3), name="x")
    adapted = mg.lora(mg.Graph(x, ops.Conv(4, (3, 3), name="conv")(x)), "conv", rank=2)
    model = mg.compile(adapted)
    params, state = model.init(jax.random.key(0))
    params = jax.tree.map(lambda a: a + 0.1, params)  # B away from zero: the adapter counts
    adapted.to_onnx(tmp_path / "lora.onnx", params, state)
    data = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    want, _ = model.apply(params, state, data)
    (from_ort,) = ort.InferenceSession(str(tmp_path / "lora.onnx")).run(None, {"x": data})
    np.testing.assert_allclose(from_ort, np.asarray(want), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(_ours(str(tmp_path / "lora.onnx"), data)), from_ort,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bounds, opset", [(("", "hi"), 13), (("lo", ""), 13), (("",), 13),
                                           ((), 13), ((), 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_clip_without_a_bound_clamps_to_the_dtypes_limits(bounds, opset, dtype):
    """A bound left out is the dtype's lowest or largest value, as ONNX says: -inf and
    inf are clamped to them."""
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.asarray(v, dtype), k) for k, v in (("lo", -0.5), ("hi", 1))
             if k in bounds]
    g = helper.make_graph([helper.make_node("Clip", ["x", *bounds], ["y"])], "m",
                          [helper.make_tensor_value_info("x", code, [5])],
                          [helper.make_tensor_value_info("y", code, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    x = np.asarray([-np.inf, -1, 0.5, 2, np.inf], dtype)
    (want,) = _ort(model, {"x": x})
    got = np.asarray(_ours(model, x))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_batch_normalization_computes_onnxs_inference_form_as_documented():
    """Read as a BatchNorm: onnxruntime's numbers with inference_mode=True (the default
    trains: the batch's statistics); read with layers=False, in both modes."""
    c = 3
    stats = {"scale": RNG.normal(size=c), "bias": RNG.normal(size=c),
             "mean": RNG.normal(size=c), "var": RNG.uniform(0.5, 2, size=c)}
    model = _model([helper.make_node("BatchNormalization", ["x", *stats], ["y"], epsilon=1e-3)],
                   [helper.make_tensor_value_info("x", F, ["N", c, 4])],
                   [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()])
    x = RNG.normal(size=(2, c, 4)).astype(np.float32)
    (want,) = _ort(model, {"x": x})
    graph, params, state = mg.from_onnx(model)
    assert [n.op.op_name for n in graph.nodes][-1] == "batch_norm"
    compiled = mg.compile(graph)
    got, _ = compiled.apply(params, state, x, inference_mode=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    training, _ = compiled.apply(params, state, x)
    batch = (x - x.mean((0, 2), keepdims=True)) / np.sqrt(x.var((0, 2), keepdims=True) + 1e-3)
    np.testing.assert_allclose(np.asarray(training), batch * stats["scale"][:, None]
                               + stats["bias"][:, None], rtol=1e-4, atol=1e-4)
    plain, params, state = mg.from_onnx(model, layers=False)
    for mode in (False, True):
        got, _ = mg.compile(plain).apply(params, state, x, inference_mode=mode)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_negative_ids_of_an_embedding_read_from_gather_count_from_the_end():
    table = RNG.normal(size=(6, 3)).astype(np.float32)
    model = _model([helper.make_node("Gather", ["table", "ids"], ["y"], name="/tok/Gather")],
                   [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b"])],
                   [numpy_helper.from_array(table, "table")])
    graph, params, state = mg.from_onnx(model)
    assert "embedding" in [n.op.op_name for n in graph.nodes]
    ids = np.asarray([-1, -6, 0, 5, -3])
    (want,) = _ort(model, {"ids": ids})
    np.testing.assert_array_equal(want, table[ids])
    np.testing.assert_array_equal(np.asarray(_ours(model, ids.astype(np.int32))), want)


def test_an_initializer_listed_as_an_input_is_its_weight_overridden_by_params():
    """IR >= 4: onnxruntime takes a feed for it, else the initializer. Here it is the
    weight: its default computes as onnxruntime unfed, params give another value as
    the feed does; shapes= naming it says so."""
    g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", F, [3]),
                           helper.make_tensor_value_info("W", F, [3])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.arange(3, dtype=np.float32), "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    x, w = RNG.normal(size=3).astype(np.float32), np.full(3, 100, np.float32)
    graph, params, state = mg.from_onnx(model)
    assert list(graph.inputs) == ["x"] and list(params) == ["W"]
    compiled = mg.compile(graph)
    np.testing.assert_array_equal(np.asarray(compiled.apply(params, state, x)[0]),
                                  _ort(model, {"x": x})[0])
    fed = {"W": {"value": w}}
    np.testing.assert_array_equal(np.asarray(compiled.apply(fed, state, x)[0]),
                                  _ort(model, {"x": x, "W": w})[0])
    with pytest.raises(mg.GraphError, match="'W', a graph input the file gives an initializer"):
        mg.from_onnx(model, shapes={"W": (3,)})


def _shared_weight_model(second_bias="b", other_reader=None):
    """x -> MatMul W (+ b) -> MatMul W (+ second_bias) [-> other_reader of W]."""
    w, b, c = (RNG.normal(size=s).astype(np.float32) for s in ((4, 4), (4,), (4,)))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h0"], name="/fc1/MatMul"),
             helper.make_node("Add", ["h0", "b"], ["h"], name="/fc1/Add"),
             helper.make_node("Identity", ["W"], ["W2"], name="Identity_0"),
             helper.make_node("MatMul", ["h", "W2"], ["y0"], name="/fc2/MatMul"),
             helper.make_node("Add", ["y0", second_bias], ["y1"], name="/fc2/Add"),
             helper.make_node(other_reader or "Identity", ["y1"] + (["W"] if other_reader else []),
                              ["y"], **({"transB": 1} if other_reader else {}))]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 4])],
                  [numpy_helper.from_array(a, k) for k, a in (("W", w), ("b", b), ("c", c))])


@pytest.mark.parametrize("second_bias, other_reader, shared", [
    ("b", None, True), ("c", None, False), ("b", "Gemm", False)])
def test_one_initializer_read_by_two_matmuls_is_one_weight(second_bias, other_reader, shared):
    """The same Linear called twice (one kernel, as the file ties it) when both nodes are
    that Linear; otherwise one weight the ONNX operators read: never two copies."""
    model = _shared_weight_model(second_bias, other_reader)
    graph, params, state = mg.from_onnx(model)
    kernels = [a for layer in params.values() for a in layer.values() if np.shape(a) == (4, 4)]
    assert len(kernels) == 1
    assert ("linear" in [n.op.op_name for n in graph.nodes]) == shared
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    (want,) = _ort(model, {"x": x})
    got, _ = mg.compile(graph).apply(params, state, x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
