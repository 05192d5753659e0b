"""The ``aten`` family's network operators: matrix products, convolution, pooling,
normalization, embedding, attention, dropout (in ATen's signatures)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.flops import size
from ..ops.pooling import ceil_mode_extra, window_max, window_mean, window_sum
from .layer import define


def _matmul_flops(inputs, outputs, args):
    a = inputs[-2] if len(inputs) >= 2 else inputs[0]
    return 2 * size(outputs[0]) * a.shape[-1]

define("aten.mm.default", "aten.bmm.default", "aten.matmul.default", flops=_matmul_flops)(
    lambda a, b: jnp.matmul(a, b, precision="highest"))


@define("aten.addmm.default", flops=_matmul_flops)
def _addmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * jnp.matmul(a, b, precision="highest")


@define("aten.baddbmm.default", flops=_matmul_flops)
def _baddbmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * jnp.matmul(a, b, precision="highest")


@define("aten.linear.default", flops=lambda i, o, a: 2 * size(o[0]) * i[0].shape[-1])
def _linear(x, w, b=None):
    y = jnp.matmul(x, w.T, precision="highest")
    return y if b is None else y + b


# --- convolution, pooling ----------------------------------------------------------------

def _conv_flops(inputs, outputs, args):
    w = inputs[1]
    return 2 * size(outputs[0]) * size(w.shape[1:])


@define("aten.convolution.default", flops=_conv_flops)
def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise NotImplementedError("transposed convolution")
    nd = w.ndim - 2
    y = lax.conv_general_dilated(
        x, w, tuple(stride), [(p, p) for p in padding], rhs_dilation=tuple(dilation),
        feature_group_count=groups, precision="highest",
        dimension_numbers=("NCH", "OIH", "NCH") if nd == 1 else (
            ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW")))
    return y if b is None else y + b.reshape((1, -1) + (1,) * nd)


@define("aten.conv2d.default", "aten.conv1d.default", flops=_conv_flops)
def _conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    nd = w.ndim - 2

    def tup(v):
        return tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd
    if isinstance(padding, str):
        raise NotImplementedError("string padding")
    return _convolution(x, w, b, tup(stride), tup(padding), tup(dilation), False, (0,) * nd, groups)


def _pool_window(x, kernel, stride, padding, nd):
    def tup(v, default):
        v = default if v is None or (isinstance(v, (list, tuple)) and not v) else v
        v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
        return v * nd if len(v) == 1 else v
    k = tup(kernel, 1)
    return k, tup(stride, k), tup(padding, 0)


@define("aten.max_pool2d_with_indices.default", flops="elementwise")
def _max_pool2d_with_indices(x, *args):
    """The pooled values; the indices (read only by the backward pass PyTorch derives
    from them) are not computed: the second output is zeros."""
    y = _max_pool2d(x, *args)
    return y, jnp.zeros(y.shape, jnp.int32)


@define("aten.max_pool2d.default", flops="elementwise")
def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    k, s, p = _pool_window(x, kernel_size, stride, padding, 2)
    d = _pool_window(x, dilation, None, 0, 2)[0]
    pads = [(pi, pi + (ceil_mode_extra(n, pi, pi, ki, si, di) if ceil_mode else 0))
            for n, ki, si, pi, di in zip(x.shape[2:], k, s, p, d)]
    return window_max(x, k, s, pads, (2, 3), d)


@define("aten.avg_pool2d.default", flops="elementwise")
def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    k, s, p = _pool_window(x, kernel_size, stride, padding, 2)
    # ceil_mode: room on the right for a last window starting inside the (padded) input
    pads = [(pi, pi + (ceil_mode_extra(n, pi, pi, ki, si) if ceil_mode else 0))
            for n, ki, si, pi in zip(x.shape[2:], k, s, p)]
    if divisor_override:
        return window_sum(x, k, s, pads, (2, 3)) / divisor_override
    # the taps each window counts: with count_include_pad the padding, not ceil_mode's room
    return window_mean(x, k, s, pads, (2, 3),
                       counted=[(pi, pi) for pi in p] if count_include_pad else None)


@define("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default", flops="input")
def _adaptive_avg_pool2d(x, output_size):
    h, w = x.shape[-2:]
    oh, ow = output_size
    if h % oh or w % ow:
        rows = [x[..., (i * h) // oh: -(-(i + 1) * h // oh), :] for i in range(oh)]
        out = []
        for r in rows:
            out.append(jnp.stack([r[..., (j * w) // ow: -(-(j + 1) * w // ow)].mean((-2, -1))
                                  for j in range(ow)], -1))
        return jnp.stack(out, -2)
    return x.reshape(x.shape[:-2] + (oh, h // oh, ow, w // ow)).mean((-3, -1))


# --- normalization, embedding, attention -----------------------------------------------

@define("aten.layer_norm.default", flops=lambda i, o, a: 8 * size(o[0]))
def _layer_norm(x, shape, w=None, b=None, eps=1e-5, cudnn_enable=True):
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


@define("aten.rms_norm.default", flops=lambda i, o, a: 4 * size(o[0]))
def _rms_norm(x, shape, w=None, eps=None):
    """``nn.RMSNorm``: ``x / sqrt(mean(x**2) + eps) * w`` over the last ``len(shape)``
    axes; ``eps`` None is the dtype's machine epsilon, as PyTorch takes it."""
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    eps = float(jnp.finfo(x.dtype).eps) if eps is None else eps
    y = x * lax.rsqrt(jnp.mean(jnp.square(x), axes, keepdims=True) + eps)
    return y if w is None else y * w


@define("aten.native_layer_norm.default", flops=lambda i, o, a: 8 * size(o[0]))
def _native_layer_norm(x, shape, w, b, eps):
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    rstd = lax.rsqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    y = y if w is None else y * w
    return (y if b is None else y + b), mean, rstd


def _bn(x, w, b, mean, var, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) * lax.rsqrt(var.reshape(shape) + eps)
    y = y if w is None else y * w.reshape(shape)
    return y if b is None else y + b.reshape(shape)


@define("aten._native_batch_norm_legit_no_training.default", flops=lambda i, o, a: 4 * size(o[0]))
def _bn_no_training(x, w, b, mean, var, momentum, eps):
    return _bn(x, w, b, mean, var, eps), jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)


@define("aten.embedding.default", flops="none")
def _embedding(w, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(w, ids, axis=0)


def _sdpa_flops(inputs, outputs, args):
    q, k = inputs[0], inputs[1]
    return 4 * size(q.shape) * k.shape[-2]


@define("aten.scaled_dot_product_attention.default", flops=_sdpa_flops)
def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    s = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision="highest") * scale
    if is_causal:
        n, m = q.shape[-2], k.shape[-2]
        s = jnp.where(jnp.tril(jnp.ones((n, m), bool)), s, -jnp.inf)
    if attn_mask is not None:
        s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == jnp.bool_ else s + attn_mask
    return jnp.matmul(jax.nn.softmax(s, axis=-1), v, precision="highest")


define("aten.dropout.default", "aten.dropout_.default", "aten.feature_dropout.default",
       flops="none")(lambda x, p=0.5, train=False: x)


def _einsum_flops(inputs, outputs, args):
    """2 x the product of the sizes of every index the equation names (each output
    element sums over the others)."""
    equation = args[0].replace(" ", "").split("->")[0]
    sizes: dict[str, Any] = {}
    for term, spec in zip(equation.split(","), inputs):
        letters = [c for c in term if c.isalpha()]
        for c, d in zip(letters, spec.shape[len(spec.shape) - len(letters):] if "..." in term else spec.shape):
            sizes[c] = d
    total: Any = 2
    for d in sizes.values():
        total = total * d
    return total


@define("aten.einsum.default", flops=_einsum_flops)
def _einsum(equation, tensors, path=None):
    return jnp.einsum(equation, *tensors, precision="highest")


@define("aten.native_group_norm.default", flops=lambda i, o, a: 8 * size(o[0]))
def _group_norm(x, w, b, n, c, hw, groups, eps):
    g = x.reshape((x.shape[0], groups, -1))
    mean = g.mean(-1, keepdims=True)
    rstd = lax.rsqrt(((g - mean) ** 2).mean(-1, keepdims=True) + eps)
    y = ((g - mean) * rstd).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = y if w is None else y * w.reshape(shape)
    y = y if b is None else y + b.reshape(shape)
    return y, mean.reshape(x.shape[0], groups), rstd.reshape(x.shape[0], groups)


@define("aten.group_norm.default", flops=lambda i, o, a: 8 * size(o[0]))
def _group_norm_composite(x, groups, w=None, b=None, eps=1e-5, cudnn_enabled=True):
    return _group_norm(x, w, b, x.shape[0], x.shape[1], None, groups, eps)[0]


def _resize(x, size_hw, method):
    return jax.image.resize(x, x.shape[:2] + tuple(size_hw), method=method)


@define("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", flops="none")
def _upsample_nearest(x, output_size=None, scale_factors=None):
    if output_size is None:
        output_size = [int(d * s) for d, s in zip(x.shape[2:], scale_factors)]
    rows = (jnp.arange(output_size[0]) * x.shape[2] // output_size[0])
    cols = (jnp.arange(output_size[1]) * x.shape[3] // output_size[1])
    return x[:, :, rows][:, :, :, cols]


@define("aten.upsample_bilinear2d.vec", flops="elementwise")
def _upsample_bilinear(x, output_size=None, align_corners=False, scale_factors=None):
    if output_size is None:
        output_size = [int(d * s) for d, s in zip(x.shape[2:], scale_factors)]
    if align_corners:
        raise NotImplementedError("align_corners=True")
    return _resize(x, output_size, "linear").astype(x.dtype)
