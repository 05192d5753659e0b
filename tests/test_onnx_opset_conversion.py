"""A file read at an old ONNX opset and written at another: the nodes whose operator is
defined otherwise at the opset written are converted (``onnx/writer_versions.py``), so
the file written computes what the file read computes (onnxruntime on both, the same
inputs); a node the converter cannot carry is an ``mg.SerializationError``."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import mlaxgraph as mg  # noqa: E402

X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


def _model(nodes, opset, initializers=()):
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, list(X.shape))],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         initializer=list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def _run(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options).run(None, {"x": X})[0]


CASES = {
    # normalizes over axes 1 and 2 before 13 (the input coerced to 2-d), over axis 1 after
    "softmax_axis1": ([h.make_node("Softmax", ["x"], ["y"], axis=1)], 11, ()),
    "softmax_default": ([h.make_node("Softmax", ["x"], ["y"])], 11, ()),
    "log_softmax": ([h.make_node("LogSoftmax", ["x"], ["y"], axis=1)], 11, ()),
    "hardmax": ([h.make_node("Hardmax", ["x"], ["y"], axis=1)], 11, ()),
    # attributes that became inputs
    "squeeze": ([h.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
                 h.make_node("Squeeze", ["u"], ["y"], axes=[0])], 11, ()),
    "reduce_sum": ([h.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], 11, ()),
    "split": ([h.make_node("Split", ["x"], ["a", "b"], axis=2, split=[1, 3]),
               h.make_node("Mul", ["a", "a"], ["y"])], 11, ()),
    "slice": ([h.make_node("Slice", ["x"], ["y"], starts=[1], ends=[3], axes=[2])], 9, ()),
    "pad": ([h.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 2, 0], value=1.5)], 10, ()),
    "clip": ([h.make_node("Clip", ["x"], ["y"], min=-0.1, max=0.2)], 6, ()),
    "upsample": ([h.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")], 9,
                 (nh.from_array(np.array([1, 1, 2], np.float32), "scales"),)),
    # k an attribute before opset 10 (it was read as a missing input)
    "top_k": ([h.make_node("TopK", ["x"], ["y", "i"], k=2, axis=2)], 9, ()),
    # (X, scales) at opset 10, onnxruntime's nearest "simple" mode (up when shrinking)
    "resize_10_shrink": ([h.make_node("Resize", ["x", "s"], ["y"], mode="nearest")], 10,
                         (nh.from_array(np.array([1, 0.5, 0.6], np.float32), "s"),)),
    "resize_10_linear": ([h.make_node("Resize", ["x", "s"], ["y"], mode="linear")], 10,
                         (nh.from_array(np.array([1, 1.5, 2.5], np.float32), "s"),)),
    "resize_10_grow": ([h.make_node("Resize", ["x", "s"], ["y"], mode="nearest")], 10,
                       (nh.from_array(np.array([1, 1.5, 2.5], np.float32), "s"),)),
    "upsample_linear": ([h.make_node("Upsample", ["x", "scales"], ["y"], mode="linear")], 9,
                        (nh.from_array(np.array([1, 2, 1.5], np.float32), "scales"),)),
    "upsample_7": ([h.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 2.0, 3.0])],
                   7, ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_node_of_an_old_opset_written_at_the_default_computes_as_read(name):
    nodes, opset, initializers = CASES[name]
    model = _model(nodes, opset, initializers)
    want = _run(model)
    graph, params, state = mg.from_onnx(model)
    np.testing.assert_allclose(np.asarray(mg.compile(graph).apply(params, state, X)[0]), want,
                               rtol=1e-6, atol=1e-6)
    written = graph.to_onnx(None, params, state)
    assert written.opset_import[0].version == 21
    onnx.checker.check_model(written, full_check=True)
    np.testing.assert_allclose(_run(written), want, rtol=1e-6, atol=1e-6)
    # and read back, it computes the same again
    again, p2, s2 = mg.from_onnx(written)
    np.testing.assert_allclose(np.asarray(mg.compile(again).apply(p2, s2, X)[0]), want,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_the_softmax_family_read_at_21_written_at_11(op, axis):
    # from opset 13 over one axis; before it over the axes from it on: written as a
    # transpose of the axis to the last and back
    model = _model([h.make_node(op, ["x"], ["y"], axis=axis)], 21)
    graph, params, state = mg.from_onnx(model)
    written = graph.to_onnx(None, params, state, opset=11)
    onnx.checker.check_model(written, full_check=True)
    np.testing.assert_allclose(_run(written), _run(model), rtol=1e-6, atol=1e-6)


def test_a_node_defined_alike_at_both_opsets_is_written_as_read():
    model = _model([h.make_node("Relu", ["x"], ["y"])], 11)
    graph, params, state = mg.from_onnx(model)
    written = graph.to_onnx(None, params, state)
    assert [n.op_type for n in written.graph.node] == ["Relu"]


def test_a_node_the_converter_cannot_carry_is_named():
    # Gelu exists from opset 20: read at 20, it has no form at 18
    model = _model([h.make_node("Gelu", ["x"], ["y"])], 20)
    graph, params, state = mg.from_onnx(model)
    with pytest.raises(mg.SerializationError, match=r"(?s)'gelu'.*opset 20.*opset=20"):
        graph.to_onnx(None, params, state, opset=18)
    np.testing.assert_allclose(_run(graph.to_onnx(None, params, state, opset=20)), _run(model),
                               rtol=1e-6)


def test_an_upsample_enlarging_and_shrinking_nearest_is_refused_later_written_at_its_own():
    model = _model([h.make_node("Resize", ["x", "s"], ["y"], mode="nearest")], 10,
                   (nh.from_array(np.array([1, 0.5, 2.0], np.float32), "s"),))
    graph, params, state = mg.from_onnx(model)
    with pytest.raises(mg.SerializationError, match=r"enlarges some axes and shrinks others.*"
                                                    r"opset=10"):
        graph.to_onnx(None, params, state)
    np.testing.assert_allclose(_run(graph.to_onnx(None, params, state, opset=10)), _run(model))
