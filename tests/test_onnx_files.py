"""Reading ONNX files: numbers against onnxruntime, external data read from the
model's folder only, and damaged files (bit flips, truncations, lying external data,
wrong-size initializers, cycles, missing inputs, unknown operators) refused with
``mg.*Error``s only."""

import os
import random
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import mlaxgraph as mg  # noqa: E402

RNG = np.random.default_rng(0)
W1 = RNG.normal(size=(6, 5)).astype(np.float32)
B1 = RNG.normal(size=(5,)).astype(np.float32)


def small_model(shape_value=(-1, 5)):
    """x (batch, 6) -> MatMul W1 + B1 -> Relu -> Reshape -> Mul by itself."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="/fc/MatMul"),
        helper.make_node("Add", ["h", "B1"], ["a"], name="/fc/Add"),
        helper.make_node("Relu", ["a"], ["r"], name="/act/Relu"),
        helper.make_node("Reshape", ["r", "shape"], ["s"], name="/Reshape"),
        helper.make_node("Mul", ["s", "s"], ["y"], name="/Mul"),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        initializer=[numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "B1"),
                     numpy_helper.from_array(np.asarray(shape_value, np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_mlaxgraph(source, x):
    graph, params, state = mg.from_onnx(source)
    out, _ = mg.compile(graph).apply(params, state, x)
    return np.asarray(out)


def test_a_model_matches_onnxruntime():
    model = small_model()
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_mlaxgraph(model, x), want, rtol=1e-5, atol=1e-6)
    graph, params, _ = mg.from_onnx(model)
    assert str(graph.input_specs[0]) == "f32[batch,6]"
    np.testing.assert_array_equal(params["fc"]["kernel"], W1)  # MatMul + Add read as a Linear


def test_sources_of_every_kind_and_what_is_not_one(tmp_path):
    import io

    model = small_model()
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    want = run_mlaxgraph(model, x)
    data = model.SerializeToString()
    for source in (data, memoryview(data), io.BytesIO(data)):
        np.testing.assert_array_equal(run_mlaxgraph(source, x), want)
    with pytest.raises(mg.SerializationError, match=r"got its graph \(GraphProto\): pass the model"):
        mg.from_onnx(model.graph)
    with pytest.raises(mg.SerializationError, match="reads a path, the file's bytes.*got NoneType"):
        mg.from_onnx(None)
    for size in (2.5, "3", True):  # were read as 2, 3 and 1
        with pytest.raises(mg.ConfigError, match=r"the size of 'batch' is an int"):
            mg.from_onnx(model, dims={"batch": size})
    graph, params, state = mg.from_onnx(model)
    with pytest.raises(mg.SerializationError, match=r"cannot write .*its folder does not exist"):
        graph.to_onnx(tmp_path / "missing" / "m.onnx", params, state)
    with pytest.raises(mg.SerializationError, match="cannot write"):
        graph.to_onnx(tmp_path, params, state)  # a folder


def test_external_data_is_read_from_the_model_folder(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save_model(small_model(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=64)
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_mlaxgraph(path, x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(mg.SerializationError, match="give from_onnx the model's path"):
        mg.from_onnx(onnx.load(str(path), load_external_data=False))


def _external(tmp_path, location, offset=0, length=None):
    model = small_model()
    tensor = model.graph.initializer[0]
    data = tensor.raw_data or W1.tobytes()
    (tmp_path / "weights.bin").write_bytes(data)
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../weights.bin", "/etc/passwd", "sub/../../weights.bin"])
def test_external_data_outside_the_folder_is_refused_unread(tmp_path, location):
    path = _external(tmp_path, location)
    opened = []

    def audit(event, args):
        if event == "open" and isinstance(args[0], str) and recording:
            opened.append(os.path.realpath(args[0]))

    recording = True
    sys.addaudithook(audit)
    try:
        with pytest.raises(mg.SerializationError, match="outside the model's folder"):
            mg.from_onnx(path)
    finally:
        recording = False
    folder = os.path.realpath(path.parent)
    assert all(p.startswith(folder + os.sep) for p in opened), opened


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    path = _external(tmp_path, "link.bin")
    os.symlink(tmp_path / "weights.bin", path.parent / "link.bin")
    with pytest.raises(mg.SerializationError, match="outside the model's folder"):
        mg.from_onnx(path)


@pytest.mark.parametrize("offset, length", [(0, 10 ** 6), (10 ** 6, None), (-4, None)])
def test_lying_offsets_and_lengths_are_refused(tmp_path, offset, length):
    path = _external(tmp_path, "weights.bin", offset, length)
    (path.parent / "weights.bin").write_bytes(W1.tobytes())
    with pytest.raises(mg.SerializationError, match="initializer 'W1'"):
        mg.from_onnx(path)


def test_an_initializer_of_the_wrong_size_is_refused():
    model = small_model()
    model.graph.initializer[0].raw_data = W1.tobytes()[:-4]
    with pytest.raises(mg.SerializationError, match="'W1'"):
        mg.from_onnx(model)


def test_a_cycle_is_refused():
    model = small_model()
    model.graph.node[0].input[0] = "y"  # MatMul reads the graph's last value
    with pytest.raises(mg.GraphError, match="cycle"):
        mg.from_onnx(model)


def test_a_missing_input_is_refused():
    model = small_model()
    model.graph.node[2].input[0] = "nowhere"
    with pytest.raises(mg.GraphError, match=r"'/act/Relu' \(Relu\) reads 'nowhere'"):
        mg.from_onnx(model)


def test_an_unknown_operator_is_named():
    model = small_model()
    model.graph.node[2].op_type = "FancyRelu"
    with pytest.raises(mg.GraphError, match=r"'/act/Relu' \(FancyRelu\).*FancyRelu is not"):
        mg.from_onnx(model)


def test_a_data_dependent_shape_is_named():
    model = small_model()
    model.graph.node[3].input[1] = "a"  # Reshape to a computed shape
    with pytest.raises(mg.ShapeError, match="must be known when the graph is built"):
        mg.from_onnx(model)


def test_older_operator_sets():
    """Opset 1's Not and Transpose are as at opset 6: read (against NumPy); Relu
    changed at opset 6 (its consumed_inputs went), opset 4's Reshape
    takes its shape as an attribute, changed at opset 5: refused, naming it."""
    x = helper.make_tensor_value_info("x", TensorProto.BOOL, [2, 3])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Not", ["x"], ["y"]), helper.make_node("Transpose", ["v"], ["r"])],
        "old", [x, v], [helper.make_tensor_value_info("y", TensorProto.BOOL, [2, 3]),
                        helper.make_tensor_value_info("r", TensorProto.FLOAT, [3, 2])]),
        opset_imports=[helper.make_opsetid("", 1)])
    graph, params, state = mg.from_onnx(model)
    xs, vs = RNG.random((2, 3)) > 0.5, RNG.normal(size=(2, 3)).astype(np.float32)
    (y, r), _ = mg.compile(graph).apply(params, state, xs, vs)
    np.testing.assert_array_equal(y, ~xs)
    np.testing.assert_array_equal(r, vs.T)
    model.graph.node.append(helper.make_node("Relu", ["v"], ["relu"], name="/act/Relu"))
    with pytest.raises(mg.SerializationError, match=r"set is 1; node '/act/Relu' \(Relu\)"):
        mg.from_onnx(model)
    del model.graph.node[-1]
    model.opset_import[0].version = 4
    model.graph.node.append(helper.make_node("Reshape", ["v"], ["s"], shape=[3, 2],
                                             name="/flat/Reshape"))
    with pytest.raises(mg.SerializationError, match=r"set is 4; node '/flat/Reshape' \(Reshape\)"):
        mg.from_onnx(model)


def test_damaged_files_raise_only_mlaxgraph_errors(tmp_path):
    data = small_model().SerializeToString()
    rng = random.Random(26)
    outcomes = {"loaded": 0, "refused": 0}
    mutants = [data[:n] for n in range(0, len(data), max(1, len(data) // 60))]
    for _ in range(150):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        mutants.append(bytes(flipped))
    path = tmp_path / "m.onnx"
    for mutant in mutants:
        path.write_bytes(mutant)
        try:
            mg.from_onnx(path)
            outcomes["loaded"] += 1
        except mg.MlaxGraphError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 50, outcomes


def test_the_exporters_flatten_chain_reads_with_a_symbolic_batch():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the gathered dim was a bare
    # symbolic scalar ('_DimExpr' has no 'ndim', reported as a damaged file)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
             helper.make_node("Concat", ["bu", "m1"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([-1], np.int64), "m1")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    graph, params, state = mg.from_onnx(model)
    assert str(graph.output_specs[0]) == "f32[N,12]"
    for n in (2, 5):
        x = RNG.normal(size=(n, 3, 4)).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_array_equal(run_mlaxgraph(model, x), want)
