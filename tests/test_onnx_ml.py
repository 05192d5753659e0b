"""Operators of ONNX's classical machine-learning domain (``ai.onnx.ml``) through
mg.from_onnx and back through to_onnx, against onnxruntime."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import mlaxgraph as mg  # noqa: E402


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("shape", [(3, 5), (5,)])
def test_binarizer_and_array_feature_extractor(shape):
    nodes = [helper.make_node("Binarizer", ["x"], ["b"], domain="ai.onnx.ml", threshold=0.25,
                              name="/binarize/Binarizer"),
             helper.make_node("ArrayFeatureExtractor", ["x", "idx"], ["f"], domain="ai.onnx.ml",
                              name="/pick/ArrayFeatureExtractor"),
             helper.make_node("Mul", ["f", "f"], ["y"], name="/square/Mul")]
    graph = helper.make_graph(
        nodes, "ml", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("idx", TensorProto.INT64, [3], [4, 0, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    want = _ort(model, {"x": x})
    g, params, state = mg.from_onnx(model)
    ours, _ = mg.compile(g).apply(params, state, x)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6)
    np.testing.assert_array_equal(want[0], (x > 0.25).astype(np.float32))  # NumPy's form
    # written back in their domain, the file runs in onnxruntime the same
    back = g.to_onnx(None, params, state)
    assert {n.domain for n in back.graph.node if n.op_type == "Binarizer"} == {"ai.onnx.ml"}
    assert "ai.onnx.ml" in {o.domain for o in back.opset_import}
    for a, b in zip(_ort(back, {back.graph.input[0].name: x}), want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
