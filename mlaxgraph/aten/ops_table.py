"""The ``aten`` family's definitions, each in ATen's own signature
(``aten.add.Tensor(self, other, alpha=1)``): element-wise math, comparisons,
reductions, shapes and views, indexing, creation. ``ops_nn`` holds the rest."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export, lax

from ..ops.flops import size
from .layer import define

_DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16,
           "float64": jnp.float32, "int64": jnp.int32, "int32": jnp.int32, "int16": jnp.int16,
           "int8": jnp.int8, "uint8": jnp.uint8, "bool": jnp.bool_}


def dtype_of(name: Any, default: Any = None) -> Any:
    """An ATen dtype name as JAX's (64-bit types as JAX computes them without x64)."""
    if name is None:
        return default
    return _DTYPES.get(str(name), default)


# --- element-wise ----------------------------------------------------------------------

_UNARY: dict[str, Any] = {
    "relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh, "exp": jnp.exp,
    "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "neg": jnp.negative, "abs": jnp.abs,
    "sin": jnp.sin, "cos": jnp.cos, "erf": jax.scipy.special.erf, "reciprocal": jnp.reciprocal,
    "silu": jax.nn.silu, "floor": jnp.floor, "ceil": jnp.ceil, "logical_not": jnp.logical_not,
    "bitwise_not": jnp.bitwise_not, "sign": jnp.sign, "log1p": jnp.log1p, "expm1": jnp.expm1,
    "round": jnp.round, "isnan": jnp.isnan, "hardswish": lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1),
    "hardsigmoid": lambda x: jnp.clip(x / 6 + 0.5, 0, 1), "relu6": lambda x: jnp.clip(x, 0, 6),
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)), "alias": lambda x: x,
    "clone": lambda x: x, "contiguous": lambda x: x, "detach": lambda x: x,
    "lift_fresh_copy": lambda x: x,
}
for _name, _fn in _UNARY.items():
    define(f"aten.{_name}.default", f"aten.{_name}_.default")(
        lambda x, *rest, fn=_fn, **kw: fn(x).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else fn(x))


@define("aten.gelu.default", "aten.gelu_.default")
def _gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@define("aten.leaky_relu.default", "aten.leaky_relu_.default")
def _leaky_relu(x, negative_slope=0.01):
    return jnp.where(x >= 0, x, x * negative_slope).astype(x.dtype)


@define("aten.hardtanh.default", "aten.hardtanh_.default")
def _hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val)


@define("aten.elu.default")
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return (scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))).astype(x.dtype)


def _scalar_like(y, x):
    """A Python number as a weak-typed operand, a tensor as it is."""
    return y


def _alpha(y, alpha):
    return y if alpha == 1 else y * alpha


define("aten.add.Tensor", "aten.add.Scalar", "aten.add_.Tensor")(
    lambda x, y, alpha=1: x + _alpha(y, alpha))
define("aten.sub.Tensor", "aten.sub.Scalar", "aten.sub_.Tensor")(
    lambda x, y, alpha=1: x - _alpha(y, alpha))
define("aten.rsub.Scalar", "aten.rsub.Tensor")(lambda x, y, alpha=1: y - _alpha(x, alpha))
define("aten.mul.Tensor", "aten.mul.Scalar", "aten.mul_.Tensor")(lambda x, y: x * y)


@define("aten.div.Tensor", "aten.div.Scalar", "aten.div_.Tensor", "aten.div.Tensor_mode")
def _div(x, y, rounding_mode=None):
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    if rounding_mode == "trunc":
        return jnp.trunc(x / y).astype(jnp.result_type(x, y))
    if not jnp.issubdtype(jnp.result_type(x, y), jnp.floating):
        return jnp.asarray(x, jnp.float32) / jnp.asarray(y, jnp.float32)
    return x / y


define("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor")(lambda x, y: jnp.power(x, y))
define("aten.pow.Scalar")(lambda x, y: jnp.power(x, y))
define("aten.maximum.default", "aten.max.other")(jnp.maximum)
define("aten.minimum.default", "aten.min.other")(jnp.minimum)
define("aten.remainder.Scalar", "aten.remainder.Tensor")(jnp.remainder)
define("aten.fmod.Scalar", "aten.fmod.Tensor")(jnp.fmod)
define("aten.atan2.default")(jnp.arctan2)
_COMPARE: dict[str, Any] = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                   "gt": jnp.greater, "ge": jnp.greater_equal}
for _name, _fn in _COMPARE.items():
    define(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(lambda x, y, fn=_fn: fn(x, y))
_LOGIC: dict[str, Any] = {"logical_and": jnp.logical_and, "logical_or": jnp.logical_or,
                          "bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or}
for _name, _fn in _LOGIC.items():
    define(f"aten.{_name}.default", f"aten.{_name}.Tensor")(lambda x, y, fn=_fn: fn(x, y))
define("aten.where.self")(lambda c, x, y: jnp.where(c, x, y))
define("aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")(
    lambda c, x, y: jnp.where(c, x, y))


def _clamped_dtype(x, *bounds):
    """PyTorch's result type of a clamp: an integer tensor with a float bound is float
    (float32, torch's default dtype); a bound tensor with dims takes part as a tensor."""
    dtype = x.dtype
    for b in bounds:
        if b is None:
            continue
        if getattr(b, "ndim", 0):
            dtype = jnp.result_type(dtype, b.dtype)
        elif not jnp.issubdtype(dtype, jnp.floating) and (
                isinstance(b, float) or jnp.issubdtype(getattr(b, "dtype", np.int32), jnp.floating)):
            dtype = jnp.float32
    return dtype


@define("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_.default")
def _clamp(x, min=None, max=None):
    dtype = _clamped_dtype(x, min, max)
    return jnp.clip(x.astype(dtype), min, max).astype(dtype)


@define("aten.clamp_min.default")
def _clamp_min(x, min):
    dtype = _clamped_dtype(x, min)
    return jnp.maximum(x.astype(dtype), min).astype(dtype)


@define("aten.masked_fill.Scalar", "aten.masked_fill.Tensor", "aten.masked_fill_.Scalar")
def _masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


@define("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.type_as.default")
def _to(x, dtype=None, *rest, **kw):
    if not isinstance(dtype, str) and dtype is not None and hasattr(dtype, "dtype"):
        return x.astype(dtype.dtype)
    dtype = dtype_of(dtype if dtype is not None else kw.get("dtype"))
    return x if dtype is None else x.astype(dtype)


@define("aten.to.device")
def _to_device(x, device=None, dtype=None, *rest, **kw):
    return _to(x, dtype, **kw)


# --- reductions ------------------------------------------------------------------------

def _axes(dim):
    if dim is None:
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)


@define("aten.mean.dim", "aten.mean.default", flops="input")
def _mean(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(x, axis=_axes(dim) or None, keepdims=keepdim, dtype=dtype_of(dtype))


@define("aten.sum.dim_IntList", "aten.sum.default", flops="input")
def _sum(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x, axis=_axes(dim) or None, keepdims=keepdim, dtype=dtype_of(dtype))


@define("aten.amax.default", flops="input")
def _amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(dim) or None, keepdims=keepdim)


@define("aten.amin.default", flops="input")
def _amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(dim) or None, keepdims=keepdim)


@define("aten.var.correction", flops="input")
def _var(x, dim=None, correction=1, keepdim=False):
    return jnp.var(x, axis=_axes(dim), ddof=1 if correction is None else correction, keepdims=keepdim)


@define("aten.argmax.default", flops="input")
def _argmax(x, dim=None, keepdim=False):
    return jnp.argmax(x, axis=dim, keepdims=keepdim)


def _softmax_dtype(x, half_to_float=False, dtype=None):
    """The dtype softmax computes in: ``dtype=`` (``aten.softmax.int``), float32 for
    ``half_to_float`` (``aten._softmax``), else the input's."""
    return dtype_of(dtype, jnp.float32 if half_to_float is True else x.dtype)


@define("aten._softmax.default", flops=lambda i, o, a: 5 * size(o[0]))
def _softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(x.astype(_softmax_dtype(x, half_to_float)), axis=dim)


@define("aten.softmax.int", flops=lambda i, o, a: 5 * size(o[0]))
def _softmax_int(x, dim, dtype=None):
    return jax.nn.softmax(x.astype(_softmax_dtype(x, dtype=dtype)), axis=dim)


@define("aten._log_softmax.default", flops=lambda i, o, a: 5 * size(o[0]))
def _log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(x.astype(_softmax_dtype(x, half_to_float)), axis=dim)


@define("aten.log_softmax.int", flops=lambda i, o, a: 5 * size(o[0]))
def _log_softmax_int(x, dim, dtype=None):
    return jax.nn.log_softmax(x.astype(_softmax_dtype(x, dtype=dtype)), axis=dim)


@define("aten.cumsum.default", flops="input")
def _cumsum(x, dim, dtype=None):
    return jnp.cumsum(x, axis=dim, dtype=dtype_of(dtype))


# --- shapes and views ------------------------------------------------------------------

def _shape(x, shape):
    shape = list(shape)
    if -1 in shape:
        known = math.prod(d for d in shape if not (isinstance(d, int) and d == -1))
        shape[shape.index(-1)] = size(x.shape) // known
    return tuple(shape)


define("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
       flops="none")(lambda x, shape: jnp.reshape(x, _shape(x, shape)))
define("aten.permute.default", flops="none")(lambda x, dims: jnp.transpose(x, dims))
define("aten.t.default", flops="none")(lambda x: x.T)
define("aten.transpose.int", flops="none")(lambda x, a, b: jnp.swapaxes(x, a, b))
define("aten.unsqueeze.default", flops="none")(lambda x, dim: jnp.expand_dims(x, dim % (x.ndim + 1)))


@define("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", flops="none")
def _squeeze(x, dim=None):
    axes = tuple(d % x.ndim for d in _axes(dim)) if dim is not None else None
    if axes is not None:
        axes = tuple(a for a in axes if x.shape[a] == 1)
    return jnp.squeeze(x, axes)


@define("aten.flatten.using_ints", flops="none")
def _flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return x.reshape(1)
    s, e = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(x.shape[:s] + (size(x.shape[s:e + 1]),) + x.shape[e + 1:])


@define("aten.expand.default", flops="none")
def _expand(x, shape, implicit=False):
    lead = len(shape) - x.ndim
    target = tuple(x.shape[i - lead] if (isinstance(d, int) and d == -1) else d
                   for i, d in enumerate(shape))
    return jnp.broadcast_to(x, target)


define("aten.cat.default", "aten.concat.default", flops="none")(
    lambda xs, dim=0: jnp.concatenate(xs, axis=dim))
define("aten.stack.default", flops="none")(lambda xs, dim=0: jnp.stack(xs, axis=dim))


@define("aten.slice.Tensor", flops="none")
def _slice(x, dim=0, start=None, end=None, step=1):
    index = [slice(None)] * x.ndim
    n = x.shape[dim]
    if isinstance(end, int) and end > 2 ** 62:
        end = None
    index[dim] = slice(start, None if end is None else (end if not isinstance(n, int) else min(end, n)), step)
    return x[tuple(index)]


@define("aten.select.int", flops="none")
def _select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@define("aten.split.Tensor", "aten.split_with_sizes.default", flops="none")
def _split(x, split_size, dim=0):
    n = x.shape[dim]
    sizes = list(split_size) if isinstance(split_size, (list, tuple)) else \
        [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    points = list(np.cumsum(sizes)[:-1])
    return tuple(jnp.split(x, points, axis=dim))


@define("aten.chunk.default", flops="none")
def _chunk(x, chunks, dim=0):
    n = x.shape[dim]
    step = -(-n // chunks)
    return _split(x, step, dim)


define("aten.unbind.int", flops="none")(
    lambda x, dim=0: tuple(jnp.moveaxis(x, dim, 0)[i] for i in range(x.shape[dim])))


@define("aten.index.Tensor", flops="none")
def _index(x, indices):
    return x[tuple(slice(None) if i is None else i for i in indices)]


define("aten.index_select.default", flops="none")(lambda x, dim, index: jnp.take(x, index, axis=dim))
define("aten.gather.default", flops="none")(
    lambda x, dim, index, sparse_grad=False: jnp.take_along_axis(x, index, axis=dim))


@define("aten.constant_pad_nd.default", flops="none")
def _pad(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return lax.pad(x, jnp.asarray(value, x.dtype), [(lo, hi, 0) for lo, hi in widths])


define("aten.tril.default", flops="none")(lambda x, diagonal=0: jnp.tril(x, diagonal))
define("aten.triu.default", flops="none")(lambda x, diagonal=0: jnp.triu(x, diagonal))
define("aten.roll.default", flops="none")(lambda x, shifts, dims=(): jnp.roll(x, shifts, dims or None))


# --- creation --------------------------------------------------------------------------

@define("aten.arange.default", "aten.arange.start", "aten.arange.start_step", flops="none")
def _arange(*args, dtype=None, **kw):
    # integer bounds (ints, or sizes: a symbolic dim is an int) give integers, as torch's
    integral = all(isinstance(a, (int, np.integer)) or export.is_symbolic_dim(a) for a in args)
    return jnp.arange(*args, dtype=dtype_of(dtype, jnp.int32 if integral else jnp.float32))


@define("aten.full.default", flops="none")
def _full(shape, value, dtype=None, **kw):
    return jnp.full(tuple(shape), value, dtype_of(dtype, jnp.float32))


@define("aten.zeros.default", flops="none")
def _zeros(shape, dtype=None, **kw):
    return jnp.zeros(tuple(shape), dtype_of(dtype, jnp.float32))


@define("aten.ones.default", flops="none")
def _ones(shape, dtype=None, **kw):
    return jnp.ones(tuple(shape), dtype_of(dtype, jnp.float32))


define("aten.zeros_like.default", flops="none")(
    lambda x, dtype=None, **kw: jnp.zeros_like(x, dtype=dtype_of(dtype)))
define("aten.ones_like.default", flops="none")(
    lambda x, dtype=None, **kw: jnp.ones_like(x, dtype=dtype_of(dtype)))
define("aten.full_like.default", flops="none")(
    lambda x, value, dtype=None, **kw: jnp.full_like(x, value, dtype=dtype_of(dtype)))
define("aten.scalar_tensor.default", flops="none")(
    lambda value, dtype=None, **kw: jnp.asarray(value, dtype_of(dtype, jnp.float32)))
