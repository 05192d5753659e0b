"""The ``aten`` family's network operators: matrix products, convolution,
normalization, embedding, attention, dropout (in ATen's signatures)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.flops import size
from .layer import DRAWS, define


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


# --- convolution ----------------------------------------------------------------------

def _conv_flops(inputs, outputs, args):
    w = inputs[1]
    return 2 * size(outputs[0]) * size(w.shape[1:])


@define("aten.convolution.default", flops=_conv_flops)
def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _conv_transpose(x, w, b, stride, padding, output_padding, groups, dilation)
    nd = w.ndim - 2
    y = lax.conv_general_dilated(
        x, w, tuple(stride), [p if isinstance(p, tuple) else (p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        feature_group_count=groups, precision="highest",
        dimension_numbers=("NCH", "OIH", "NCH") if nd == 1 else (
            ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW")))
    return y if b is None else y + b.reshape((1, -1) + (1,) * nd)


@define("aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input",
        flops=lambda i, o, a: 2 * size(i[0]) * size(i[1].shape[1:]))
def _conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """``nn.ConvTranspose1d/2d/3d`` (weight ``(in, out / groups, *kernel)``): the
    convolution of the input spread out by ``stride`` with the flipped kernel, padded
    ``dilation * (k - 1) - padding`` on each side and ``output_padding`` more on the right."""
    nd = w.ndim - 2

    def tup(v):
        return tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd
    stride, padding, output_padding, dilation = map(tup, (stride, padding, output_padding, dilation))
    cin, cout_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    k = w.reshape((groups, cin // groups, cout_g) + kernel).swapaxes(1, 2)
    k = jnp.flip(k.reshape((groups * cout_g, cin // groups) + kernel), tuple(range(2, 2 + nd)))
    pads = [(d * (n - 1) - p, d * (n - 1) - p + o)
            for n, p, o, d in zip(kernel, padding, output_padding, dilation)]
    spec = ("NCH", "OIH", "NCH") if nd == 1 else (
        ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW"))
    y = lax.conv_general_dilated(x, k, (1,) * nd, pads, lhs_dilation=stride, rhs_dilation=dilation,
                                 feature_group_count=groups, precision="highest", dimension_numbers=spec)
    return y if b is None else y + b.reshape((1, -1) + (1,) * nd)


@define("aten.conv2d.default", "aten.conv1d.default", "aten.conv3d.default", "aten.conv1d.padding",
        "aten.conv2d.padding", "aten.conv3d.padding", flops=_conv_flops)
def _conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    nd = w.ndim - 2

    def tup(v):
        return tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd
    if isinstance(padding, str):  # "valid": none; "same": PyTorch's, the odd one on the right
        totals = [d * (n - 1) if padding == "same" else 0 for d, n in zip(tup(dilation), w.shape[2:])]
        padding = tuple((t // 2, t - t // 2) for t in totals)
    return _convolution(x, w, b, tup(stride), tup(padding), tup(dilation), False, (0,) * nd, groups)


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


def _bn_stats(x, mean, var, training):
    """The statistics a batch norm call normalizes with: the batch's (biased variance)
    in training or without running statistics (``track_running_stats=False``)."""
    if training or mean is None:
        axes = (0,) + tuple(range(2, x.ndim))
        return x.mean(axes), x.var(axes)
    return mean, var


@define("aten.batch_norm.default", flops=lambda i, o, a: 4 * size(o[0]))
def _batch_norm(x, w, b, mean, var, training, momentum, eps, cudnn_enabled=True):
    """A call the layer rule does not read as a BatchNorm: one in eval mode in a
    train-mode program (frozen: the running statistics, not updated), one without
    running statistics (the batch's, always)."""
    return _bn(x, w, b, *_bn_stats(x, mean, var, training), eps)


@define("aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm.default",
        flops=lambda i, o, a: 4 * size(o[0]))
def _batch_norm_functional(x, w, b, mean, var, training, momentum, eps):
    """Likewise, after ``run_decompositions``, with the running statistics' new values
    (the module's buffer updates): unchanged in eval mode; in training (a bare
    ``nn.BatchNorm2d`` given as the module) moved towards the batch's by ``momentum``,
    the variance unbiased, as PyTorch's."""
    m, v = _bn_stats(x, mean, var, training)
    y = _bn(x, w, b, m, v, eps)
    empty = jnp.zeros((0,), x.dtype)
    if mean is None:
        return y, empty, empty, empty, empty
    if training:
        n = x.size // x.shape[1]
        mean = (1 - momentum) * mean + momentum * m
        var = (1 - momentum) * var + momentum * v * (n / max(n - 1, 1))
    return y, empty, empty, mean, var


@define("aten._native_batch_norm_legit.no_stats", flops=lambda i, o, a: 4 * size(o[0]))
def _batch_norm_no_stats(x, w, b, training, momentum, eps):
    """``track_running_stats=False`` after ``run_decompositions``: the batch's statistics."""
    m, v = _bn_stats(x, None, None, True)
    return _bn(x, w, b, m, v, eps), m, lax.rsqrt(v + eps)


@define("aten.embedding.default", flops="none")
def _embedding(w, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(w, ids, axis=0)


def _sdpa_flops(inputs, outputs, args):
    q, k = inputs[0], inputs[1]
    return 4 * size(q.shape) * k.shape[-2]


def _drops(p_position: int, p_name: str, train_position: int | None = None) -> Any:
    """Whether a call draws: its drop probability is above 0 (and ``train`` is set)."""
    def draws(args, kwargs):
        p = args[p_position] if len(args) > p_position else kwargs.get(p_name, 0.0)
        if train_position is not None:
            train = args[train_position] if len(args) > train_position else kwargs.get("train")
            if train is not True:
                return False
        return isinstance(p, (int, float)) and p > 0
    return draws


def _dropped(x, p, rng, shape):
    """``x`` with ``shape``'s entries (broadcast over ``x``) zeroed with probability
    ``p``, the rest scaled by ``1 / (1 - p)``, as PyTorch's dropout; ``x`` as it is
    without a key (eval mode)."""
    if rng is None or not p:
        return x
    if p >= 1:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(rng, 1.0 - p, shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - p, x.dtype), jnp.zeros((), x.dtype))


@define("aten.scaled_dot_product_attention.default", flops=_sdpa_flops, random=True)
def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
          rng=None):
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
    weights = jax.nn.softmax(s, axis=-1)
    # in train mode (a key given) the attention weights are dropped, as PyTorch's
    weights = _dropped(weights, dropout_p, rng, weights.shape)
    return jnp.matmul(weights, v, precision="highest")


DRAWS["aten.scaled_dot_product_attention.default"] = _drops(4, "dropout_p")
def _dropout_flops(inputs, outputs, args):
    """A draw's compare, divide and select per element with ``train=True``; none without."""
    return 3 * size(outputs[0]) if len(args) > 2 and args[2] is True else 0


@define("aten.dropout.default", "aten.dropout_.default", flops=_dropout_flops, random=True)
def _dropout(x, p=0.5, train=False, rng=None):
    """``F.dropout(training=False)``: the identity; with ``train=True`` a ``dropout``
    layer (layers.py) unless ``p`` is 1 (all zeroed in train mode, as PyTorch's)."""
    return _dropped(x, p, rng, x.shape) if train else x


@define("aten.native_dropout.default", flops=_dropout_flops, random=True)
def _native_dropout(x, p, train, rng=None):
    y = _dropout(x, p, train, rng)
    return y, y != 0 if train and rng is not None else jnp.ones(x.shape, jnp.bool_)


DRAWS["aten.dropout.default"] = DRAWS["aten.dropout_.default"] = _drops(1, "p", 2)
DRAWS["aten.native_dropout.default"] = _drops(1, "p", 2)


@define("aten.feature_dropout.default", "aten.feature_dropout_.default", flops=_dropout_flops,
        random=True)
def _feature_dropout(x, p=0.5, train=False, rng=None):
    """``nn.Dropout1d/2d/3d``: whole channels (``x[n, c]``) zeroed with probability
    ``p`` in train mode, the rest scaled by ``1 / (1 - p)``."""
    if not train:
        return x
    return _dropped(x, p, rng, x.shape[:2] + (1,) * (x.ndim - 2))


DRAWS["aten.feature_dropout.default"] = DRAWS["aten.feature_dropout_.default"] = _drops(1, "p", 2)


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
