"""ONNX control flow (If, Loop, Scan: operators whose bodies are graphs) through
mg.from_onnx, against onnxruntime: bodies reading values of the graph around them, a
condition computed from the inputs, a loop that stops early, a scan backwards along
axis 1."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from _onnx_models import check_against_ort, onnx_model
from onnx import TensorProto, helper

import mlaxgraph as mg

F = TensorProto.FLOAT


def _branch(name, op, value):
    # a branch reading the outer values x and y
    out = helper.make_tensor_value_info(f"{name}_out", F, [2, 3])
    return helper.make_graph([helper.make_node(op, ["x", "y"], [f"{name}_out"])], name, [], [out])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_a_computed_condition_and_outer_values(sign, tmp_path):
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["z"], then_branch=_branch("then", "Add", 1),
                              else_branch=_branch("else", "Mul", 2))]
    zero = helper.make_tensor("zero", F, [], [0.0])
    model = onnx_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3]),
                           helper.make_tensor_value_info("y", F, [2, 3])],
                   [helper.make_tensor_value_info("z", F, [2, 3])])
    model.graph.initializer.append(zero)
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(2, 3))).astype(np.float32) * sign
    graph = check_against_ort(model, {"x": x, "y": rng.normal(size=(2, 3)).astype(np.float32)})
    assert graph.node("if").op.op_name == "onnx.If"
    # the bodies are hyperparameters like others: the graph saves and loads
    _, params, state = mg.from_onnx(model)
    mg.save(tmp_path / "if.mlg", graph, params, state)
    assert mg.load(tmp_path / "if.mlg")[0] == graph


def test_loop_that_stops_early():
    # v doubles while its sum stays below the limit, at most 10 times
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "two"], ["v_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [3])],
        initializer=[helper.make_tensor("two", F, [], [2.0])])
    model = onnx_model([helper.make_node("Loop", ["trip", "go", "v"], ["v_final"], body=body)],
                   [helper.make_tensor_value_info("v", F, [3]),
                    helper.make_tensor_value_info("limit", F, [])],
                   [helper.make_tensor_value_info("v_final", F, [3])])
    model.graph.initializer.extend([helper.make_tensor("trip", TensorProto.INT64, [], [10]),
                                    helper.make_tensor("go", TensorProto.BOOL, [], [True])])
    check_against_ort(model, {"v": np.float32([0.5, 1.0, 0.25]), "limit": np.array(40.0, np.float32)})


def test_scan_backwards_along_an_axis():
    # a running sum of x's columns from the last, and each step's partial sums
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "col"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["step"])],
        "body",
        [helper.make_tensor_value_info("acc_in", F, [2]), helper.make_tensor_value_info("col", F, [2])],
        [helper.make_tensor_value_info("acc_out", F, [2]), helper.make_tensor_value_info("step", F, [2])])
    model = onnx_model([helper.make_node("Scan", ["acc", "x"], ["total", "steps"], body=body,
                                     num_scan_inputs=1, scan_input_axes=[1],
                                     scan_input_directions=[1], scan_output_axes=[1])],
                   [helper.make_tensor_value_info("acc", F, [2]),
                    helper.make_tensor_value_info("x", F, [2, 5])],
                   [helper.make_tensor_value_info("total", F, [2]),
                    helper.make_tensor_value_info("steps", F, [2, 5])])
    rng = np.random.default_rng(1)
    feeds = {"acc": np.zeros(2, np.float32), "x": rng.normal(size=(2, 5)).astype(np.float32)}
    graph = check_against_ort(model, feeds)
    # a body reading nothing around it is written back as it was read: onnxruntime runs
    # the written file to the same values
    _, params, state = mg.from_onnx(model)
    written = graph.to_onnx(None, params, state)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(written.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours, theirs in zip(got, expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_to_onnx_refuses_a_body_reading_values_around_it():
    nodes = [helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["z"], then_branch=_branch("then", "Add", 1),
                              else_branch=_branch("else", "Mul", 2))]
    model = onnx_model(nodes, [helper.make_tensor_value_info(n, F, shape)
                           for n, shape in (("s", []), ("x", [2, 3]), ("y", [2, 3]))],
                   [helper.make_tensor_value_info("z", F, [2, 3])])
    model.graph.initializer.append(helper.make_tensor("zero", F, [], [0.0]))
    graph, params, state = mg.from_onnx(model)
    with pytest.raises(mg.SerializationError, match=r"layer 'if' \(op onnx.If\) has a body "
                       r"that reads values of the graph around it \(x, y\)"):
        graph.to_onnx(None, params, state)


def test_a_scan_body_reading_a_constant_axis_around_it():
    """The body unsqueezes each column along an axis computed outside it (a Constant
    and a Neg: a constant of the graph), as ONNX's expanded LinearAttention writes."""
    I64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["col", "axis"], ["u"]),
         helper.make_node("Add", ["acc_in", "col"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("acc_in", F, [2]), helper.make_tensor_value_info("col", F, [2])],
        [helper.make_tensor_value_info("acc_out", F, [2]), helper.make_tensor_value_info("u", F, [2, 1])])
    model = onnx_model([helper.make_node("Constant", [], ["one"], value=helper.make_tensor("c", I64, [1], [1])),
                    helper.make_node("Neg", ["one"], ["axis"]),
                    helper.make_node("Scan", ["acc", "x"], ["total", "cols"], body=body,
                                     num_scan_inputs=1, scan_input_axes=[1])],
                   [helper.make_tensor_value_info("acc", F, [2]),
                    helper.make_tensor_value_info("x", F, [2, 5])],
                   [helper.make_tensor_value_info("total", F, [2]),
                    helper.make_tensor_value_info("cols", F, [5, 2, 1])])
    x = np.random.default_rng(4).normal(size=(2, 5)).astype(np.float32)
    graph = check_against_ort(model, {"acc": np.zeros(2, np.float32), "x": x})
    assert graph.output_specs[1].shape == (5, 2, 1)


def test_a_loop_whose_length_depends_on_the_data_is_refused():
    body = helper.make_graph(
        [helper.make_node("Less", ["v_in", "ten"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "ten"], ["v_out"]),
         helper.make_node("Identity", ["v_in"], ["row"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, []),
         helper.make_tensor_value_info("row", F, [])],
        initializer=[helper.make_tensor("ten", F, [], [10.0])])
    model = onnx_model([helper.make_node("Loop", ["trip", "", "v"], ["v_final", "rows"], body=body)],
                   [helper.make_tensor_value_info("v", F, [])],
                   [helper.make_tensor_value_info("v_final", F, []),
                    helper.make_tensor_value_info("rows", F, [None])])
    model.graph.initializer.append(helper.make_tensor("trip", TensorProto.INT64, [], [5]))
    with pytest.raises(mg.GraphError, match="Loop with scan outputs.*stop early"):
        mg.from_onnx(model)


@pytest.mark.parametrize("rank", [4, 5])
def test_an_if_with_a_known_condition_is_its_branch(rank):
    """The condition comes from the rank of the input (known when the graph is built);
    the branches give different shapes and one computes a shape used downstream (a
    ``Reshape``'s target), as ONNX's expanded functions (AffineGrid) write."""
    I64 = TensorProto.INT64
    shape_then = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", I64, [2], [-1, 4]))],
        "then", [], [helper.make_tensor_value_info("t", I64, [2])])
    shape_else = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], end=2),
         helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", I64, [1], [-1])),
         helper.make_node("Concat", ["s", "m"], ["e"], axis=0)], "else", [],
        [helper.make_tensor_value_info("e", I64, [3])])
    value_then = helper.make_graph([helper.make_node("Relu", ["x"], ["vt"])], "vthen", [],
                                   [helper.make_tensor_value_info("vt", F, None)])
    value_else = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["ve"], keepdims=0)],
                                   "velse", [], [helper.make_tensor_value_info("ve", F, None)])
    nodes = [helper.make_node("Size", ["dims"], ["n"]),
             helper.make_node("Equal", ["n", "four"], ["c"]),
             helper.make_node("If", ["c"], ["target"], then_branch=shape_then,
                              else_branch=shape_else),
             helper.make_node("If", ["c"], ["v"], then_branch=value_then, else_branch=value_else),
             helper.make_node("Reshape", ["x", "target"], ["y"]),
             helper.make_node("Cast", ["v"], ["z"], to=F)]
    model = onnx_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                   [helper.make_tensor_value_info("y", F, None),
                    helper.make_tensor_value_info("z", F, None)])
    model.graph.initializer.extend([
        helper.make_tensor("dims", I64, [rank], [1] * rank),
        helper.make_tensor("four", I64, [], [4])])
    x = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)
    graph = check_against_ort(model, {"x": x})
    assert "onnx.If" not in {n.op.op_name for n in graph.nodes}  # read as the branch
    assert graph.output_specs[0].shape == ((6, 4) if rank == 4 else (2, 3, 4))
    assert graph.output_specs[1].shape == ((2, 3, 4) if rank == 4 else ())



def test_flex_attention_with_a_score_body_and_grouped_heads():
    """FlexAttention (ai.onnx.preview): a soft cap on the scores as its score_mod body;
    4 query heads on 2 key/value heads;
    against onnx's reference implementation and NumPy."""
    from onnx.reference import ReferenceEvaluator

    score = helper.make_graph(
        [helper.make_node("Constant", [], ["cap"], value=helper.make_tensor("c", F, [], [2.0])),
         helper.make_node("Div", ["s", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
         helper.make_node("Mul", ["t", "cap"], ["m"])], "soft_cap",
        [helper.make_tensor_value_info("s", F, None)], [helper.make_tensor_value_info("m", F, None)])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview",
                            score_mod=score, name="/attn/FlexAttention")
    model = helper.make_model(
        helper.make_graph([node], "flex", [helper.make_tensor_value_info(n, F, s) for n, s in
                                           (("q", [2, 4, 3, 8]), ("k", [2, 2, 5, 8]),
                                            ("v", [2, 2, 5, 6]))],
                          [helper.make_tensor_value_info("y", F, None)]),
        opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("ai.onnx.preview", 1)])
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)))
    graph, params, state = mg.from_onnx(model)
    ours = np.asarray(mg.compile(graph).apply(params, state, q, k, v)[0])
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    s = 2.0 * np.tanh(q @ kr.transpose(0, 1, 3, 2) / np.sqrt(8) / 2.0)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(ours, (p / p.sum(-1, keepdims=True)) @ vr, rtol=1e-5, atol=1e-6)
    want = ReferenceEvaluator(model).run(None, {"q": q, "k": k, "v": v})[0]
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)


def test_gradient_against_numpy():
    """Gradient (ai.onnx.preview.training): d y / d x through a weight and a Tanh, with
    a zs input held fixed, and d y / d h with respect to an intermediate value."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "z"], ["s"]),
             helper.make_node("Tanh", ["s"], ["y"]),
             helper.make_node("Gradient", ["x", "z"], ["dy_dx", "dy_dz"], xs=["x", "z"], y="y",
                              domain="ai.onnx.preview.training", name="/grad/Gradient"),
             helper.make_node("Gradient", ["h"], ["dy_dh"], xs=["h"], y="y",
                              domain="ai.onnx.preview.training")]
    graph = helper.make_graph(
        nodes, "grad", [helper.make_tensor_value_info(n, F, [3]) for n in ("x", "z")],
        [helper.make_tensor_value_info(n, F, [3]) for n in ("y", "dy_dx", "dy_dz", "dy_dh")],
        initializer=[helper.make_tensor("w", F, [3], [0.5, -2.0, 3.0])])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.preview.training", 1)])
    x, z = np.asarray([0.1, 0.2, -0.3], np.float32), np.asarray([0.3, -0.1, 0.2], np.float32)
    g, params, state = mg.from_onnx(model)
    y, dx, dz, dh = (np.asarray(o) for o in mg.compile(g).apply(params, state, x, z)[0])
    w = np.asarray([0.5, -2.0, 3.0], np.float32)
    slope = 1 - np.tanh(x * w + z) ** 2
    np.testing.assert_allclose(y, np.tanh(x * w + z), rtol=1e-6)
    np.testing.assert_allclose(dx, slope * w, rtol=1e-5)
    np.testing.assert_allclose(dz, slope, rtol=1e-5)
    np.testing.assert_allclose(dh, slope, rtol=1e-5)
