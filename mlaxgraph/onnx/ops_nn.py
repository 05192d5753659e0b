"""The ``onnx`` family's network operators: softmax, convolution, pooling,
normalization, attention and the losses."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.flops import size
from ..ops.pooling import ceil_mode_extra, window_max, window_mean, window_sum
from .dtypes import int64, to_dtype
from .layer import define


def _softmax(fn):
    def run(a, x):
        if a.opset < 13:
            axis = a.get("axis", 1) % max(x.ndim, 1)
            flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
            return fn(flat, axis=-1).reshape(x.shape)
        return fn(x, axis=a.get("axis", -1))
    return run


define("Softmax", dtypes="float")(_softmax(jax.nn.softmax))
define("LogSoftmax", dtypes="float")(_softmax(jax.nn.log_softmax))


# --- convolution and pooling -----------------------------------------------------------

def _padding(a, spatial, kernel, strides, dilations):
    pad = a.get("auto_pad", "NOTSET")
    if pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for n, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            low = total // 2 if pad == "SAME_UPPER" else total - total // 2
            out.append((low, total - low))
        return out
    if pad == "VALID":
        return [(0, 0)] * len(spatial)
    pads = a.get("pads") or (0,) * (2 * len(spatial))
    half = len(pads) // 2
    return [(int(pads[i]), int(pads[i + half])) for i in range(half)]


def _conv_flops(inputs, outputs, a):
    w = inputs[1]
    per_output = 2 * size(w) // w.shape[0]
    return per_output * size(outputs[0])


@define("Conv", dtypes="float", flops=_conv_flops)
def _conv(a, x, w, b=None):
    nd = x.ndim - 2
    kernel = tuple(w.shape[2:])
    strides = tuple(a.get("strides") or (1,) * nd)
    dilations = tuple(a.get("dilations") or (1,) * nd)
    pads = _padding(a, x.shape[2:], kernel, strides, dilations)
    out = lax.conv_general_dilated(x, w.astype(x.dtype), strides, pads, rhs_dilation=dilations,
                                   feature_group_count=a.get("group", 1),
                                   precision=lax.Precision.HIGHEST)
    if b is not None:
        out = out + b.reshape((1, -1) + (1,) * nd).astype(x.dtype)
    return out


@define("ConvTranspose", dtypes="float", flops="input")
def _conv_transpose(a, x, w, b=None):
    nd = x.ndim - 2
    group = a.get("group", 1)
    kernel = tuple(w.shape[2:])
    strides = tuple(a.get("strides") or (1,) * nd)
    dilations = tuple(a.get("dilations") or (1,) * nd)
    extra = tuple(a.get("output_padding") or (0,) * nd)
    spatial = x.shape[2:]
    if a.get("output_shape") is not None:
        target = tuple(a["output_shape"])[-nd:]
        totals = [s * (n - 1) + e + (k - 1) * d + 1 - t for n, k, s, d, e, t in
                  zip(spatial, kernel, strides, dilations, extra, target)]
        upper = a.get("auto_pad", "NOTSET") == "SAME_UPPER"
        pads = [(t - t // 2, t // 2) if not upper else (t // 2, t - t // 2) for t in totals]
    elif a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        totals = [s * (n - 1) + e + (k - 1) * d + 1 - n * s for n, k, s, d, e in
                  zip(spatial, kernel, strides, dilations, extra)]
        upper = a["auto_pad"] == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    else:
        p = a.get("pads") or (0,) * (2 * nd)
        pads = [(int(p[i]), int(p[i + nd])) for i in range(nd)]
    # (C_in, C_out/group, k...) -> a forward conv's (C_out, C_in/group, k...), flipped
    cin = w.shape[0]
    wg = w.reshape((group, cin // group, w.shape[1]) + kernel)
    wg = jnp.swapaxes(wg, 1, 2).reshape((group * w.shape[1], cin // group) + kernel)
    wg = jnp.flip(wg, axis=tuple(range(2, 2 + nd)))
    conv_pads = [((k - 1) * d - lo, (k - 1) * d - hi + e) for (lo, hi), k, d, e in
                 zip(pads, kernel, dilations, extra)]
    out = lax.conv_general_dilated(x, wg.astype(x.dtype), (1,) * nd, conv_pads,
                                   lhs_dilation=strides, rhs_dilation=dilations,
                                   feature_group_count=group, precision=lax.Precision.HIGHEST)
    if b is not None:
        out = out + b.reshape((1, -1) + (1,) * nd).astype(x.dtype)
    return out


def _pool(a, x, op, average=False, p=None):
    nd = x.ndim - 2
    kernel = tuple(a["kernel_shape"])
    strides = tuple(a.get("strides") or (1,) * nd)
    dilations = tuple(a.get("dilations") or (1,) * nd)
    explicit = pads = _padding(a, x.shape[2:], kernel, strides, dilations)
    if a.get("ceil_mode", 0):
        pads = [(lo, hi + ceil_mode_extra(n, lo, hi, k, s, d))
                for (lo, hi), n, k, s, d in zip(pads, x.shape[2:], kernel, strides, dilations)]
    if op is lax.max:
        return window_max(x, kernel, strides, pads, range(2, 2 + nd), dilations)
    if average:  # the taps each window counts: with count_include_pad the explicit
        # padding, the room ceil_mode adds never
        include = bool(a.get("count_include_pad", 0))
        return window_mean(x, kernel, strides, pads, range(2, 2 + nd), dilations,
                           counted=explicit if include else None).astype(x.dtype)
    y = x if p is None else jnp.abs(x) ** p
    out = window_sum(y, kernel, strides, pads, range(2, 2 + nd), dilations)
    return out if p is None else (out ** (1.0 / p)).astype(x.dtype)


def _pool_flops(inputs, outputs, a):
    return size(outputs[0]) * int(np.prod(a["kernel_shape"]))


@define("MaxPool", flops=_pool_flops)
def _max_pool(a, x):
    out = _pool(a, x, lax.max)  # window_max pads with the dtype's lowest value
    if a.outputs > 1:
        return out, _max_pool_indices(a, x, out)
    return out


def _max_pool_indices(a, x, out):
    """The flat index (into ``x``, padding not counted) of each window's first maximum:
    a reduction of (value, index) pairs; ``storage_order=1`` numbers the spatial dims
    column-major."""
    nd = x.ndim - 2
    kernel = tuple(a["kernel_shape"])
    strides = tuple(a.get("strides") or (1,) * nd)
    dilations = tuple(a.get("dilations") or (1,) * nd)
    pads = _padding(a, x.shape[2:], kernel, strides, dilations)
    index = jnp.arange(int(np.prod(x.shape)), dtype=jnp.int32).reshape(x.shape)
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min

    def pick(left, right):
        (lv, li), (rv, ri) = left, right
        take = (rv > lv) | ((rv == lv) & (ri < li))
        return jnp.where(take, rv, lv), jnp.where(take, ri, li)

    _, found = lax.reduce_window((x, index), (jnp.asarray(low, x.dtype), jnp.int32(2 ** 31 - 1)),
                                 pick, (1, 1) + kernel, (1, 1) + strides,
                                 [(0, 0), (0, 0)] + pads, window_dilation=(1, 1) + dilations)
    if a.get("storage_order", 0) and nd == 2:
        h, w = x.shape[2:]
        plane, rest = found // (h * w), found % (h * w)
        found = plane * h * w + (rest % w) * h + rest // w
    return found.astype(int64())


@define("AveragePool", flops=_pool_flops)
def _average_pool(a, x):
    return _pool(a, x, lax.add, average=True)


@define("LpPool", flops=_pool_flops)
def _lp_pool(a, x):
    return _pool(a, x, lax.add, p=a.get("p", 2))


define("GlobalAveragePool", flops="input")(
    lambda a, x: jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True))
define("GlobalMaxPool", flops="input")(
    lambda a, x: jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True))


# --- normalization -------------------------------------------------------------------

def _norm_flops(inputs, outputs, a):
    return 8 * size(inputs[0])


@define("BatchNormalization", dtypes="float", flops=_norm_flops)
def _batch_norm(a, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = a.get("epsilon", 1e-5)
    if a.get("training_mode", 0):
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean, batch_var = jnp.mean(x, axis=axes), jnp.var(x, axis=axes)
        y = (x - batch_mean.reshape(shape)) / jnp.sqrt(batch_var.reshape(shape) + eps)
        y = (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)
        momentum = a.get("momentum", 0.9)
        return (y, (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype),
                (var * momentum + batch_var * (1 - momentum)).astype(var.dtype))
    y = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


def _normalize(x, axes, eps):
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    return (xf - mean) * lax.rsqrt(var + eps), mean, lax.rsqrt(var + eps)


@define("LayerNormalization", dtypes="float", flops=_norm_flops)
def _layer_norm(a, x, scale, bias=None):
    axis = a.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    y, mean, inv = _normalize(x, axes, a.get("epsilon", 1e-5))
    y = y * scale
    if bias is not None:
        y = y + bias
    out = (y.astype(x.dtype),)
    if a.outputs > 1:
        stash = jnp.promote_types(x.dtype, jnp.float32)
        out += (mean.astype(stash), inv.astype(stash))
    return out


@define("RMSNormalization", dtypes="float", flops=_norm_flops)
def _rms_norm(a, x, scale):
    axis = a.get("axis", -1) % x.ndim
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    ms = jnp.mean(jnp.square(xf), axis=tuple(range(axis, x.ndim)), keepdims=True)
    return (xf * lax.rsqrt(ms + a.get("epsilon", 1e-5)) * scale).astype(x.dtype)


@define("InstanceNormalization", dtypes="float", flops=_norm_flops)
def _instance_norm(a, x, scale, bias):
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), a.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@define("GroupNormalization", dtypes="float", flops=_norm_flops)
def _group_norm(a, x, scale, bias):
    groups = a["num_groups"]
    g = x.reshape((x.shape[0], groups, -1))
    y, _, _ = _normalize(g, (2,), a.get("epsilon", 1e-5))
    y = y.reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if scale.shape[0] != x.shape[1]:
        scale, bias = jnp.repeat(scale, x.shape[1] // groups), jnp.repeat(bias, x.shape[1] // groups)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@define("LpNormalization", dtypes="float", flops=_norm_flops)
def _lp_norm(a, x):
    axis, p = a.get("axis", -1), a.get("p", 2)
    norm = jnp.sum(jnp.abs(x) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    return jnp.where(norm == 0, 0, x / norm).astype(x.dtype)


@define("MeanVarianceNormalization", dtypes="float", flops=_norm_flops)
def _mvn(a, x):
    axes = tuple(a.get("axes") or (0, 2, 3))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True))
    return ((x - mean) / (std + 1e-9)).astype(x.dtype)


@define("LRN", dtypes="float", flops=_norm_flops)
def _lrn(a, x):
    n = a["size"]
    sq = jnp.pad(jnp.square(x), [(0, 0), ((n - 1) // 2, n - 1 - (n - 1) // 2)]
                 + [(0, 0)] * (x.ndim - 2))
    total = sum(sq[:, i:i + x.shape[1]] for i in range(n))
    scale = (a.get("bias", 1.0) + a.get("alpha", 1e-4) / n * total) ** a.get("beta", 0.75)
    return (x / scale).astype(x.dtype)


# --- losses ------------------------------------------------------------------------------

def _nll(a, logp, target, weight=None):
    ignore = a.get("ignore_index")
    c = logp.shape[1]
    t = target if ignore is None else jnp.where(target == ignore, 0, target)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(t, 1).astype(jnp.int32), axis=1)[:, 0]
    w = jnp.ones_like(picked) if weight is None else weight[t].astype(logp.dtype)
    if ignore is not None:
        w = jnp.where(target == ignore, 0, w)
    loss = -picked * w
    reduction = a.get("reduction", "mean")
    del c
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.sum(loss) / jnp.sum(w)


define("NegativeLogLikelihoodLoss")(lambda a, x, t, w=None: _nll(a, x, t, w).astype(x.dtype))


@define("SoftmaxCrossEntropyLoss")
def _softmax_ce(a, x, t, w=None):
    logp = jax.nn.log_softmax(x, axis=1)
    loss = _nll(a, logp, t, w).astype(x.dtype)
    return (loss, logp) if a.outputs > 1 else loss


# --- attention ---------------------------------------------------------------------------

def _attention_flops(inputs, outputs, a):
    q, k = inputs[0], inputs[1]
    return 4 * size(q) * k.shape[-2] if q.rank == 4 else 4 * size(q) * k.shape[1]


@define("Attention", dtypes="float", flops=_attention_flops)
def _attention(a, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None, *rest):
    three_d = q.ndim == 3
    if three_d:
        split = [(q, a["q_num_heads"]), (k, a["kv_num_heads"]), (v, a["kv_num_heads"])]
        q, k, v = (t.reshape(t.shape[0], t.shape[1], h, -1).transpose(0, 2, 1, 3) for t, h in split)
    offset: Any = 0
    if past_key is not None:
        offset = past_key.shape[2]
        k = jnp.concatenate([past_key, k], axis=2)
        v = jnp.concatenate([past_value, v], axis=2)
    present_k, present_v = k, v
    lq, lk = q.shape[2], k.shape[2]
    if nonpad is not None and past_key is None:
        offset = nonpad.reshape(-1, 1, 1, 1) - lq
    dtype = q.dtype
    scale = a.get("scale")
    scale = math.sqrt(1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    groups = q.shape[1] // k.shape[1]
    kr, vr = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
    qk = jnp.einsum("bhqd,bhkd->bhqk", q * jnp.asarray(scale, dtype), kr * jnp.asarray(scale, dtype),
                    precision=lax.Precision.HIGHEST)
    cap = a.get("softcap")
    if cap:
        qk = (cap * jnp.tanh(qk / cap)).astype(dtype)
    neg = jnp.asarray(-jnp.inf, dtype)
    bias = jnp.zeros((lq, lk), dtype)
    if mask is not None:
        if mask.shape[-1] < lk:
            fill = False if mask.dtype == jnp.bool_ else -jnp.inf
            mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, lk - mask.shape[-1])],
                           constant_values=fill)
        bias = bias + (jnp.where(mask, jnp.asarray(0, dtype), neg) if mask.dtype == jnp.bool_
                       else mask.astype(dtype))
    rows = jnp.arange(lq)[:, None]
    cols = jnp.arange(lk)[None, :]
    if a.get("is_causal", 0):
        bias = bias + jnp.where(cols <= rows + offset, jnp.asarray(0, dtype), neg)
    left, right = a.get("left_window_size", -1), a.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        diff = rows + offset - cols
        allowed = jnp.ones(jnp.shape(diff), bool)
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        bias = bias + jnp.where(allowed, jnp.asarray(0, dtype), neg)
    if nonpad is not None:
        keep = jnp.arange(lk)[None, :] < nonpad.reshape(-1, 1)
        bias = bias + jnp.where(keep, 0, -jnp.inf).astype(dtype).reshape(-1, 1, 1, lk)
    with_bias = qk + bias
    mode = a.get("qk_matmul_output_mode", 0)
    extra = with_bias if mode == 2 else qk
    precision = a.get("softmax_precision")
    logits = with_bias.astype(to_dtype(precision)) if precision else with_bias
    dead = jnp.isneginf(jnp.max(jnp.broadcast_to(bias, with_bias.shape), axis=-1, keepdims=True))
    top = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - jnp.where(jnp.isneginf(top), 0, top))
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = jnp.where(dead, 0, e / jnp.where(total == 0, 1, total))
    if mode == 3:
        extra = probs
    out = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(dtype), vr,
                     precision=lax.Precision.HIGHEST).astype(dtype)
    if three_d:
        out = out.transpose(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
    return out, present_k, present_v, extra.astype(dtype)
