"""Numerics of the layers and forms of issue 16 against independent NumPy references
written here: ConvTranspose (a scatter-add), Upsample and resize (PyTorch's
``align_corners=False`` formulas), pooling over channel-first data, GRU with PyTorch's
two biases (a loop of the formula) and files saved before ``recurrent_bias``, grouped
-query attention with causal, key-padding masks and rotary embeddings (Hugging Face's
Llama formulation), the operators on symbolic tensors, arange, broadcast_to, Param,
Embedding.attend and the small tensor ops. Forward in float32 and under the bfloat16
dtype guarantee, gradients by finite differences (``jax.test_util.check_grads``)."""

from __future__ import annotations

import itertools
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads

import mlaxgraph as mg
from mlaxgraph import ops

BF16 = np.dtype(ml_dtypes.bfloat16)
DATA = os.path.join(os.path.dirname(__file__), "data")


def run(graph, *xs, seed=0, params=None, policy=None, **kwargs):
    model = mg.compile(graph, policy)
    p, s = model.init(jax.random.key(seed))
    if params is not None:
        p = params(p)
    out, _ = model.apply(p, s, *xs, inference_mode=True, **kwargs)
    return out, p


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def grads_ok(build, *xs, seed=0):
    """check_grads of the summed outputs of ``build(*inputs)`` w.r.t. params and float
    inputs, in float64 (the graph is built on float64 inputs of the arrays' shapes)."""
    with jax.enable_x64(True):
        inputs = [mg.Input(np.shape(x), "float64" if np.issubdtype(np.asarray(x).dtype, np.floating)
                           else np.asarray(x).dtype) for x in xs]
        graph = mg.Graph(inputs, build(*inputs))
        model = mg.compile(graph, mg.Policy(param_dtype="float64", compute_dtype="float64"))
        p, s = model.init(jax.random.key(seed))
        p = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(3), a.shape, a.dtype), p)
        xs = [jnp.asarray(x, jnp.float64) if np.issubdtype(np.asarray(x).dtype, np.floating) else x
              for x in xs]
        floats = [i for i, x in enumerate(xs) if jnp.issubdtype(x.dtype, jnp.floating)]

        def f(p, *fx):
            args = list(xs)
            for i, v in zip(floats, fx):
                args[i] = v
            out, _ = model.apply(p, s, *args, inference_mode=True)
            return sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(out))

        check_grads(f, (p, *[xs[i] for i in floats]), order=1, modes=["rev"], eps=1e-6)


# --- ConvTranspose against a NumPy scatter-add ---------------------------------------


def scatter_add_conv_transpose(x, kernel, strides, crops, dilation, bias=None):
    """Channel-last transposed convolution written as its definition: each input position
    ``p`` adds ``x[p] * kernel[:, k, :]`` at output ``p * stride + k * dilation - low``;
    ``kernel`` is OHWI (features, *window, in)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    spatial_in, window = x.shape[1:-1], kernel.shape[1:-1]
    full = [(n - 1) * s + (k - 1) * d + 1 for n, k, s, d in zip(spatial_in, window, strides, dilation)]
    out_size = [f - lo - hi for f, (lo, hi) in zip(full, crops)]
    y = np.zeros((x.shape[0], *out_size, kernel.shape[0]))
    for p in itertools.product(*[range(n) for n in spatial_in]):
        for k in itertools.product(*[range(w) for w in window]):
            o = [pi * s + ki * d - lo for pi, ki, s, d, (lo, _) in zip(p, k, strides, dilation, crops)]
            if all(0 <= oi < n for oi, n in zip(o, out_size)):
                y[(slice(None), *o)] += x[(slice(None), *p)] @ kernel[(slice(None), *k)].T
    return y if bias is None else y + bias


def keras_crops(kernel, stride, padding, dilation):
    """The crops giving Keras's Conv2DTranspose output sizes, worked out here from them:
    VALID ``n * s + max(k - s, 0)``, SAME ``n * s``, from the full ``(n - 1) * s + k``."""
    k = (kernel - 1) * dilation + 1
    if padding == "VALID":
        return 0, -max(stride - k, 0)
    total = k - stride
    return (total // 2, total - total // 2) if total >= 0 else (0, total)


CONV_T = [
    ((2, 5, 3), 4, (3,), (2,), "VALID", (1,)),
    ((2, 4, 5, 3), 2, (3, 2), (2, 3), "SAME", (1, 1)),
    ((1, 3, 4, 2), 3, (2, 2), (2, 2), "VALID", (1, 1)),
    ((2, 3, 4, 2), 2, (3, 3), (1, 2), ((1, 0), (2, 1)), (2, 1)),
    ((1, 3, 2, 3, 2), 2, (2, 3, 2), (2, 1, 3), "SAME", (1, 1, 1)),
    ((2, 4, 3), 2, (1,), (3,), "VALID", (1,)),
]


@pytest.mark.parametrize("shape,features,window,strides,padding,dilation", CONV_T)
@pytest.mark.parametrize("data_format", ["last", "first"])
def test_conv_transpose_is_a_scatter_add(shape, features, window, strides, padding, dilation,
                                         data_format):
    n = len(window)
    x_last = rand(*shape)
    first = data_format == "first"
    perm = (0, n + 1, *range(1, n + 1))
    x = x_last.transpose(perm) if first else x_last
    inp = mg.Input(x.shape)
    layer = ops.ConvTranspose(features, window, strides=strides, padding=padding, dilation=dilation,
                              data_format="NCHW" if first else "NHWC", name="up")
    g = mg.Graph(inp, layer(inp))
    y, p = run(g, x, params=lambda p: jax.tree.map(lambda a: a + rand(*a.shape, seed=5), p))
    kernel = np.asarray(p["up"]["kernel"])
    if first:  # OIHW -> OHWI
        kernel = kernel.transpose(0, *range(2, n + 2), 1)
    crops = padding if not isinstance(padding, str) else [
        keras_crops(k, s, padding, d) for k, s, d in zip(window, strides, dilation)]
    want = scatter_add_conv_transpose(x_last, kernel, strides, crops, dilation, np.asarray(p["up"]["bias"]))
    if first:
        want = want.transpose(perm)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    if padding == "SAME":
        assert y.shape[1 + first:][:n] == tuple(d * s for d, s in zip(shape[1:-1], strides))


def test_conv_transpose_matches_pytorch_weight_layout_and_output_padding():
    # PyTorch ConvTranspose2d(in=2, out=3, k=3, stride=2, padding=1, output_padding=1):
    # weight (in, out, kh, kw); ours channel-first is (out, in, kh, kw), no flip; the
    # padding is the pair (p, p - output_padding) per dim.
    x = rand(1, 2, 4, 5)
    w_torch = rand(2, 3, 3, 3, seed=1)
    inp = mg.Input(x.shape)
    g = mg.Graph(inp, ops.ConvTranspose(3, (3, 3), strides=2, padding=((1, 0), (1, 0)),
                                        data_format="NCHW", use_bias=False, name="up")(inp))
    y, _ = run(g, x, params=lambda p: {"up": {"kernel": jnp.asarray(w_torch.transpose(1, 0, 2, 3))}})
    assert y.shape == (1, 3, 8, 10)  # (n - 1) * 2 - 2 + 3 + 1
    want = scatter_add_conv_transpose(x.transpose(0, 2, 3, 1), w_torch.transpose(1, 2, 3, 0), (2, 2),
                                      [(1, 0), (1, 0)], (1, 1))
    np.testing.assert_allclose(y, want.transpose(0, 3, 1, 2), rtol=1e-4, atol=1e-4)


def test_conv_transpose_gradients_and_bfloat16():
    x = mg.Input((2, 3, 4, 2))
    g = mg.Graph(x, ops.ConvTranspose(3, 3, strides=2, padding="SAME")(x))
    grads_ok(lambda x: ops.ConvTranspose(3, 3, strides=2, padding="SAME")(x), rand(2, 3, 4, 2))
    y32, _ = run(g, rand(2, 3, 4, 2))
    y16, _ = run(g, rand(2, 3, 4, 2), policy=mg.Policy(compute_dtype="bfloat16"))
    assert y16.dtype == BF16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=0.05, atol=0.05)


# --- Upsample and resize: PyTorch's align_corners=False ------------------------------


def torch_linear_1d(x, n_out, axis):
    """``F.interpolate(mode="linear", align_corners=False)`` along ``axis``, by its
    formula: ``src = max((dst + 0.5) * in / out - 0.5, 0)``, neighbours ``floor(src)``
    and the next (clamped), weights by the distance."""
    n_in = x.shape[axis]
    x = np.moveaxis(np.asarray(x, np.float64), axis, 0)
    y = np.zeros((n_out,) + x.shape[1:])
    for dst in range(n_out):
        src = max((dst + 0.5) * n_in / n_out - 0.5, 0.0)
        i0 = min(int(np.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        lam = src - i0
        y[dst] = (1 - lam) * x[i0] + lam * x[i1]
    return np.moveaxis(y, 0, axis)


def torch_nearest_1d(x, n_out, axis):
    n_in = x.shape[axis]
    idx = [min(int(np.floor(d * n_in / n_out)), n_in - 1) for d in range(n_out)]
    return np.take(np.asarray(x, np.float64), idx, axis=axis)


@pytest.mark.parametrize("method", ["nearest", "bilinear"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_upsample_and_resize_match_pytorch_formulas(method, data_format):
    x = rand(2, 3, 5, 4) if data_format == "NHWC" else rand(2, 4, 3, 5)
    axes = (1, 2) if data_format == "NHWC" else (2, 3)
    inp = mg.Input(x.shape)
    up = ops.Upsample((2, 3), method=method, data_format=data_format)(inp)
    shrink = ops.resize(inp, (2, 7), method, data_format=data_format)
    g = mg.Graph(inp, [up, shrink])
    (y_up, y_resize), _ = run(g, x)
    one = torch_linear_1d if method == "bilinear" else torch_nearest_1d
    want = one(one(x, x.shape[axes[0]] * 2, axes[0]), x.shape[axes[1]] * 3, axes[1])
    np.testing.assert_allclose(y_up, want, rtol=1e-5, atol=1e-5)
    want = one(one(x, 2, axes[0]), 7, axes[1])
    np.testing.assert_allclose(y_resize, want, rtol=1e-5, atol=1e-5)


def test_upsample_int_scale_gradients_and_bfloat16():
    x = mg.Input((1, 3, 2, 2))
    g = mg.Graph(x, ops.Upsample(2, method="bilinear")(x) * 2.0)
    grads_ok(lambda x: ops.Upsample(2, method="bilinear")(x) * 2.0, rand(1, 3, 2, 2))
    y16, _ = run(g, rand(1, 3, 2, 2), policy=mg.Policy(compute_dtype="bfloat16"))
    y32, _ = run(g, rand(1, 3, 2, 2))
    assert y16.dtype == BF16 and y32.shape == (1, 6, 4, 2)
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=0.02, atol=0.02)


# --- pooling over channel-first data ---------------------------------------------------


def test_pools_with_nchw_equal_nhwc_on_transposed_data():
    x = rand(2, 3, 6, 7)  # NCHW
    inp = mg.Input(x.shape)
    outs = [ops.MaxPool((2, 3), data_format="NCHW")(inp),
            ops.AvgPool((3, 3), strides=2, padding="SAME", count_include_pad=False,
                        data_format="NCHW")(inp),
            ops.GlobalAvgPool(data_format="NCHW")(inp),
            ops.GlobalMaxPool(data_format="NCHW", keepdims=True)(inp)]
    assert [o.shape[1:] for o in outs] == [(3, 3, 2), (3, 3, 4), (3,), (3, 1, 1)]
    got, _ = run(mg.Graph(inp, outs), x)
    t = mg.Input((2, 6, 7, 3))
    ref = [ops.MaxPool((2, 3))(t), ops.AvgPool((3, 3), strides=2, padding="SAME",
                                              count_include_pad=False)(t),
           ops.GlobalAvgPool()(t), ops.GlobalMaxPool(keepdims=True)(t)]
    want, _ = run(mg.Graph(t, ref), x.transpose(0, 2, 3, 1))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, np.moveaxis(b, -1, 1), rtol=1e-6)
    np.testing.assert_allclose(got[2], x.mean(axis=(2, 3)), rtol=1e-5)


# --- GRU: PyTorch's formula, and files saved before recurrent_bias -------------------


def numpy_gru(x, W, U, b_ih, b_hh):
    """PyTorch's GRU (gate order r, z, n) as a loop of its formula, float64."""
    x, W, U, b_ih, b_hh = (np.asarray(a, np.float64) for a in (x, W, U, b_ih, b_hh))
    h = np.zeros((x.shape[0], U.shape[0]))
    H = U.shape[0]
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    outs = []
    for t in range(x.shape[1]):
        gi, gh = x[:, t] @ W + b_ih, h @ U + b_hh
        r = sig(gi[:, :H] + gh[:, :H])
        z = sig(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1 - z) * n + z * h
        outs.append(h)
    return np.stack(outs, 1), h


def test_gru_is_pytorchs_with_two_biases():
    x = rand(3, 5, 4)
    inp = mg.Input(("batch", 5, 4))
    g = mg.Graph(inp, list(ops.GRU(6, return_state=True, name="gru")(inp)))
    (seq, h), p = run(g, x, params=lambda p: jax.tree.map(lambda a: a + rand(*a.shape, seed=7), p))
    assert set(p["gru"]) == {"input_kernel", "recurrent_kernel", "bias", "recurrent_bias"}
    q = {k: np.asarray(v) for k, v in p["gru"].items()}
    want_seq, want_h = numpy_gru(x, q["input_kernel"], q["recurrent_kernel"], q["bias"], q["recurrent_bias"])
    np.testing.assert_allclose(seq, want_seq, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-5)
    grads_ok(lambda x: ops.GRU(3)(x), rand(2, 5, 4))


def test_a_gru_file_saved_before_recurrent_bias_loads_with_it_zero(tmp_path):
    # Written by the one-bias GRU (weights layout 1), before recurrent_bias existed.
    g, params, state = mg.load(os.path.join(DATA, "gru_saved_before_recurrent_bias.mlg"))
    q = {k: np.asarray(v) for k, v in params["gru"].items()}
    np.testing.assert_array_equal(q["recurrent_bias"], np.zeros(12, np.float32))
    x = rand(2, 5, 3)
    seq, h = mg.compile(g).apply(params, state, x)[0]
    want_seq, want_h = numpy_gru(x, q["input_kernel"], q["recurrent_kernel"], q["bias"], np.zeros(12))
    np.testing.assert_allclose(seq, want_seq, rtol=1e-5, atol=1e-5)
    # Saved again, it is a layout-2 file with the weight in it; one lacking it is refused.
    path = str(tmp_path / "gru.mlg")
    mg.save(path, g, params, state)
    assert mg.load(path)[1]["gru"].keys() == params["gru"].keys()
    del params["gru"]["recurrent_bias"]
    with pytest.raises(mg.SerializationError, match="recurrent_bias"):
        mg.save(path, g, params, state)


# --- attention: grouped-query, causal, key padding, rotary ---------------------------


def rope_numpy(x, base=10000.0):
    """Hugging Face's Llama: ``x * cos + rotate_half(x) * sin`` over (b, len, ..., d)."""
    d = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    freqs = np.arange(x.shape[1])[:, None] * inv[None]
    emb = np.concatenate([freqs, freqs], -1)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 3) + (d,)
    cos, sin = np.cos(emb).reshape(shape), np.sin(emb).reshape(shape)
    half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


def attention_numpy(x, p, heads, kv_heads, causal, key_mask, rope):
    x = np.asarray(x, np.float64)
    P = {k: {n: np.asarray(a, np.float64) for n, a in v.items()} for k, v in p.items()}
    q = np.einsum("bld,dhk->blhk", x, P["query"]["kernel"]) + P["query"]["bias"]
    k = np.einsum("bld,dhk->blhk", x, P["key"]["kernel"]) + P["key"]["bias"]
    v = np.einsum("bld,dhk->blhk", x, P["value"]["kernel"]) + P["value"]["bias"]
    if rope:
        q, k = rope_numpy(q), rope_numpy(k)
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # HF's repeat_kv
    s = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
    allow = np.ones(s.shape, bool)
    if causal:
        allow &= np.tril(np.ones(s.shape[-2:], bool))
    if key_mask is not None:
        allow &= (np.asarray(key_mask) != 0)[:, None, None, :]
    s = np.where(allow, s, -1e30)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("bhqs,bshk->bqhk", w, v)
    return np.einsum("bqhk,hko->bqo", o, P["out"]["kernel"]) + P["out"]["bias"]


@pytest.mark.parametrize("heads,kv_heads,causal,masked,rope", [
    (4, 2, True, True, True), (4, 1, False, True, False), (2, None, True, False, True),
    (6, 3, False, False, False)])
def test_attention_gqa_causal_key_padding_rope(heads, kv_heads, causal, masked, rope):
    x = rand(2, 5, 12)
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    inp = mg.Input(("batch", "seq", 12))
    mask_in = mg.Input(("batch", "seq"), "int32")
    mha = ops.MultiHeadAttention(heads, 4, causal=causal, num_kv_heads=kv_heads, rope=rope, name="attn")
    y_sym = mha(inp, mask=mask_in) if masked else mha(inp)
    g = mg.Graph([inp, mask_in] if masked else inp, y_sym)
    args = (x, key_mask) if masked else (x,)
    y, p = run(g, *args, params=lambda p: jax.tree.map(lambda a: a + 0.3 * rand(*a.shape, seed=9), p))
    assert p["attn"]["key"]["kernel"].shape == (12, kv_heads or heads, 4)
    want = attention_numpy(x, p["attn"], heads, kv_heads or heads, causal, key_mask if masked else None, rope)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_attention_boolean_key_padding_dropout_and_gradients():
    x = rand(2, 4, 8)
    inp, mask = mg.Input(("batch", 4, 8)), mg.Input(("batch", 4), "bool")
    g = mg.Graph([inp, mask], ops.MultiHeadAttention(2, 4, dropout=0.5, num_kv_heads=1,
                                                     rope=True, name="attn")(inp, mask=mask))
    model = mg.compile(g)
    p, s = model.init(jax.random.key(0))
    m = np.array([[True, True, False, False], [True] * 4])
    a, _ = model.apply(p, s, x, m, inference_mode=True)
    b, _ = model.apply(p, s, x, m, rng=jax.random.key(1))
    c, _ = model.apply(p, s, x, m, rng=jax.random.key(2))
    assert not np.allclose(a, b) and not np.allclose(b, c)
    with pytest.raises(mg.GraphError, match="rng"):
        model.apply(p, s, x, m)
    # dropout off (inference) equals the reference with the int form of the mask
    want = attention_numpy(x, p["attn"], 2, 1, False, m.astype(int), True)
    np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-4)
    grads_ok(lambda x: ops.MultiHeadAttention(4, 2, num_kv_heads=2, causal=True, rope=True)(x),
             rand(2, 4, 8))


def test_rotary_embedding_op_matches_llama_and_takes_positions():
    x = rand(2, 6, 3, 8)
    inp, pos = mg.Input(("batch", 6, 3, 8)), mg.Input(("batch", 6), "int32")
    g = mg.Graph([inp, pos], [ops.rotary_embedding(inp), ops.rotary_embedding(inp, pos, base=500.0)])
    positions = np.array([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]], np.int32)
    (a, b), _ = run(g, x, positions)
    np.testing.assert_allclose(a, rope_numpy(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b[0], rope_numpy(x, 500.0)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b[1], rope_numpy(x[1:, ::-1], 500.0)[0, ::-1], rtol=1e-5, atol=1e-5)
    y16, _ = run(mg.Graph(inp, ops.rotary_embedding(inp)), x, policy=mg.Policy(compute_dtype="bfloat16"))
    assert y16.dtype == BF16
    np.testing.assert_allclose(np.asarray(y16, np.float32), rope_numpy(x), rtol=0.03, atol=0.03)


# --- operators, arange, broadcast_to, Param, attend, small ops ------------------------


def test_operators_are_nodes_and_compute_numpys():
    a_np, b_np = rand(3, 4), rand(3, 4, seed=1)
    a, b = mg.Input(("batch", 4)), mg.Input(("batch", 4))
    w = mg.Input((4, 2))
    outs = [a + b, a - 1.5, 2.0 * a, a / (b * b + 1.0), 1.0 / (a * a + 1.0), -a, a ** 2, a ** 3,
            abs_like := ops.where(a > 0.0, a, -a), a @ w, a[:, 0], a[..., 1:3], a[:, None, ::2],
            ops.Maximum()(a, b), a < b, a >= 0.5, 3.0 - a, ops.mean(a, axis=1), ops.sum(a),
            ops.max(a, axis=0, keepdims=True), ops.squeeze(ops.expand_dims(a, 1), 1),
            ops.pad(a, ((0, 0), (1, 2)), value=-1.0), ops.identity(a), ops.equal(a, a),
            ops.pad(a, ((0, 0), (2, 1)), mode="reflect")]
    assert abs_like.dtype == np.float32
    g = mg.Graph([a, b, w], outs)
    ops_in_graph = {n.op.op_name for n in g.nodes}
    assert {"add", "sub", "mul", "div", "neg", "pow", "where", "matmul", "getitem", "less",
            "greater_equal"} <= ops_in_graph
    w_np = rand(4, 2, seed=2)
    got, _ = run(g, a_np, b_np, w_np)
    want = [a_np + b_np, a_np - 1.5, 2 * a_np, a_np / (b_np * b_np + 1), 1 / (a_np * a_np + 1), -a_np,
            a_np ** 2, a_np ** 3, np.abs(a_np), a_np @ w_np, a_np[:, 0], a_np[..., 1:3],
            a_np[:, None, ::2], np.maximum(a_np, b_np), a_np < b_np, a_np >= 0.5, 3 - a_np,
            a_np.mean(1), a_np.sum(), a_np.max(0, keepdims=True), a_np,
            np.pad(a_np, ((0, 0), (1, 2)), constant_values=-1), a_np, np.ones((3, 4), bool),
            np.pad(a_np, ((0, 0), (2, 1)), mode="reflect")]
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.shape == y.shape, i
        np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=1e-5, atol=1e-5, err_msg=str(i))
    grads_ok(lambda a, b: [a * b / (b * b + 1.0) - a ** 2, (a @ ops.transpose(b, (1, 0)))[:, 1:]],
             a_np, b_np)


def test_python_scalars_stay_weakly_typed():
    x = mg.Input(("batch", 4), "bfloat16")
    for y in (x * 2.0, 2.0 + x, x / 3.0, x ** 2, -x, x - 1):
        assert y.dtype == BF16
    assert (x > 0.0).dtype == np.dtype(bool)
    i = mg.Input(("batch", 4), "int32")
    assert (i * 2).dtype == np.int32
    with pytest.raises(mg.DTypeError, match="promote"):
        i * 2.0
    out, _ = run(mg.Graph(x, x * 2.0 + 1.0), np.ones((2, 4), BF16))
    assert out.dtype == BF16 and np.all(np.asarray(out, np.float32) == 3.0)


def test_arange_broadcast_to_param_and_tied_head():
    tokens = mg.Input(("batch", "seq"), "int32", name="tokens")
    emb = ops.Embedding(11, 6, name="wte")
    pos = ops.Embedding(9, 6, name="wpe")
    h = emb(tokens) + pos(ops.arange(tokens.shape[1]))
    cls = ops.broadcast_to(ops.Param((1, 1, 6), name="cls")(), (tokens.shape[0], 1, 6))
    h = ops.concat([cls, h], axis=1)
    logits = emb.attend(h)
    assert logits.shape[2] == 11
    g = mg.Graph(tokens, [logits, ops.arange(tokens.shape[1])])
    ids = np.array([[1, 2, 3], [4, 5, 10]], np.int32)
    (out, positions), p = run(g, ids)
    assert set(p) == {"wte", "wpe", "cls"} and p["cls"]["value"].shape == (1, 1, 6)
    np.testing.assert_array_equal(positions, [0, 1, 2])
    table, ptable = np.asarray(p["wte"]["embedding"]), np.asarray(p["wpe"]["embedding"])
    hh = np.concatenate([np.broadcast_to(np.asarray(p["cls"]["value"]), (2, 1, 6)),
                         table[ids] + ptable[:3]], 1)
    np.testing.assert_allclose(out, hh @ table.T, rtol=1e-5, atol=1e-5)
    # the same graph at another length: arange follows the input
    (out5, pos5), _ = run(g, np.zeros((1, 5), np.int32))
    assert out5.shape == (1, 6, 11) and pos5.tolist() == [0, 1, 2, 3, 4]
    # the tied head's gradient reaches the one table from both uses
    model = mg.compile(g)
    p, s = model.init(jax.random.key(0))
    grad = jax.grad(lambda p: jnp.sum(model.apply(p, s, ids)[0][0] ** 2))(p)
    assert np.abs(np.asarray(grad["wte"]["embedding"])).sum() > 0


def test_linear_and_conv_activation_and_layer_norm_options():
    x = mg.Input(("batch", 5, 5, 2))
    outs = [ops.Linear(3, activation="relu", name="fc")(x),
            ops.Conv(3, 3, padding="SAME", activation=ops.silu, name="conv")(x),
            ops.LayerNorm(use_bias=False, use_scale=False)(x)]
    assert outs[1].shape[1:] == (5, 5, 3)
    xs = rand(2, 5, 5, 2)
    (lin, conv, ln), p = run(mg.Graph(x, outs), xs)
    pre = xs @ np.asarray(p["fc"]["kernel"]) + np.asarray(p["fc"]["bias"])
    np.testing.assert_allclose(lin, np.maximum(pre, 0), rtol=1e-5, atol=1e-6)
    assert conv.min() > -0.3  # silu's minimum is about -0.28
    want = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln, want, rtol=1e-4, atol=1e-4)


def test_sequential_is_a_graph():
    g = mg.Sequential([mg.Input(("batch", 4), name="x"), ops.Linear(8), ops.relu,
                       lambda h: h * 2.0, ops.Linear(2, name="out")], name="seq")
    assert isinstance(g, mg.Graph) and g.name == "seq" and g.output_specs[0].shape[1] == 2
    with pytest.raises(mg.GraphError, match="first entry"):
        mg.Sequential([ops.Linear(2)])
    with pytest.raises(mg.GraphError, match="entry 1"):
        mg.Sequential([mg.Input((2, 3)), 5])


def test_new_ops_round_trip_through_json_and_files(tmp_path):
    tokens = mg.Input(("batch", "seq"), "int32")
    emb = ops.Embedding(7, 8)
    h = emb(tokens) + ops.Param((8,))()
    h = ops.MultiHeadAttention(2, 4, causal=True, num_kv_heads=1, rope=True)(h, mask=tokens)
    img = mg.Input(("batch", 4, 4, 3))
    u = ops.Upsample(2, method="bilinear")(ops.ConvTranspose(2, 2, strides=2)(img))
    u = ops.resize(ops.MaxPool((2, 2), data_format="NCHW")(ops.transpose(u, (0, 3, 1, 2))), (3, 3),
                   data_format="NCHW")
    g = mg.Graph([tokens, img], [emb.attend(h)[:, -1], ops.where(u > 0.0, u, 0.0) ** 2,
                                 ops.broadcast_to(ops.arange(tokens.shape[1]), (tokens.shape[0], tokens.shape[1]))])
    assert mg.Graph.from_json(g.to_json()) == g
    model = mg.compile(g)
    p, s = model.init(jax.random.key(0))
    path = str(tmp_path / "m.mlg")
    mg.save(path, g, p, s)
    g2, p2, s2 = mg.load(path)
    ids, im = np.array([[1, 2, 0]], np.int32), rand(1, 4, 4, 3)
    a = model.apply(p, s, ids, im)[0]
    b = mg.compile(g2).apply(p2, s2, ids, im)[0]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    nx = g.to_networkx()
    assert mg.Graph.from_networkx(nx) == g
    assert "conv_transpose" in g.to_dot()
