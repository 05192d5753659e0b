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


def _refused_by_onnx(model, feeds):
    with pytest.raises(Exception) as caught:
        onnx.checker.check_model(model, full_check=True)
    assert not isinstance(caught.value, mg.MlaxGraphError)
    with pytest.raises(Exception) as caught:
        _ort(model, feeds)
    assert not isinstance(caught.value, mg.MlaxGraphError)


def test_inputs_of_one_type_parameter_and_two_dtypes_are_refused():
    """Add(float32, int32) is refused by onnx.checker and onnxruntime: a DTypeError
    naming the node and both inputs, not a silent promotion."""
    model = _model([helper.make_node("Add", ["x", "W"], ["y"], name="/add/Add")],
                   [helper.make_tensor_value_info("x", F, [3])],
                   [numpy_helper.from_array(np.arange(3, dtype=np.int32), "W")])
    _refused_by_onnx(model, {"x": np.ones(3, np.float32)})
    with pytest.raises(mg.DTypeError, match="'/add/Add' \\(Add\\): its inputs 'x' \\(float32\\) "
                                            "and 'W' \\(int32\\) are of the operator's one type T"):
        mg.from_onnx(model)
    # types the operator's schema keeps apart are read: Pow(float32, int64), Where(bool, ...)
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]),
             helper.make_node("Greater", ["x", "zero"], ["c"]),
             helper.make_node("Where", ["c", "p", "x"], ["y"])]
    inits = [numpy_helper.from_array(np.asarray(2, np.int64), "e"),
             numpy_helper.from_array(np.asarray(0, np.float32), "zero")]
    mixed = _model(nodes, [helper.make_tensor_value_info("x", F, [3])], inits)
    x = np.asarray([-1.5, 0.5, 2], np.float32)
    np.testing.assert_allclose(np.asarray(_ours(mixed, x)), _ort(mixed, {"x": x})[0], rtol=1e-6)


@pytest.mark.parametrize("op, inputs, outputs, message", [
    ("Add", ["x"], ["y"], "Add of opset 21 takes 2 inputs, got 1"),
    ("Relu", ["x", "x"], ["y"], "Relu of opset 21 takes 1 input, got 2"),
    ("Relu", ["x"], ["y", "z"], "Relu of opset 21 takes 1 output, got 2"),
    ("Concat", [], ["y"], "Concat of opset 21 takes at least 1 inputs, got 0")])
def test_a_node_of_another_arity_than_its_operators_is_named(op, inputs, outputs, message):
    model = _model([helper.make_node(op, inputs, outputs, name="n", axis=0) if op == "Concat"
                    else helper.make_node(op, inputs, outputs, name="n")],
                   [helper.make_tensor_value_info("x", F, [3])], outputs=outputs)
    _refused_by_onnx(model, {"x": np.ones(3, np.float32)})
    with pytest.raises(mg.GraphError, match=f"node 'n' \\({op}\\): {message}; onnx.checker"):
        mg.from_onnx(model)


def test_a_static_input_the_graph_computes_says_what_would_make_it_known():
    x = helper.make_tensor_value_info("x", F, [2, 3])
    axes = helper.make_tensor_value_info("a", TensorProto.INT64, [1])
    model = _model([helper.make_node("ReduceSum", ["x", "a"], ["y"], name="r")], [x, axes])
    with pytest.raises(mg.ShapeError, match="it is the graph input 'a': make it an initializer"):
        mg.from_onnx(model)
    computed = _model([helper.make_node("Neg", ["a"], ["b"]),
                       helper.make_node("ReduceSum", ["x", "b"], ["y"], name="r")], [x, axes])
    with pytest.raises(mg.ShapeError, match="computed from the values of the graph's inputs "
                                            "\\(their shapes are all known\\)"):
        mg.from_onnx(computed)
    # a symbolic dim: Squeeze without axes depends on its size
    squeeze = _model([helper.make_node("Squeeze", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", F, ["N", 3, 1])])
    with pytest.raises(mg.ShapeError, match="depends on the size of the symbolic dim N: bind "
                                            "it with from_onnx\\(..., dims=\\{'N': size\\}\\)"):
        mg.from_onnx(squeeze)
    data = np.ones((1, 3, 1), np.float32)
    np.testing.assert_array_equal(np.asarray(_ours(squeeze, data, dims={"N": 1})),
                                  _ort(squeeze, {"x": data})[0])


def test_the_declared_output_warning_points_at_the_callers_line():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [3])])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, [4]))
    with pytest.warns(UserWarning, match="declared \\[4\\], but its nodes compute \\[3\\]") as w:
        mg.from_onnx(model)
    assert w[0].filename == __file__
    x = np.ones(3, np.float32)  # onnxruntime too gives what the nodes compute
    with pytest.warns(UserWarning, match="declared"):
        got = np.asarray(_ours(model, x))
    np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


def test_a_model_printed_as_text_is_named_as_no_path():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [3])])
    with pytest.raises(mg.SerializationError, match="a str that is no path but text "
                                                    "\\('ir_version: 10\\\\ngraph"):
        mg.from_onnx(str(model))
    with pytest.raises(mg.SerializationError, match="cannot read the ONNX file 'no.onnx'"):
        mg.from_onnx("no.onnx")


@pytest.mark.parametrize("spelling", ["?", "_", "mod", "max", "min", "floordiv", "batch size",
                                      "2N", "x_0"])
def test_dim_param_spellings_are_read_and_bound_by_them(spelling):
    """Each spelling is a symbolic dim (none of JAX's words), bound by dims= as the file
    spells it or by its name; "?" and "_" name no dim: each is a dim of its own."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [spelling, 3])])
    graph, params, state = mg.from_onnx(model)
    (dim,) = [d for d in graph.input_specs[0].shape if not isinstance(d, int)]
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    (want,) = _ort(model, {"x": x})
    np.testing.assert_array_equal(np.asarray(mg.compile(graph).apply(params, state, x)[0]), want)
    for key in {spelling, str(dim)} - {"?", "_"}:
        bound, _, _ = mg.from_onnx(model, dims={key: 2})
        assert bound.input_specs[0].shape == (2, 3)


def test_distinct_dim_params_stay_distinct_and_unnamed_dims_are_explained():
    """N+1 and N-1 are two dims (they were merged into one N_1); dims without a name
    are each their own, and the error that they do not broadcast says how to join them."""
    two = _model([helper.make_node("Concat", ["x", "z"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("x", F, ["N+1", 3]),
                  helper.make_tensor_value_info("z", F, ["N-1", 3])])
    graph, params, state = mg.from_onnx(two)
    assert [str(s.shape[0]) for s in graph.input_specs] == ["N_plus_1", "N_minus_1"]
    x, z = np.ones((4, 3), np.float32), np.zeros((2, 3), np.float32)
    got, _ = mg.compile(graph).apply(params, state, x, z)
    np.testing.assert_array_equal(np.asarray(got), _ort(two, {"x": x, "z": z})[0])
    plus = _model([helper.make_node("Add", ["x", "z"], ["y"])],
                  [helper.make_tensor_value_info("x", F, ["N+1", 3]),
                   helper.make_tensor_value_info("z", F, ["N-1", 1])])
    with pytest.raises(mg.ShapeError, match="N_minus_1, N_plus_1 are symbolic dims of their own"):
        mg.from_onnx(plus)
    z = np.ones((1, 1), np.float32)
    np.testing.assert_array_equal(np.asarray(_ours(plus, x, z, dims={"N-1": 1})),
                                  _ort(plus, {"x": x, "z": z})[0])
    unnamed = _model([helper.make_node("Add", ["x", "z"], ["y"])],
                     [helper.make_tensor_value_info("x", F, [None, 4]),
                      helper.make_tensor_value_info("z", F, [None, 4])])
    with pytest.raises(mg.ShapeError, match="x_0, z_0 are dims the file gives no name .*shapes="):
        mg.from_onnx(unnamed)
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    got = _ours(unnamed, x, x, shapes={"x": ("n", 4), "z": ("n", 4)})
    np.testing.assert_array_equal(np.asarray(got), _ort(unnamed, {"x": x, "z": x})[0])


def test_dims_given_as_no_mapping_is_a_config_error():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["N", 3])])
    with pytest.raises(mg.ConfigError, match="dims=...\\) takes a mapping .*got list"):
        mg.from_onnx(model, dims=[("N", 2)])


@pytest.mark.parametrize("scale_shape, bias_shape, bias_input", [
    ((1,), (4,), False), ((4,), (1,), False), ((4,), (4,), True), ((4,), (4,), False)])
def test_layer_normalization_with_broadcast_weights(scale_shape, bias_shape, bias_input):
    """A (1,) scale or bias (ONNX broadcasts it) or a bias the graph computes is left to
    ONNX's operator; (4,) weights are a LayerNorm."""
    inits = [numpy_helper.from_array(RNG.normal(size=scale_shape).astype(np.float32), "s")]
    inputs = [helper.make_tensor_value_info("x", F, ["N", 4])]
    if bias_input:
        inputs.append(helper.make_tensor_value_info("b", F, [4]))
    else:
        inits.append(numpy_helper.from_array(RNG.normal(size=bias_shape).astype(np.float32), "b"))
    model = _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
                   inputs, inits, opset=17)
    feeds = {"x": RNG.normal(size=(3, 4)).astype(np.float32)}
    if bias_input:
        feeds["b"] = RNG.normal(size=4).astype(np.float32)
    graph, _, _ = mg.from_onnx(model)
    pattern = scale_shape == bias_shape == (4,) and not bias_input
    assert ("layer_norm" in [n.op.op_name for n in graph.nodes]) == pattern
    np.testing.assert_allclose(np.asarray(_ours(model, *feeds.values())), _ort(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
