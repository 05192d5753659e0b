"""Independent float64 NumPy reference for four Hugging Face transformer architectures:
GPT-2 (``GPT2LMHeadModel``), BERT (``BertModel``), ViT (``ViTModel``) and Llama
(``LlamaForCausalLM``), all in eval mode (no dropout).

Configs are plain dicts of Hugging Face config fields (as ``config.to_dict()`` gives).
``state_dict`` makes random float32 parameters under the original Hugging Face names and
PyTorch layouts (``nn.Linear`` weights are ``(out, in)``, GPT-2 ``Conv1D`` weights are
``(in, out)``, conv kernels are ``(out, in, kh, kw)``); ``forward`` reads such a state
dict and computes in float64. The formulas follow the original modeling code."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["gpt2_config", "bert_config", "vit_config", "llama_config", "state_dict",
           "forward"]


# --- configs -------------------------------------------------------------------------


def gpt2_config(**overrides):
    return dict(dict(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
                     activation_function="gelu_new", n_inner=None), **overrides)


def bert_config(**overrides):
    return dict(dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     hidden_act="gelu", max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12),
                **overrides)


def vit_config(**overrides):
    return dict(dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, hidden_act="gelu", layer_norm_eps=1e-12,
                     qkv_bias=True), **overrides)


def llama_config(**overrides):
    return dict(dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32,
                     hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False), **overrides)


# --- building blocks -----------------------------------------------------------------


def _f64(x):
    return np.asarray(x, np.float64)


def layer_norm(x, sd, prefix, eps):
    """(x - mean) / sqrt(biased var + eps) * weight + bias over the last axis."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * sd[prefix + ".weight"] + sd[prefix + ".bias"]


def rms_norm(x, sd, prefix, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (no mean, no bias)."""
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * sd[prefix + ".weight"]


def gelu(x):
    """Exact GELU: x * Phi(x) with the erf form of the normal CDF."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)))


def gelu_tanh(x):
    """GELU tanh approximation ("gelu_new" / "gelu_pytorch_tanh")."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_ACTS = {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh,
         "relu": lambda x: np.maximum(x, 0.0), "silu": lambda x: x / (1.0 + np.exp(-x))}
_ACTS["swish"] = _ACTS["silu"]


def activation(name):
    if name not in _ACTS:
        raise NotImplementedError(f"activation {name!r}")
    return _ACTS[name]


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def linear(x, sd, prefix):
    """torch ``nn.Linear``: x @ W.T + b with W stored (out, in); bias optional."""
    y = x @ sd[prefix + ".weight"].T
    return y + sd[prefix + ".bias"] if prefix + ".bias" in sd else y


def conv1d(x, sd, prefix):
    """GPT-2 ``Conv1D``: x @ W + b with W stored (in, out)."""
    return x @ sd[prefix + ".weight"] + sd[prefix + ".bias"]


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, theta):
    """Rotary embedding of x (..., L, hd): x*cos + rotate_half(x)*sin, with angles
    pos * inv_freq, inv_freq = 1 / theta**(arange(0, hd, 2)/hd), duplicated over halves."""
    hd = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)                         # (L, hd)
    return x * np.cos(ang) + rotate_half(x) * np.sin(ang)


def attention(q, k, v, *, causal=False, key_mask=None, scale=None):
    """Scaled dot-product attention over heads.

    q: (B, H, Lq, hd); k, v: (B, Hkv, Lk, hd) with H a multiple of Hkv (query head h uses
    kv head h // (H // Hkv)). ``key_mask`` (B, Lk) of 1/0 adds the most negative float to
    the scores of keys marked 0; ``causal`` keeps keys j <= i only. Returns (B, H, Lq, hd)."""
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    neg = np.finfo(np.float64).min
    if key_mask is not None:
        s = s + (1.0 - _f64(key_mask))[:, None, None, :] * neg
    if causal:
        lq, lk = s.shape[-2:]
        allowed = np.tril(np.ones((lq, lk), bool), k=lk - lq)
        s = np.where(allowed, s, neg)
    return softmax(s) @ v


def split_heads(x, n):
    """(B, L, n*hd) -> (B, n, L, hd)."""
    b, t, d = x.shape
    return x.reshape(b, t, n, d // n).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, n, L, hd) -> (B, L, n*hd)."""
    b, n, t, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, n * hd)


# --- state dicts ---------------------------------------------------------------------


def _add(p, name, weight_shape, bias_len=None):
    p[name + ".weight"] = tuple(weight_shape)
    if bias_len:
        p[name + ".bias"] = (bias_len,)


def _gpt2_shapes(c, p):
    d, inner = c["n_embd"], c.get("n_inner") or 4 * c["n_embd"]
    p["wte.weight"], p["wpe.weight"] = (c["vocab_size"], d), (c["n_positions"], d)
    for i in range(c["n_layer"]):                   # Conv1D weights are (in, out)
        for name, shape in (("ln_1", (d,)), ("attn.c_attn", (d, 3 * d)),
                            ("attn.c_proj", (d, d)), ("ln_2", (d,)),
                            ("mlp.c_fc", (d, inner)), ("mlp.c_proj", (inner, d))):
            _add(p, f"h.{i}.{name}", shape, shape[-1])
    _add(p, "ln_f", (d,), d)


def _encoder_shapes(c, p, vit):
    d, inter = c["hidden_size"], c["intermediate_size"]
    if vit:
        n, k = (c["image_size"] // c["patch_size"]) ** 2, c["patch_size"]
        p["embeddings.cls_token"], p["embeddings.position_embeddings"] = (1, 1, d), (1, n + 1, d)
        _add(p, "embeddings.patch_embeddings.projection", (d, c["num_channels"], k, k), d)
    else:
        for name, rows in (("word", "vocab_size"), ("position", "max_position_embeddings"),
                           ("token_type", "type_vocab_size")):
            _add(p, f"embeddings.{name}_embeddings", (c[rows], d))
        _add(p, "embeddings.LayerNorm", (d,), d)
    qkv_bias = d if (c.get("qkv_bias", True) or not vit) else None
    for i in range(c["num_hidden_layers"]):
        L = f"encoder.layer.{i}."
        if vit:
            _add(p, L + "layernorm_before", (d,), d)
        for qkv in ("query", "key", "value"):
            _add(p, L + ("attention.attention." if vit else "attention.self.") + qkv,
                 (d, d), qkv_bias)
        _add(p, L + "attention.output.dense", (d, d), d)
        _add(p, L + ("layernorm_after" if vit else "attention.output.LayerNorm"), (d,), d)
        _add(p, L + "intermediate.dense", (inter, d), inter)
        _add(p, L + "output.dense", (d, inter), d)
        if not vit:
            _add(p, L + "output.LayerNorm", (d,), d)
    if vit:
        _add(p, "layernorm", (d,), d)
    _add(p, "pooler.dense", (d, d), d)


def _llama_shapes(c, p):
    d, inter = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    ab, mb = c.get("attention_bias", False), c.get("mlp_bias", False)
    _add(p, "model.embed_tokens", (c["vocab_size"], d))
    for i in range(c["num_hidden_layers"]):
        L = f"model.layers.{i}."
        _add(p, L + "input_layernorm", (d,))
        for name, out, inp in (("q", nh * hd, d), ("k", nkv * hd, d), ("v", nkv * hd, d),
                               ("o", d, nh * hd)):
            _add(p, L + f"self_attn.{name}_proj", (out, inp), ab and out)
        _add(p, L + "post_attention_layernorm", (d,))
        for name, out, inp in (("gate", inter, d), ("up", inter, d), ("down", d, inter)):
            _add(p, L + f"mlp.{name}_proj", (out, inp), mb and out)
    _add(p, "model.norm", (d,))
    if not c.get("tie_word_embeddings", False):
        _add(p, "lm_head", (c["vocab_size"], d))


_SHAPES = {"gpt2": _gpt2_shapes, "llama": _llama_shapes,
           "bert": lambda c, p: _encoder_shapes(c, p, vit=False),
           "vit": lambda c, p: _encoder_shapes(c, p, vit=True)}


def state_dict(arch, config, seed=0):
    """Random float32 parameters, drawn in name order from ``default_rng(seed)``: norm
    weights 1 + 0.1*N(0,1), biases 0.1*N(0,1), all other tensors 0.2*N(0,1)."""
    if arch not in _SHAPES:
        raise ValueError(f"unknown arch {arch!r}")
    shapes, rng, out = {}, np.random.default_rng(seed), {}
    _SHAPES[arch](config, shapes)
    for name, shape in shapes.items():
        z = rng.standard_normal(shape)
        if name.endswith(".bias"):
            z = 0.1 * z
        elif any(t in name for t in ("ln_", "LayerNorm", "layernorm", "norm.")):
            z = 1.0 + 0.1 * z
        else:
            z = 0.2 * z
        out[name] = z.astype(np.float32)
    return out


# --- forward passes ------------------------------------------------------------------


def _gpt2(sd, c, input_ids):
    ids = np.asarray(input_ids)
    nh, eps, act = c["n_head"], c["layer_norm_epsilon"], activation(c["activation_function"])
    h = sd["wte.weight"][ids] + sd["wpe.weight"][np.arange(ids.shape[1])]
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        x = layer_norm(h, sd, p + "ln_1", eps)
        q, k, v = (split_heads(t, nh) for t in np.split(conv1d(x, sd, p + "attn.c_attn"), 3, -1))
        scale = 1.0 / math.sqrt(q.shape[-1]) if c.get("scale_attn_weights", True) else 1.0
        if c.get("scale_attn_by_inverse_layer_idx", False):
            scale /= i + 1
        h = h + conv1d(merge_heads(attention(q, k, v, causal=True, scale=scale)), sd, p + "attn.c_proj")
        x = layer_norm(h, sd, p + "ln_2", eps)
        h = h + conv1d(act(conv1d(x, sd, p + "mlp.c_fc")), sd, p + "mlp.c_proj")
    return (layer_norm(h, sd, "ln_f", eps) @ sd["wte.weight"].T,)


def _encoder_attention(x, sd, prefix, nh, key_mask=None):
    q, k, v = (split_heads(linear(x, sd, prefix + n), nh) for n in ("query", "key", "value"))
    return merge_heads(attention(q, k, v, key_mask=key_mask))


def _bert(sd, c, input_ids, token_type_ids=None, attention_mask=None):
    ids = np.asarray(input_ids)
    tt = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
    mask = np.ones(ids.shape) if attention_mask is None else _f64(attention_mask)
    nh, eps, act = c["num_attention_heads"], c["layer_norm_eps"], activation(c["hidden_act"])
    h = (sd["embeddings.word_embeddings.weight"][ids]
         + sd["embeddings.token_type_embeddings.weight"][tt]
         + sd["embeddings.position_embeddings.weight"][np.arange(ids.shape[1])])
    h = layer_norm(h, sd, "embeddings.LayerNorm", eps)
    for i in range(c["num_hidden_layers"]):                    # post-LN blocks
        p = f"encoder.layer.{i}."
        a = _encoder_attention(h, sd, p + "attention.self.", nh, mask)
        h = layer_norm(linear(a, sd, p + "attention.output.dense") + h, sd, p + "attention.output.LayerNorm", eps)
        f = linear(act(linear(h, sd, p + "intermediate.dense")), sd, p + "output.dense")
        h = layer_norm(f + h, sd, p + "output.LayerNorm", eps)
    return h, np.tanh(linear(h[:, 0], sd, "pooler.dense"))


def patchify(pixels, p):
    """(B, C, H, W) -> (B, (H/p)*(W/p), C*p*p): row-major patches, each flattened (C, p, p)."""
    b, ch, hh, ww = pixels.shape
    x = pixels.reshape(b, ch, hh // p, p, ww // p, p).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (hh // p) * (ww // p), ch * p * p)


def _vit(sd, c, pixel_values):
    x = _f64(pixel_values)
    nh, eps, act = c["num_attention_heads"], c["layer_norm_eps"], activation(c["hidden_act"])
    w, b = sd["embeddings.patch_embeddings.projection.weight"], sd["embeddings.patch_embeddings.projection.bias"]
    patches = patchify(x, c["patch_size"]) @ w.reshape(w.shape[0], -1).T + b      # conv with w (d, C, p, p)
    cls = np.broadcast_to(sd["embeddings.cls_token"], (x.shape[0], 1, w.shape[0]))
    h = np.concatenate([cls, patches], axis=1) + sd["embeddings.position_embeddings"]
    for i in range(c["num_hidden_layers"]):                    # pre-LN blocks
        p = f"encoder.layer.{i}."
        y = _encoder_attention(layer_norm(h, sd, p + "layernorm_before", eps), sd, p + "attention.attention.", nh)
        h = h + linear(y, sd, p + "attention.output.dense")
        y = layer_norm(h, sd, p + "layernorm_after", eps)
        h = h + linear(act(linear(y, sd, p + "intermediate.dense")), sd, p + "output.dense")
    h = layer_norm(h, sd, "layernorm", eps)
    return h, np.tanh(linear(h[:, 0], sd, "pooler.dense"))


def _rope_theta(c):
    scaling = c.get("rope_scaling") or c.get("rope_parameters") or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise NotImplementedError(f"rope scaling {scaling!r}")
    return float(c.get("rope_theta") or scaling.get("rope_theta") or 10000.0)


def _llama(sd, c, input_ids):
    ids = np.asarray(input_ids)
    nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    eps, act, theta = c["rms_norm_eps"], activation(c["hidden_act"]), _rope_theta(c)
    pos = np.arange(ids.shape[1])
    h = sd["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, sd, p + "input_layernorm", eps)
        q = rope(split_heads(linear(x, sd, p + "self_attn.q_proj"), nh), pos, theta)
        k = rope(split_heads(linear(x, sd, p + "self_attn.k_proj"), nkv), pos, theta)
        v = split_heads(linear(x, sd, p + "self_attn.v_proj"), nkv)
        h = h + linear(merge_heads(attention(q, k, v, causal=True)), sd, p + "self_attn.o_proj")
        x = rms_norm(h, sd, p + "post_attention_layernorm", eps)
        g = act(linear(x, sd, p + "mlp.gate_proj")) * linear(x, sd, p + "mlp.up_proj")
        h = h + linear(g, sd, p + "mlp.down_proj")
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return (rms_norm(h, sd, "model.norm", eps) @ head.T,)


_FORWARDS = {"gpt2": _gpt2, "bert": _bert, "vit": _vit, "llama": _llama}


def forward(arch, sd, config, *inputs):
    """float64 forward pass of ``arch`` from a Hugging Face state dict; returns a tuple:
    gpt2/llama (input_ids,) -> (logits,); bert (input_ids, token_type_ids=None,
    attention_mask=None) -> (last_hidden_state, pooler_output); vit (pixel_values,) ->
    (last_hidden_state, pooler_output)."""
    if arch not in _FORWARDS:
        raise ValueError(f"unknown arch {arch!r}")
    sd = {k: _f64(v) for k, v in sd.items()}
    return tuple(_FORWARDS[arch](sd, config, *inputs))
