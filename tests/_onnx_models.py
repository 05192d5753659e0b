"""ONNX models written with ``onnx.helper`` in the tests, and the check that
``mg.from_onnx`` + ``mg.compile`` computes what onnxruntime does."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

import mlaxgraph as mg


def onnx_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model of one graph ``g`` at ``opset`` of the default domain."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_against_ort(model, feeds):
    """The graph ``from_onnx`` reads: its outputs on ``feeds`` equal onnxruntime's
    (as many, the same shapes, within 1e-6)."""
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params, state = mg.from_onnx(model)
    out, _ = mg.compile(graph).apply(params, state, *feeds.values(), inference_mode=True)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(expected)
    for ours, theirs in zip(out, expected):
        assert np.asarray(ours).shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6, atol=1e-6)
    return graph
