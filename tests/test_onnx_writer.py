"""``to_onnx``'s forms of attention (rotary embeddings, grouped key/value heads, a
sliding window, a mask; ONNX's Attention and RotaryEmbedding from opset 23, primitive
operators before), of indexing, broadcasting and transposed convolutions: each run in
onnxruntime equal to mlaxgraph, and ``from_onnx`` of the file equal again."""

import jax
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import mlaxgraph as mg  # noqa: E402
from mlaxgraph import ops  # noqa: E402


def _check(graph, xs, opset, *, back=True, adapters=False):
    """The graph written at ``opset``: onnxruntime's outputs and those of the graph
    read back equal mlaxgraph's; returns the file's operator types. ``adapters``: every
    LoRA adapter's weights drawn normal (B nonzero)."""
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    if adapters:
        leaves, tree = jax.tree_util.tree_flatten_with_path(params)
        rng = np.random.default_rng(5)
        params = jax.tree.unflatten(tree, [
            (0.2 * rng.normal(size=a.shape)).astype(np.float32) if ".lora_" in jax.tree_util.keystr(k)
            else a for k, a in leaves])
    proto = graph.to_onnx(None, params, state, opset=opset)
    want, _ = model.apply(params, state, *xs, inference_mode=True)
    want = want if isinstance(want, tuple) else (want,)
    session = ort.InferenceSession(proto.SerializeToString())
    got = session.run(None, {v.name: x for v, x in zip(proto.graph.input, xs)})
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, np.asarray(w), rtol=2e-4, atol=2e-5)
    if back:
        bound = {str(d): x.shape[i] for spec, x in zip(graph.input_specs, xs)
                 for i, d in enumerate(spec.shape) if not isinstance(d, int)}
        read, params2, state2 = mg.from_onnx(proto, dims=bound)
        again, _ = mg.compile(read).apply(params2, state2, *xs, inference_mode=True)
        again = again if isinstance(again, tuple) else (again,)
        for w, o in zip(want, again):
            np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=2e-4, atol=2e-5)
    return {n.op_type for n in proto.graph.node}


# opset 21: primitive operators, the rotation's tables as constants; 23: Attention
# (is_causal without mask and window) and RotaryEmbedding, the tables computed from the
# symbolic length. (The zoo's Llama and Qwen2 write the primitive form at a symbolic length.)
@pytest.mark.parametrize("opset, length, masked", [(21, 6, True), (23, "seq", True),
                                                   (23, "seq", False)])
def test_rotary_grouped_heads_and_window(opset, length, masked):
    x = mg.Input(("batch", length, 16), name="x")
    attention = ops.MultiHeadAttention(4, 4, num_kv_heads=2, causal=True, rope=500.0,
                                       rope_scaling={"rope_type": "linear", "factor": 2.0},
                                       sliding_window=3 if masked else None, name="attn")
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(2, 6, 16)).astype(np.float32)]
    if masked:  # (batch, q_len, kv_len), and with it the causal mask and the window
        mask = mg.Input(("batch", length, length), "bool", name="mask")
        graph = mg.Graph([x, mask], attention(x, mask=mask), name="a")
        xs.append(rng.random((2, 6, 6)) < 0.8)
    else:
        graph = mg.Graph(x, attention(x), name="a")
    types = _check(graph, xs, opset)
    fused = {"Attention", "RotaryEmbedding"}
    assert fused <= types if opset >= 23 else not fused & types


def test_getitem_and_broadcast_to():
    x = mg.Input(("batch", 6, 5), name="x")
    outs = [x[:, 0], x[..., 1:4], x[:, None, -1], x[1:, ::2], x[:, -2:, 3], x[-1],
            ops.broadcast_to(x[:, :1], (x.shape[0], 3, 5))]
    graph = mg.Graph(x, tuple(outs), name="g")
    value = np.arange(3 * 6 * 5, dtype=np.float32).reshape(3, 6, 5)
    _check(graph, [value], 21)
    want = [value[:, 0], value[..., 1:4], value[:, None, -1], value[1:, ::2], value[:, -2:, 3],
            value[-1], np.broadcast_to(value[:, :1], (3, 3, 5))]
    got = mg.compile(graph).apply({}, {}, value, inference_mode=True)[0]
    for w, o in zip(want, got):
        np.testing.assert_array_equal(np.asarray(o), w)


@pytest.mark.parametrize("kernel, strides, padding, layout", [
    ((3, 3), 2, "SAME", "NCHW"), ((1, 1), 2, "VALID", "NHWC"), ((3, 2), (1, 2), ((1, 0), (0, 1)), "NHWC")])
def test_conv_transpose(kernel, strides, padding, layout):
    shape = ("batch", 4, 5, 3) if layout == "NHWC" else ("batch", 3, 4, 5)
    x = mg.Input(shape, name="x")
    layer = ops.ConvTranspose(2, kernel, strides=strides, padding=padding, data_format=layout,
                              name="up")
    graph = mg.Graph(x, layer(x), name="t")
    value = np.random.default_rng(3).normal(size=(2,) + shape[1:]).astype(np.float32)
    assert "ConvTranspose" in _check(graph, [value], 21, back=False)


@pytest.mark.parametrize("opset", [21, 23])
def test_attention_adapters_unmerged_run_in_onnxruntime(opset):
    """LoRA adapters on attention, not merged: their outputs added to the projections
    (query and value; the fused qkv split in three), the output projection's adapter
    reading the attended values: onnxruntime equals mlaxgraph, and the file read back."""
    x = mg.Input(("batch", 6, 16), name="x")
    attention = ops.MultiHeadAttention(4, 4, num_kv_heads=2, causal=True, rope=500.0, name="attn")
    graph = mg.lora(mg.Graph(x, attention(x), name="a"), ["attn", "attn/out"], rank=2)
    xs = [np.random.default_rng(1).normal(size=(2, 6, 16)).astype(np.float32)]
    _check(graph, xs, opset, adapters=True)
    gpt2 = mg.lora(mg.models.gpt2({"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 32,
                                   "n_positions": 8}), ["h.*/attn/qkv", "h.*/attn/out"], rank=2)
    types = _check(gpt2, [np.arange(10, dtype=np.int32).reshape(2, 5) % 32], opset, adapters=True)
    assert "Split" in types


@pytest.mark.parametrize("opset", [21, 23])
def test_a_bfloat16_policy_writes_bfloat16_weights_and_attention(opset):
    # the weights in the dtype the layers compute in (bfloat16 is not a numpy floating
    # type: it was written float32 beside bfloat16 activations), the mask's lowest value
    # bfloat16's; onnxruntime's CPU provider has no bfloat16 MatMul: ONNX's reference
    # evaluator runs the file
    from onnx import TensorProto, checker
    from onnx.reference import ReferenceEvaluator

    from _zoo_transformers import llama_config

    model = mg.compile(mg.models.llama(llama_config(num_hidden_layers=1)),
                       mg.Policy(compute_dtype="bfloat16"))
    params, state = model.init(jax.random.key(0))
    proto = model.to_onnx(None, params, state, opset=opset)
    checker.check_model(proto, full_check=True)
    kinds = {t.name: t.data_type for t in proto.graph.initializer}
    assert kinds["model.layers.0/self_attn.query.kernel"] == TensorProto.BFLOAT16
    assert kinds["model.layers.0/input_layernorm.scale"] == TensorProto.FLOAT  # float32 layer
    ids = np.random.default_rng(0).integers(0, 50, (2, 8)).astype(np.int32)
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: ids})[0]
    want, _ = model.apply(params, state, ids, inference_mode=True)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=4e-3)


def test_layer_options_and_everyday_layers_are_written():
    """What a layer's options change is written (Linear's and Conv's ``activation=``,
    LayerNorm over another axis or without scale or bias), and the everyday layers have
    a form (pad, the reductions, split, GroupNorm): onnxruntime equals mlaxgraph, and a
    NumPy reference of the same formulas."""
    x = mg.Input(("batch", 4, 6), name="x")
    image = mg.Input(("batch", 5, 5, 4), name="image")
    outs = [ops.Linear(3, activation=a, name=f"fc_{a}")(x)
            for a in ("relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid")]
    outs += [ops.Conv(2, (3, 3), activation="relu", name="conv")(image),
             ops.LayerNorm(axis=1, name="ln_axis")(x),
             ops.LayerNorm(use_bias=False, name="ln_nobias")(x),
             ops.LayerNorm(use_scale=False, axis=-2, name="ln_noscale")(x),
             ops.GroupNorm(2, name="gn")(image),
             ops.pad(x, ((0, 0), (1, 2), (0, 1)), value=1.5), ops.pad(x, ((0, 0), (1, 1), (2, 0)), mode="reflect"),
             ops.pad(x, ((0, 0), (0, 1), (1, 0)), mode="edge"),
             ops.sum(x, axis=1), ops.mean(x, axis=(1, 2), keepdims=True), ops.max(x), ops.sum(x > 0, axis=-1),
             *ops.split(x, (1, 3), axis=1)]
    graph = mg.Graph([x, image], tuple(outs), name="g")
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(2, 4, 6)).astype(np.float32),
          rng.normal(size=(2, 5, 5, 4)).astype(np.float32)]
    types = _check(graph, xs, 21)
    assert {"Relu", "Gelu", "Sigmoid", "Tanh", "Pad", "ReduceSum", "Split"} <= types
    # the options against NumPy: LayerNorm over axis 1 alone, GroupNorm over each group
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    got = model.apply(params, state, *xs)[0]
    v = xs[0].astype(np.float64)
    want = (v - v.mean(1, keepdims=True)) / np.sqrt(v.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(got[7]), want, rtol=1e-4, atol=1e-5)
    grouped = xs[1].astype(np.float64).reshape(2, 5, 5, 2, 2)
    want = ((grouped - grouped.mean((1, 2, 4), keepdims=True))
            / np.sqrt(grouped.var((1, 2, 4), keepdims=True) + 1e-5)).reshape(xs[1].shape)
    np.testing.assert_allclose(np.asarray(got[10]), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[0]), np.maximum(v @ np.asarray(params["fc_relu"]["kernel"])
                                                              + np.asarray(params["fc_relu"]["bias"]), 0),
                               rtol=1e-5, atol=1e-5)


def test_symbolic_pad_amounts_are_written_as_expressions_of_the_input_dims():
    """The zoo's U-Net at its defaults (any height and width): each upsampled map is
    padded to its skip's size by ``floordiv(skip_height - 2*height, 2)`` rows, an
    expression of a block's input dims, written as int64 operators on their Shapes;
    onnxruntime equals mlaxgraph at sizes the pools divide and sizes they do not."""
    graph = mg.models.unet(width=4, depth=2)
    rng = np.random.default_rng(2)
    for shape in [(2, 10, 13, 3), (1, 7, 9, 3)]:
        types = _check(graph, [rng.normal(size=shape).astype(np.float32)], 21)
    assert {"Pad", "Mod", "Div", "Shape"} <= types


def test_a_tied_head_under_a_float16_policy_reads_the_table_cast():
    """The embedding table is stored once as the lookup reads it (float32: the policy
    casts after the lookup); the tied head, computing in float16, reads it through a
    Cast: the file passes onnx's checker and onnxruntime equals mlaxgraph."""
    from onnx import checker

    ids = mg.Input(("batch", "seq"), "int32", name="ids")
    table = ops.Embedding(50, 16, name="wte")
    graph = mg.Graph(ids, table.attend(ops.Linear(16, name="fc")(table(ids))), name="tied")
    model = mg.compile(graph, policy="float16")
    params, state = model.init(jax.random.key(0))
    proto = model.to_onnx(None, params, state)
    checker.check_model(proto, full_check=True)
    value = np.arange(12, dtype=np.int32).reshape(2, 6) * 4 % 50
    (got,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"ids": value})
    want, _ = model.apply(params, state, value)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)


def test_the_accumulation_dtype_is_written_as_casts_around_the_product():
    """``preferred_element_type=float32`` on float16 inputs: the operands cast to float32,
    the product and bias in float32, the result cast back to float16 (as
    ``lax.dot_general`` and ``conv_general_dilated`` accumulate): onnxruntime equals
    mlaxgraph, and a NumPy float32 product rounded to float16."""
    x = mg.Input(("batch", 5, 5, 3), "float16", name="x")
    conv = ops.Conv(4, (3, 3), preferred_element_type="float32", name="conv")
    fc = ops.Linear(6, preferred_element_type="float32", activation="relu", name="fc")
    graph = mg.Graph(x, (fc(x), conv(x)), name="acc")
    value = np.random.default_rng(4).normal(size=(2, 5, 5, 3)).astype(np.float16)
    types = _check(graph, [value], 21)
    assert "Cast" in types
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    kernel = np.asarray(params["fc"]["kernel"], np.float16).astype(np.float32)
    want = np.maximum(value.astype(np.float32) @ kernel + np.asarray(params["fc"]["bias"], np.float32), 0)
    got = model.apply(params, state, value)[0][0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(np.asarray(got, np.float32), want.astype(np.float16).astype(np.float32),
                               rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("opset", [21, 23])
def test_yarn_rotary_tables_are_written_scaled(opset):
    """YaRN's rotary tables (ramped frequencies, cos and sin times the attention factor)
    written as constants or computed from the symbolic length: onnxruntime equals
    mlaxgraph."""
    x = mg.Input(("batch", "seq", 16), name="x")
    attention = ops.MultiHeadAttention(4, 4, causal=True, rope=100.0, name="attn", rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    graph = mg.Graph(x, attention(x), name="a")
    _check(graph, [np.random.default_rng(6).normal(size=(2, 7, 16)).astype(np.float32)], opset)


def test_a_layer_called_twice_writes_its_weights_once_and_reads_back_shared():
    """A Linear and a Conv each called twice: one initializer per weight, read by both
    calls; onnxruntime equals mlaxgraph, and ``from_onnx`` reads one shared weight."""
    x = mg.Input(("batch", 6), name="x")
    image = mg.Input(("batch", 5, 5, 2), name="image")
    fc, conv = ops.Linear(6, name="fc"), ops.Conv(2, (3, 3), padding="SAME", name="conv")
    graph = mg.Graph([x, image], (fc(ops.relu(fc(x))), conv(ops.relu(conv(image)))), name="twice")
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(2, 6)).astype(np.float32), rng.normal(size=(2, 5, 5, 2)).astype(np.float32)]
    _check(graph, xs, 21)
    params, state = mg.compile(graph).init(jax.random.key(0))
    proto = graph.to_onnx(None, params, state)
    assert sorted(t.name for t in proto.graph.initializer) == ["conv.bias", "conv.kernel", "fc.bias", "fc.kernel"]
    _, read, _ = mg.from_onnx(proto)
    assert sum(v.size for v in jax.tree.leaves(read)) == sum(v.size for v in jax.tree.leaves(params))
