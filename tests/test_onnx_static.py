"""Models whose values are all known when the graph is built: a graph without inputs,
the window operators and MelWeightMatrix (static inputs only: constants of the
graph), against onnxruntime, NumPy and onnx's reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from _onnx_models import check_against_ort, onnx_model  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import mlaxgraph as mg  # noqa: E402

F = TensorProto.FLOAT


def test_a_model_without_inputs():
    """Everything constant (a window of a known length, a range of float initializers,
    a loop whose trip count they give): the graph has no inputs and its weights and
    constants give the outputs."""
    I64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [])])
    nodes = [helper.make_node("HannWindow", ["size"], ["w"], periodic=0),
             helper.make_node("Range", ["start", "limit", "step"], ["r"]),
             helper.make_node("Sub", ["limit", "start"], ["span"]),
             helper.make_node("Div", ["span", "step"], ["q"]),
             helper.make_node("Cast", ["q"], ["trips"], to=I64),
             helper.make_node("Loop", ["trips", "", "start"], ["total"], body=body)]
    model = onnx_model(nodes, [], [helper.make_tensor_value_info("w", F, None),
                               helper.make_tensor_value_info("r", F, None),
                               helper.make_tensor_value_info("total", F, None)])
    model.graph.initializer.extend([
        helper.make_tensor("size", TensorProto.INT32, [], [7]),
        helper.make_tensor("start", F, [], [1.0]), helper.make_tensor("limit", F, [], [4.0]),
        helper.make_tensor("step", F, [], [0.5])])
    graph = check_against_ort(model, {})
    assert graph.inputs == ()
    out, _ = mg.compile(graph).apply(*mg.from_onnx(model)[1:])
    np.testing.assert_allclose(out[0], np.hanning(7), atol=1e-6)
    np.testing.assert_allclose(out[1], np.arange(1.0, 4.0, 0.5))
    np.testing.assert_allclose(out[2], 1.0 + 6 * 0.5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    model = onnx_model([helper.make_node(op, ["size"], ["w"], periodic=periodic,
                                     output_datatype=TensorProto.DOUBLE)],
                   [], [helper.make_tensor_value_info("w", TensorProto.DOUBLE, None)])
    model.graph.initializer.append(helper.make_tensor("size", TensorProto.INT64, [], [10]))
    graph, params, state = mg.from_onnx(model)
    ours = np.asarray(mg.compile(graph).apply(params, state)[0])
    np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, {})[0], atol=1e-6)
    numpy_form = {"HannWindow": np.hanning, "BlackmanWindow": np.blackman}.get(op)
    if numpy_form is not None:  # NumPy's are symmetric: the periodic one is one longer, cut
        np.testing.assert_allclose(ours, numpy_form(10) if not periodic else numpy_form(11)[:-1],
                                   atol=1e-6)


@pytest.mark.parametrize("args", [(8, 64, 8000, 0.0, 4000.0), (5, 31, 16000, 300.0, 6000.0)])
def test_mel_weight_matrix_against_the_reference(args):
    names = ["bins", "length", "rate", "low", "high"]
    model = onnx_model([helper.make_node("MelWeightMatrix", names, ["m"])], [],
                   [helper.make_tensor_value_info("m", F, None)])
    for name, value in zip(names, args):
        code = F if isinstance(value, float) else TensorProto.INT64
        model.graph.initializer.append(helper.make_tensor(name, code, [], [value]))
    graph, params, state = mg.from_onnx(model)
    ours = np.asarray(mg.compile(graph).apply(params, state)[0])
    assert ours.shape == (args[1] // 2 + 1, args[0]) and ours.max() == 1.0
    np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, {})[0], atol=1e-6)
