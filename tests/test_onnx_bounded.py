"""NonZero and Unique, whose output length depends on values: exact when folded on
constants, with a static bound from ``from_onnx(sizes=...)`` on the graph's tensors
(checked against onnx's reference implementation and NumPy), a named error without
one; a bounded graph written by ``to_onnx`` runs in onnxruntime equal to mlaxgraph."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import mlaxgraph as mg  # noqa: E402


def _model(op, shape, *, constant=None, **attrs):
    outs = ["y"] if op == "NonZero" else ["y", "indices", "inverse", "counts"]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/act/Relu"),
             helper.make_node(op, ["c" if constant is not None else "r"], outs,
                              name=f"/find/{op}", **attrs)]
    values = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    values.insert(0, helper.make_tensor_value_info("r", TensorProto.UNDEFINED, None))
    inits = [numpy_helper.from_array(constant, "c")] if constant is not None else []
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    return helper.make_model(helper.make_graph(nodes, "g", [x], values, initializer=inits),
                             opset_imports=[helper.make_opsetid("", 18)])


def _run(model, x, **kwargs):
    graph, params, state = mg.from_onnx(model, **kwargs)
    out, _ = mg.compile(graph).apply(params, state, x, inference_mode=True)
    return graph, [np.asarray(o) for o in out]


def _values(rng, shape):
    return (rng.integers(0, 3, size=shape) * (rng.random(shape) < 0.6)).astype(np.float32)


@pytest.mark.parametrize("size, fill", [(12, -1), (3, 0)])
def test_nonzero_with_a_bound_against_the_reference(size, fill):
    model = _model("NonZero", [3, 4])
    x = _values(np.random.default_rng(0), (3, 4))
    _, want = ReferenceEvaluator(model).run(None, {"x": x})
    count = want.shape[1]
    graph, (relu, got) = _run(model, x, sizes={"NonZero": (size, fill)})
    assert graph.output_specs[1].shape == (2, size)
    np.testing.assert_array_equal(got[:, :count], want[:, :size])
    assert (got[:, count:] == fill).all()


def _numpy_unique(x, axis, keep_sorted):
    """ONNX's Unique in NumPy: the first-occurrence order when not sorted."""
    y, index, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not keep_sorted:
        order = np.argsort(index)
        y, index, counts = np.take(y, order, axis=axis or 0), index[order], counts[order]
        inverse = np.argsort(order)[inverse]
    return y, index, inverse, counts


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 1}, {"axis": -2, "sorted": 0}])
def test_unique_with_a_bound_against_numpy(attrs):
    model = _model("Unique", [3, 4], **attrs)
    x = np.random.default_rng(1).integers(0, 3, size=(3, 4)).astype(np.float32)
    x[:, 2] = x[:, 0]  # a repeated column
    axis = attrs.get("axis")
    y, index, inverse, counts = _numpy_unique(x, axis, attrs.get("sorted", 1))
    n = len(counts)
    _, (relu, *got) = _run(model, x, sizes={"/find/Unique": (n + 2, -5.0)})
    along = 0 if axis is None else axis % 2
    np.testing.assert_array_equal(np.take(got[0], range(n), axis=along), y)
    assert (np.take(got[0], [n, n + 1], axis=along) == -5.0).all()
    np.testing.assert_array_equal(got[1], np.r_[index, -1, -1])
    np.testing.assert_array_equal(got[2], inverse)
    np.testing.assert_array_equal(got[3], np.r_[counts, 0, 0])


def test_without_a_bound_is_named_and_constants_fold_exactly():
    with pytest.raises(mg.ShapeError, match=r"'find.NonZero'.*depends on the values.*"
                                            r"sizes=\{node name or 'NonZero': n\}"):
        mg.from_onnx(_model("NonZero", ["batch", 4]))
    constant = np.asarray([[0, 2, 0], [1, 0, 3]], np.int64)
    graph, (relu, got) = _run(_model("NonZero", [2], constant=constant), np.ones(2, np.float32))
    np.testing.assert_array_equal(got, np.stack(np.nonzero(constant)))


def test_bad_bounds_are_named():
    model = _model("NonZero", [3, 4])
    with pytest.raises(mg.GraphError, match="names 'nowhere': no NonZero, Unique or NonMaxSuppression node"):
        mg.from_onnx(model, sizes={"nowhere": 4})
    with pytest.raises(mg.GraphError, match=r"\['NonZero'\] must be a size n >= 0"):
        mg.from_onnx(model, sizes={"NonZero": -1})


def test_a_bounded_graph_writes_and_runs_in_onnxruntime():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/act/Relu"),
             helper.make_node("NonZero", ["r"], ["nz"], name="/find/NonZero"),
             helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], name="/uniq/Unique",
                              sorted=0)]
    outs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
            for n in ["nz", "u", "ui", "uinv", "uc"]]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs),
                              opset_imports=[helper.make_opsetid("", 18)])
    graph, params, state = mg.from_onnx(model, dims={"batch": 3},
                                        sizes={"NonZero": (16, -1), "u": 10})
    value = np.round(np.random.default_rng(2).normal(size=(3, 4))).astype(np.float32)
    want, _ = mg.compile(graph).apply(params, state, value)
    proto = graph.to_onnx(None, params, state, opset=18)
    assert {"Pad", "Slice"} <= {n.op_type for n in proto.graph.node}
    got = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": value})
    for w, o in zip(want, got):
        np.testing.assert_array_equal(o, np.asarray(w))


def _numpy_nms(boxes, scores, limit, iou, score_min):
    """Greedy suppression per batch and class, boxes as (y1, x1, y2, x2)."""
    rows = []
    for b in range(scores.shape[0]):
        y0, x0 = np.minimum(boxes[b, :, 0], boxes[b, :, 2]), np.minimum(boxes[b, :, 1], boxes[b, :, 3])
        y1, x1 = np.maximum(boxes[b, :, 0], boxes[b, :, 2]), np.maximum(boxes[b, :, 1], boxes[b, :, 3])
        area = (y1 - y0) * (x1 - x0)
        for c in range(scores.shape[1]):
            kept = []
            for i in np.argsort(-scores[b, c], kind="stable"):
                if scores[b, c, i] <= score_min or len(kept) == limit:
                    continue
                inter = [max(min(y1[i], y1[j]) - max(y0[i], y0[j]), 0)
                         * max(min(x1[i], x1[j]) - max(x0[i], x0[j]), 0) for j in kept]
                if all(t / (area[i] + area[j] - t) <= iou for t, j in zip(inter, kept)):
                    kept.append(i)
            rows += [[b, c, i] for i in kept]
    return np.asarray(rows, np.int64).reshape(-1, 3)


def test_non_max_suppression_with_a_bound_against_numpy():
    rng = np.random.default_rng(3)
    corner = rng.uniform(0, 8, size=(2, 12, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(1, 4, size=(2, 12, 2))], -1).astype(np.float32)
    scores = rng.random((2, 3, 12)).astype(np.float32)
    names = ["boxes", "scores", "limit", "iou", "score_min"]
    inits = [numpy_helper.from_array(np.asarray([4], np.int64), "limit"),
             numpy_helper.from_array(np.asarray([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.asarray([0.2], np.float32), "score_min")]
    node = helper.make_node("NonMaxSuppression", names, ["selected"], name="/nms/NonMaxSuppression")
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [2, 12, 4]),
                      helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 3, 12])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, None)], initializer=inits),
        opset_imports=[helper.make_opsetid("", 11)])
    want = _numpy_nms(boxes, scores, 4, 0.3, 0.2)
    graph, params, state = mg.from_onnx(model, sizes={"selected": (30, -1)})
    got, _ = mg.compile(graph).apply(params, state, boxes, scores)
    got = np.asarray(got)
    np.testing.assert_array_equal(got[:len(want)], want)
    assert (got[len(want):] == -1).all()
    proto = graph.to_onnx(None, params, state, opset=11)
    ours = ort.InferenceSession(proto.SerializeToString()).run(None, {"boxes": boxes, "scores": scores})
    np.testing.assert_array_equal(ours[0], got)
