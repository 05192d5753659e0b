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
