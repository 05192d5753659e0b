"""``graph.to_onnx`` and back: each example model and the zoo's small configs written as
ONNX run in onnxruntime equal to mlaxgraph, and ``from_onnx`` of the file equals the
graph in outputs; the patterns read the layers back (Linear, Conv, LayerNorm)."""

import jax
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from _zoo_transformers import bert_config, gpt2_config, llama_config, vit_config  # noqa: E402

import mlaxgraph as mg  # noqa: E402
from mlaxgraph import ops  # noqa: E402
from mlaxgraph.examples import models as examples  # noqa: E402

MODELS = {
    "mlp": lambda: examples.mlp(),
    "residual_cnn": lambda: examples.residual_cnn(),
    "transformer_block": lambda: examples.transformer_block(),
    "transformer_lm": lambda: examples.transformer_lm(vocab=50, length=16, depth=2, width=32,
                                                      heads=2),
    "resnet18": lambda: mg.models.resnet18(num_classes=10, image_size=32, width=8),
    "gpt2": lambda: mg.models.gpt2(gpt2_config()),
    # one layer each: the writer's forms are the same in every layer
    "bert": lambda: mg.models.bert(bert_config(num_hidden_layers=1)),
    "vit": lambda: mg.models.vit(vit_config(num_hidden_layers=1, image_size=8)),
    "llama": lambda: mg.models.llama(llama_config(num_hidden_layers=1)),
    "qwen2": lambda: mg.models.qwen2({k: v for k, v in llama_config(num_hidden_layers=1).items()
                                      if k not in ("attention_bias", "mlp_bias")}),
    "unet": lambda: mg.models.unet(width=4, depth=1, image_size=8),
}
BATCH = {"batch": 2, "sequence": 8, "seq": 8, "length": 8}


def _example(spec, rng, name=""):
    shape = [d if isinstance(d, int) else BATCH.get(str(d), 2) for d in spec.shape]
    if spec.is_float:
        return rng.normal(size=shape).astype(spec.dtype)
    binary = spec.dtype == bool or name in ("attention_mask", "token_type_ids")
    return rng.integers(0, 2 if binary else 40, size=shape).astype(spec.dtype)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_round_trip_and_onnxruntime(name, tmp_path):
    graph = MODELS[name]()
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    path = tmp_path / f"{name}.onnx"
    proto = graph.to_onnx(path, params, state)
    rng = np.random.default_rng(0)
    xs = [_example(spec, rng, n) for spec, n in zip(graph.input_specs, graph.inputs)]
    want, _ = model.apply(params, state, *xs, inference_mode=True)
    want = want if isinstance(want, tuple) else (want,)
    session = ort.InferenceSession(str(path))
    got_ort = session.run(None, {v.name: x for v, x in zip(proto.graph.input, xs)})
    bound = {str(d): x.shape[i] for spec, x in zip(graph.input_specs, xs)
             for i, d in enumerate(spec.shape) if not isinstance(d, int)}
    back, params2, state2 = mg.from_onnx(path, dims=bound)
    got, _ = mg.compile(back).apply(params2, state2, *xs, inference_mode=True)
    got = got if isinstance(got, tuple) else (got,)
    for w, o, m in zip(want, got_ort, got):
        np.testing.assert_allclose(o, np.asarray(w), rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(np.asarray(m), np.asarray(w), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name,opset", [("vit", 21), ("bert", 23), ("llama", 23), ("gpt2", 21)])
def test_zoo_transformers_read_back_with_their_dims_symbolic(name, opset):
    # without dims=: the shapes exporters compute from Shape (broadcast_to's Expand, a
    # mask's rows, a flatten's Reshape) are read with their symbolic dims, as Range was
    graph = MODELS[name]()
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    back, params2, state2 = mg.from_onnx(graph.to_onnx(None, params, state, opset=opset))
    assert [str(s) for s in back.input_specs] == [str(s) for s in graph.input_specs]
    compiled = mg.compile(back)
    for batch, length in ((2, 8), (3, 5)):
        rng = np.random.default_rng(batch)
        sizes = {"batch": batch, "sequence": length, "seq": length, "length": length}
        xs = []
        for spec, n in zip(graph.input_specs, graph.inputs):
            shape = [d if isinstance(d, int) else sizes[str(d)] for d in spec.shape]
            xs.append(rng.normal(size=shape).astype(spec.dtype) if spec.is_float else
                      rng.integers(0, 2 if n in ("attention_mask", "token_type_ids") else 40,
                                   size=shape).astype(spec.dtype))
        want, _ = model.apply(params, state, *xs, inference_mode=True)
        got, _ = compiled.apply(params2, state2, *xs, inference_mode=True)
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=2e-5)


def test_symbolic_dims_are_dim_params_and_layers_come_back():
    x = mg.Input(("batch", 6), name="x")
    y = ops.LayerNorm(name="norm")(ops.relu(ops.Linear(4, name="fc")(x)))
    graph = mg.Graph(x, y, name="small")
    params, state = mg.compile(graph).init(jax.random.key(1))
    proto = graph.to_onnx(None, params, state)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 6
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "Add", "Relu", "LayerNormalization"]
    back, params2, _ = mg.from_onnx(proto)
    assert [back.node(n).op.op_name for n in back.inputs] == ["input"]
    ops_back = {node.name: node.op.op_name for node in back.nodes}
    assert ops_back == {"x": "input", "fc": "linear", "relu": "onnx.Relu", "norm": "layer_norm"}
    np.testing.assert_array_equal(params2["fc"]["kernel"], params["fc"]["kernel"])


def test_a_block_after_a_strided_conv_reads_back_with_symbolic_sizes():
    # the BatchNorm's block is built on the conv's output dims, -floordiv(-height, 2):
    # called with that same expression it was refused ("built for other input shapes")
    x = mg.Input(("batch", "height", "width", 3), name="images")
    h = ops.Conv(8, (3, 3), strides=(2, 2), padding="SAME", name="conv1")(x)
    graph = mg.Graph(x, ops.relu(ops.BatchNorm(name="bn1")(h)), name="tiny")
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    back, params2, state2 = mg.from_onnx(graph.to_onnx(None, params, state))
    assert [n.op.op_name for n in back.nodes if n.name == "bn1"] == ["block"]
    for size in (9, 16):
        images = np.random.default_rng(size).normal(size=(2, size, size + 1, 3)).astype(np.float32)
        want, _ = model.apply(params, state, images, inference_mode=True)
        got, _ = mg.compile(back).apply(params2, state2, images, inference_mode=True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_casts_are_written_as_cast():
    x = mg.Input(("batch", 3), name="x")
    graph = mg.Graph(x, ops.cast(x, "bfloat16") if hasattr(ops, "cast") else x, name="c")
    proto = graph.to_onnx(None, {}, {})
    assert [n.op_type for n in proto.graph.node] == ["Cast"]
    assert proto.graph.node[0].attribute[0].i == 16  # bfloat16


def test_a_layer_without_onnx_form_is_named():
    x = mg.Input(("batch", 5, 4), name="x")
    graph = mg.Graph(x, ops.LSTM(3, name="rnn")(x), name="r")
    params, state = mg.compile(graph).init(jax.random.key(0))
    with pytest.raises(mg.SerializationError, match="'rnn' \\(op lstm\\) has no ONNX form"):
        graph.to_onnx(None, params, state)


def test_scopes_come_back_as_nested_blocks():
    graph = MODELS["transformer_lm"]()
    params, state = mg.compile(graph).init(jax.random.key(0))
    proto = graph.to_onnx(None, params, state)
    assert "/block0/attention/query/MatMul" in {n.name for n in proto.graph.node}
    back, params2, state2 = mg.from_onnx(proto)
    assert [n.op.op_name for n in back.nodes if n.name.startswith("block")] == ["block", "block"]
    inner = back.node("block0").op.subgraph()
    assert {"ln_attention", "attention", "mlp_in", "mlp_out"} <= {n.name for n in inner.nodes}
    np.testing.assert_array_equal(params2["block0"]["attention"]["query"]["kernel"],
                                  np.asarray(params["block0"]["attention"]["query"]["kernel"])
                                  .reshape(32, 32))
    flat, _, _ = mg.from_onnx(proto, blocks=False)
    assert "block0.attention.query" in {n.name for n in flat.nodes}
