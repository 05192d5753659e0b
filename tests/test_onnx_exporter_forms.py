"""The forms exporters write around the layers ``from_onnx`` recognises: weights
reached through ``Identity`` (``torch.onnx.export`` writes one for each initializer it
deduplicated, BERT's and GPT-2's equal biases) or a ``Transpose`` / ``Cast`` of their
own, and module scopes holding a single layer (a ``Sequential`` around one ``Conv``);
numbers against onnxruntime."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import mlaxgraph as mg  # noqa: E402

RNG = np.random.default_rng(3)


def _array(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def _leaves(graph):
    return {path: node.op.op_name for path, node in graph.walk() if not hasattr(node.op, "graph")}


def _run_both(model, feeds):
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    graph, params, state = mg.from_onnx(model)
    out, _ = mg.compile(graph).apply(params, state, *feeds.values(), inference_mode=True)
    outs = out if isinstance(out, tuple) else (out,)
    for a, b in zip(outs, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)
    return graph, params


def test_weights_through_identity_transpose_and_cast_read_as_layers():
    bias = _array(8)  # one bias for two layers: the exporter keeps one, Identity for the other
    inits = {"q.weight": _array(8, 8), "k.weight": _array(8, 8), "bias": bias,
             "ln.weight": _array(8), "ln.bias": _array(8), "fc.weight_t": _array(4, 8),
             "fc.bias": _array(4).astype(np.float16), "tied": _array(5, 8)}
    nodes = [
        helper.make_node("Identity", ["ln.weight"], ["ln_w"], name="Identity_1"),
        helper.make_node("Identity", ["ln.bias"], ["ln_b"], name="Identity_2"),
        helper.make_node("LayerNormalization", ["x", "ln_w", "ln_b"], ["n"], axis=-1,
                         name="/enc/ln/LayerNormalization"),
        helper.make_node("Identity", ["bias"], ["bias_copy"], name="Identity_3"),
        helper.make_node("MatMul", ["n", "q.weight"], ["q0"], name="/enc/q/MatMul"),
        helper.make_node("Add", ["bias", "q0"], ["q"], name="/enc/q/Add"),
        helper.make_node("MatMul", ["n", "k.weight"], ["k0"], name="/enc/k/MatMul"),
        helper.make_node("Add", ["bias_copy", "k0"], ["k"], name="/enc/k/Add"),
        helper.make_node("Mul", ["q", "k"], ["h"], name="/enc/Mul"),
        # a weight read only through its own Transpose, a bias through a Cast
        helper.make_node("Transpose", ["fc.weight_t"], ["fc_w"], perm=[1, 0], name="/fc/Transpose"),
        helper.make_node("Cast", ["fc.bias"], ["fc_b"], to=TensorProto.FLOAT, name="/fc/Cast"),
        helper.make_node("Gemm", ["h", "fc_w", "fc_b"], ["y"], name="/fc/Gemm"),
        # a weight read raw and through a Transpose (tied): one weight, no copy
        helper.make_node("Transpose", ["tied"], ["tied_t"], perm=[1, 0], name="/head/Transpose"),
        helper.make_node("MatMul", ["n", "tied_t"], ["z0"], name="/head/MatMul"),
        helper.make_node("Gather", ["tied", "ids"], ["e"], name="/embed/Gather"),
        helper.make_node("ReduceSum", ["e"], ["es"], keepdims=0, name="/embed/ReduceSum"),
        helper.make_node("Add", ["z0", "es"], ["z"], name="/Add"),
    ]
    graph = helper.make_graph(
        nodes, "identity_form",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 8]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [6, 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": _array(6, 8), "ids": np.asarray([1, 4], np.int64)}
    graph, params = _run_both(model, feeds)
    leaves = _leaves(graph)
    assert leaves["enc/q"] == leaves["enc/k"] == "linear"
    assert leaves["enc/ln"] == "layer_norm" and leaves["fc"] == "linear"
    assert "onnx.Identity" not in leaves.values()
    np.testing.assert_array_equal(params["enc"]["k"]["bias"], bias)
    np.testing.assert_array_equal(params["fc"]["kernel"], inits["fc.weight_t"].T)
    np.testing.assert_array_equal(params["fc"]["bias"], inits["fc.bias"].astype(np.float32))
    # the tied weight is one param, transposed in the graph, not two copies
    assert list(leaves.values()).count("param") == 1
    assert leaves["head/Transpose"] == "onnx.Transpose"


def test_every_module_scope_is_drawn():
    """ResNet's ``downsample`` (a Sequential around one Conv once the exporter folded
    its BatchNorm), MobileNet's last ``block.N`` (the same), a one-operation module
    (``relu``) and a module whose single layer is itself (``fc``)."""
    nodes = [
        helper.make_node("Conv", ["x", "c1.w"], ["a"], pads=[1, 1, 1, 1],
                         name="/layer1/block0/conv1/Conv"),
        helper.make_node("Relu", ["a"], ["r"], name="/layer1/block0/relu/Relu"),
        helper.make_node("Conv", ["x", "ds.w", "ds.b"], ["d"],
                         name="/layer1/block0/downsample/downsample.0/Conv"),
        helper.make_node("Add", ["r", "d"], ["s"], name="/layer1/block0/Add"),
        helper.make_node("Conv", ["s", "p.w"], ["p"], name="/layer1/proj/proj.0/Conv"),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["g"], ["f"], name="/Flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1, name="/fc/Gemm"),
    ]
    inits = {"c1.w": _array(4, 3, 3, 3), "ds.w": _array(4, 3, 1, 1), "ds.b": _array(4),
             "p.w": _array(6, 4, 1, 1), "fc.w": _array(2, 6), "fc.b": _array(2)}
    graph = helper.make_graph(
        nodes, "scopes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph, params = _run_both(model, {"x": _array(1, 3, 6, 6)})
    walked = dict(graph.walk())
    written = {"/".join(n.name.strip("/").split("/")[:i])
               for n in model.graph.node for i in range(1, n.name.strip("/").count("/") + 1)}
    assert written <= set(walked), written - set(walked)
    for block in ("layer1", "layer1/block0", "layer1/block0/downsample", "layer1/proj"):
        assert hasattr(walked[block].op, "graph"), block
    assert walked["layer1/block0/downsample/downsample.0"].op.op_name == "conv"
    assert walked["layer1/block0/relu"].op.op_name == "onnx.Relu"
    assert walked["fc"].op.op_name == "linear"
    np.testing.assert_array_equal(
        params["layer1"]["block0"]["downsample"]["downsample.0"]["kernel"], inits["ds.w"])
