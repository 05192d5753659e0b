"""The ``onnx`` family's quantization and bit-level operators: QuantizeLinear,
DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear,
MatMulInteger, BitCast; and the small recent ones: SwiGLU, CenterCropPad,
BatchNormalization in training mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .dtypes import to_dtype
from .layer import define


def _along(scale, x, axis: int, block: int):
    """``scale`` (a scalar, one value per index of ``axis``, or one per block of it)
    broadcast to ``x``'s shape."""
    if scale.ndim == 0 or scale.size == 1 and x.ndim == 0:
        return scale.reshape(())
    axis = axis % x.ndim
    if block:
        scale = jnp.repeat(scale, block, axis=axis)
        return lax.slice_in_dim(scale, 0, x.shape[axis], axis=axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    return scale.reshape(shape)


def _saturate(y, dtype, saturate: bool):
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.clip(jnp.round(y), int(info.min), int(info.max)).astype(dtype)
    if saturate and jnp.finfo(dtype).bits <= 8:
        top = float(jnp.finfo(dtype).max)
        y = jnp.where(jnp.isinf(y) & ("e5m2" in dtype.name), y, jnp.clip(y, -top, top))
    return y.astype(dtype)


@define("QuantizeLinear")
def _quantize(a, x, scale, zero=None):
    if zero is not None:
        dtype = zero.dtype
    elif a.get("output_dtype"):
        dtype = to_dtype(a["output_dtype"])
    else:
        dtype = jnp.dtype("uint8")
    axis, block = a.get("axis", 1), a.get("block_size", 0)
    wide = jnp.float32
    y = x.astype(wide) / _along(scale, x, axis, block).astype(wide)
    if jnp.issubdtype(dtype, jnp.integer):
        y = jnp.round(y)
        if zero is not None:
            y = y + _along(zero, x, axis, block).astype(wide)
    elif zero is not None:
        y = y + _along(zero, x, axis, block).astype(wide)
    return _saturate(y, jnp.dtype(dtype), bool(a.get("saturate", 1)))


@define("DequantizeLinear")
def _dequantize(a, x, scale, zero=None):
    axis, block = a.get("axis", 1), a.get("block_size", 0)
    out = to_dtype(a["output_dtype"]) if a.get("output_dtype") else scale.dtype
    y = x.astype(jnp.float32)
    if zero is not None:
        y = y - _along(zero, x, axis, block).astype(jnp.float32)
    return (y * _along(scale, x, axis, block).astype(jnp.float32)).astype(out)


@define("DynamicQuantizeLinear", dtypes="float")
def _dynamic_quantize(a, x):
    low = jnp.minimum(0.0, jnp.min(x))
    high = jnp.maximum(0.0, jnp.max(x))
    scale = ((high - low) / 255).astype(jnp.float32)
    zero = jnp.clip(jnp.round(-low / scale), 0, 255)
    y = jnp.clip(jnp.round(x / scale) + zero, 0, 255)
    return y.astype(jnp.uint8), scale, zero.astype(jnp.uint8)


@define("MatMulInteger", flops="input")
def _matmul_integer(a, x, y, x_zero=None, y_zero=None):
    xi, yi = x.astype(jnp.int32), y.astype(jnp.int32)
    if x_zero is not None:
        xi = xi - (x_zero.astype(jnp.int32) if x_zero.ndim == 0 else
                   x_zero.astype(jnp.int32).reshape(-1, 1))
    if y_zero is not None:
        yi = yi - y_zero.astype(jnp.int32)
    return jnp.matmul(xi, yi)


@define("BitCast", flops="none")
def _bitcast(a, x):
    dtype = to_dtype(a["to"])
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if dtype == jnp.bool_:
        return lax.bitcast_convert_type(x, jnp.uint8) != 0
    return lax.bitcast_convert_type(x, dtype)


@define("SwiGLU")
def _swiglu(a, x, gate):
    alpha = a.get("alpha", 1.0)
    return (x * jax.nn.sigmoid(alpha * x) * gate).astype(x.dtype)


@define("CenterCropPad", static=(1,), flops="none")
def _center_crop_pad(a, x, shape):
    axes = a.get("axes")
    axes = list(range(x.ndim)) if axes is None else [v % x.ndim for v in axes]
    out = x
    for axis, size in zip(axes, np.asarray(shape).reshape(-1)):
        size, n = int(size), out.shape[axis]
        if size < n:
            start = (n - size) // 2
            out = lax.slice_in_dim(out, start, start + size, axis=axis)
        elif size > n:
            low = (size - n) // 2
            widths = [(0, 0)] * out.ndim
            widths[axis] = (low, size - n - low)
            out = jnp.pad(out, widths)
    return out


@define("CausalConvWithState", dtypes="float", flops="input")
def _causal_conv(a, x, w, b=None, past=None):
    channels, k = x.shape[1], w.shape[2]
    pad = jnp.zeros((x.shape[0], channels, k - 1), x.dtype) if past is None else past
    padded = jnp.concatenate([pad, x], axis=2)
    out = lax.conv_general_dilated(padded, w.astype(x.dtype), (1,), [(0, 0)],
                                   feature_group_count=channels,
                                   precision=lax.Precision.HIGHEST)
    if b is not None:
        out = out + b.reshape(1, -1, 1).astype(x.dtype)
    if a.get("activation", "none") in ("silu", "swish"):
        wide = out.astype(jnp.float32)
        out = (wide * jax.nn.sigmoid(wide)).astype(x.dtype)
    return out, padded[:, :, padded.shape[2] - (k - 1):]


def _dequantized(x, scale, zero):
    y = x.astype(jnp.float32)
    if zero is not None:
        y = y - zero.astype(jnp.float32).reshape(zero.shape + (1,) * 0)
    return y * scale.astype(jnp.float32)


@define("QLinearMatMul", flops="input")
def _qlinear_matmul(a, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero):
    xs = (x.astype(jnp.float32) - x_zero.astype(jnp.float32).reshape(-1, 1)
          if x_zero.ndim else x.astype(jnp.float32) - x_zero.astype(jnp.float32))
    xs = xs * (x_scale.astype(jnp.float32).reshape(-1, 1) if x_scale.ndim else x_scale)
    ws = (w.astype(jnp.float32) - w_zero.astype(jnp.float32)) * w_scale.astype(jnp.float32)
    y = jnp.matmul(xs, ws, precision=lax.Precision.HIGHEST) / y_scale.astype(jnp.float32)
    return _saturate(jnp.round(y) + y_zero.astype(jnp.float32), y_zero.dtype, True)


@define("ConvInteger", flops="input")
def _conv_integer(a, x, w, x_zero=None, w_zero=None):
    from .ops_nn import _padding

    nd = x.ndim - 2
    xi = x.astype(jnp.int32) - (0 if x_zero is None else x_zero.astype(jnp.int32))
    wi = w.astype(jnp.int32) - (0 if w_zero is None else
                                w_zero.astype(jnp.int32).reshape((-1,) + (1,) * (w.ndim - 1))
                                if w_zero.ndim else w_zero.astype(jnp.int32))
    strides = tuple(a.get("strides") or (1,) * nd)
    dilations = tuple(a.get("dilations") or (1,) * nd)
    pads = _padding(a, x.shape[2:], tuple(w.shape[2:]), strides, dilations)
    return lax.conv_general_dilated(xi, wi, strides, pads, rhs_dilation=dilations,
                                    feature_group_count=a.get("group", 1),
                                    preferred_element_type=jnp.int32)
