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


def _trees(aggregate, post):
    """Two trees, two targets. Tree 0: x0 <= 0.5 ? (x1 in {1, 3} ? leaf 0 : leaf 1) :
    leaf 2, NaN in x1 going to the true side. Tree 1: x2 > -1 ? leaf 3 : leaf 4."""
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=2,
        aggregate_function=aggregate, post_transform=post, tree_roots=[0, 2],
        nodes_featureids=[0, 1, 2], nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [3], [0, 6, 3]),
        nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, [3], [0.5, 0.0, -1.0]),
        nodes_truenodeids=[1, 0, 3], nodes_trueleafs=[0, 1, 1],
        nodes_falsenodeids=[2, 1, 4], nodes_falseleafs=[1, 1, 1],
        nodes_missing_value_tracks_true=[0, 1, 0],
        membership_values=helper.make_tensor("v", TensorProto.FLOAT, [3], [1.0, 3.0, np.nan]),
        leaf_targetids=[0, 1, 0, 1, 0],
        leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [5], [1.0, 2.0, 3.0, 4.0, 5.0]))
    graph = helper.make_graph([node], "trees",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("ai.onnx.ml", 5)])


@pytest.mark.parametrize("aggregate,post", [(1, 0), (0, 2), (3, 0), (2, 1)])
def test_tree_ensemble(aggregate, post):
    """Against onnxruntime and onnx's reference implementation before the post
    transform (a target no leaf reaches is 0, as in onnxruntime; the reference
    leaves the float's extreme there), the transform against NumPy as ONNX's
    specification numbers it (1 softmax, 2 logistic: onnxruntime 1.32 reads 1 as
    logistic and 2 as softmax)."""
    from onnx.reference import ReferenceEvaluator

    x = np.asarray([[0.0, 1.0, 0.0], [0.0, 2.0, -2.0], [1.0, 3.0, 5.0], [0.2, np.nan, -3.0],
                    [0.5, 3.0, -1.0]], np.float32)
    g, params, state = mg.from_onnx(_trees(aggregate, post))
    ours = np.asarray(mg.compile(g).apply(params, state, x)[0])
    raw_model = _trees(aggregate, 0)
    raw = _ort(raw_model, {"x": x})[0]
    reference = ReferenceEvaluator(raw_model).run(None, {"x": x})[0]
    reached = np.abs(reference) < 1e30
    np.testing.assert_allclose(raw[reached], reference[reached], rtol=1e-6)
    if aggregate == 1:  # the leaves by hand: tree 0's, then tree 1's, per target
        np.testing.assert_array_equal(raw, [[1, 4], [5, 2], [3, 4], [1 + 5, 0], [1 + 5, 0]])
    if post == 1:
        want = np.exp(raw) / np.exp(raw).sum(-1, keepdims=True)
    elif post == 2:
        want = 1 / (1 + np.exp(-raw))
    else:
        want = raw
    np.testing.assert_allclose(ours, want, rtol=1e-6)
