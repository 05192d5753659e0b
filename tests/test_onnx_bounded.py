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
    with pytest.raises(mg.GraphError, match="names 'nowhere': no NonZero or Unique node"):
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
