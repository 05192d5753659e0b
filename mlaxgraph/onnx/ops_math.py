"""The ``onnx`` family's numeric operators: element-wise math, comparisons and logic,
reductions, arg-reductions, casts, clipping, cumulative sums, matrix products."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.specs import TensorSpec
from ..ops.flops import size
from .dtypes import int64, to_dtype
from .layer import define

_f = jnp.issubdtype

# --- element-wise, one input --------------------------------------------------------

_UNARY: dict[str, Any] = {
    "Abs": jnp.abs, "Neg": jnp.negative, "Exp": jnp.exp, "Log": jnp.log, "Sqrt": jnp.sqrt,
    "Reciprocal": jnp.reciprocal, "Floor": jnp.floor, "Ceil": jnp.ceil, "Sin": jnp.sin,
    "Cos": jnp.cos, "Tan": jnp.tan, "Asin": jnp.arcsin, "Acos": jnp.arccos, "Atan": jnp.arctan,
    "Sinh": jnp.sinh, "Cosh": jnp.cosh, "Asinh": jnp.arcsinh, "Acosh": jnp.arccosh,
    "Atanh": jnp.arctanh, "Tanh": jnp.tanh, "Sigmoid": jax.nn.sigmoid, "Erf": jax.scipy.special.erf,
    "Relu": jax.nn.relu, "Softsign": jax.nn.soft_sign, "Sign": jnp.sign, "Round": jnp.round,
    "Softplus": jax.nn.softplus, "Not": jnp.logical_not, "BitwiseNot": jnp.bitwise_not,
    "IsNaN": jnp.isnan, "Identity": lambda x: x, "Mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
}
for _name, _fn in _UNARY.items():
    define(_name)(lambda a, x, fn=_fn: fn(x))


@define("IsInf")
def _isinf(a, x):
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    return (jnp.isposinf(x) & bool(pos)) | (jnp.isneginf(x) & bool(neg))


def _alpha(a, default):
    return a.get("alpha", default)


define("LeakyRelu")(lambda a, x: jnp.where(x >= 0, x, x * _alpha(a, 0.01)))
define("Elu")(lambda a, x: jnp.where(x > 0, x, _alpha(a, 1.0) * jnp.expm1(x)).astype(x.dtype))
define("Celu")(lambda a, x: (jnp.maximum(x, 0) + jnp.minimum(
    0, _alpha(a, 1.0) * jnp.expm1(x / _alpha(a, 1.0)))).astype(x.dtype))
define("Selu")(lambda a, x: (a.get("gamma", 1.0507009873554805) * jnp.where(
    x > 0, x, _alpha(a, 1.6732632423543772) * jnp.expm1(x))).astype(x.dtype))
define("ThresholdedRelu")(lambda a, x: jnp.where(x > _alpha(a, 1.0), x, 0).astype(x.dtype))
define("HardSigmoid")(lambda a, x: jnp.clip(_alpha(a, 0.2) * x + a.get("beta", 0.5), 0, 1)
                      .astype(x.dtype))
define("HardSwish")(lambda a, x: (x * jnp.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype))
define("Swish")(lambda a, x: (x * jax.nn.sigmoid(_alpha(a, 1.0) * x)).astype(x.dtype))
define("Shrink")(lambda a, x: jnp.where(
    x < -a.get("lambd", 0.5), x + a.get("bias", 0.0),
    jnp.where(x > a.get("lambd", 0.5), x - a.get("bias", 0.0), 0)).astype(x.dtype))


@define("Gelu")
def _gelu(a, x):
    return jax.nn.gelu(x, approximate=a.get("approximate", "none") == "tanh").astype(x.dtype)


@define("PRelu")
def _prelu(a, x, slope):
    if a.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))  # one slope per channel
    return jnp.where(x < 0, x * slope, x).astype(x.dtype)


# --- element-wise, two or more inputs -----------------------------------------------

def _div(x, y):
    if _f(x.dtype, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(x, y))
    return x / y


_BINARY: dict[str, Any] = {
    "Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": _div,
    "Equal": jnp.equal, "Less": jnp.less, "LessOrEqual": jnp.less_equal,
    "Greater": jnp.greater, "GreaterOrEqual": jnp.greater_equal,
    "And": jnp.logical_and, "Or": jnp.logical_or, "Xor": jnp.logical_xor,
    "BitwiseAnd": jnp.bitwise_and, "BitwiseOr": jnp.bitwise_or, "BitwiseXor": jnp.bitwise_xor,
}
def _legacy(a, x, y):
    """Opsets before 7: with ``broadcast=1``, ``y``'s dims line up with ``x``'s from
    ``axis`` (by default the trailing ones)."""
    if a.opset >= 7 or not a.get("broadcast", 0) or y.ndim == 0:
        return y
    axis = a.get("axis", x.ndim - y.ndim) % max(x.ndim, 1)
    return y.reshape(y.shape + (1,) * (x.ndim - axis - y.ndim))


for _name, _fn in _BINARY.items():
    define(_name)(lambda a, x, y, fn=_fn: fn(x, _legacy(a, x, y)))


@define("Pow")
def _pow(a, x, y):
    y = _legacy(a, x, y)
    if _f(x.dtype, jnp.floating) and _f(y.dtype, jnp.floating):
        return jnp.power(x, y.astype(x.dtype))
    if _f(x.dtype, jnp.integer) and _f(y.dtype, jnp.integer):
        return jnp.power(x, y.astype(x.dtype))
    wide = jnp.promote_types(jnp.float32, x.dtype)
    return jnp.power(x.astype(wide), y.astype(wide)).astype(x.dtype)


@define("Mod")
def _mod(a, x, y):
    if a.get("fmod", 0):
        if _f(x.dtype, jnp.integer):
            return lax.rem(*jnp.broadcast_arrays(x, y))
        return jnp.fmod(x, y)
    return jnp.mod(x, y)


@define("BitShift", dtypes="int")
def _bitshift(a, x, y):
    left = a.get("direction", "LEFT").upper() == "LEFT"
    return jnp.left_shift(x, y) if left else jnp.right_shift(x, y)


def _variadic(fn):
    def run(a, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return run


define("Sum")(_variadic(jnp.add))
define("Max")(_variadic(jnp.maximum))
define("Min")(_variadic(jnp.minimum))
define("Mean")(lambda a, *xs: (_variadic(jnp.add)(a, *xs) / len(xs)).astype(xs[0].dtype))
define("Where", flops="none")(lambda a, c, x, y: jnp.where(c, x, y))


@define("Clip")
def _clip(a, x, low=None, high=None):
    if a.opset < 11:
        low, high = a.get("min"), a.get("max")
    if jnp.issubdtype(x.dtype, jnp.floating):  # a bound left out is the dtype's limit,
        # so -inf and inf are clamped too (before opset 11, float32's: the attributes'
        # defaults, infinite in float16)
        limits = jnp.finfo(x.dtype if a.opset >= 11 else np.float32)
        low = limits.min if low is None else low
        high = limits.max if high is None else high
    out = x
    if low is not None:
        out = jnp.maximum(out, jnp.asarray(low, x.dtype))
    if high is not None:
        out = jnp.minimum(out, jnp.asarray(high, x.dtype))
    return out


# --- casts ----------------------------------------------------------------------------

def _to_e8m0(x, saturate: bool, round_mode: str):
    """float8_e8m0fnu (a power of two, the exponent alone) from x's float32 bits,
    rounded ``up`` (ONNX's default), ``down`` or to ``nearest``."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(jnp.int32)
    special = exponent == 0xFF
    if round_mode == "up":
        bump = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        g, r = (bits & 0x400000) > 0, (bits & 0x200000) > 0
        bump = g & (r | ((bits & 0x1FFFFF) > 0) | (exponent > 0))
    else:
        bump = jnp.zeros(bits.shape, bool)
    bump = bump & ~special
    if saturate:
        bump = bump & (exponent != 0xFE)
    exponent = jnp.where(special, 0xFF, exponent + bump.astype(jnp.int32))
    return lax.bitcast_convert_type(exponent.astype(jnp.uint8), jnp.dtype("float8_e8m0fnu"))


def _cast(x, dtype, saturate, round_mode="up"):
    if dtype.name == "float8_e8m0fnu" and _f(x.dtype, jnp.floating):
        return _to_e8m0(x, bool(saturate), round_mode)
    if jnp.issubdtype(dtype, jnp.integer) and _f(x.dtype, jnp.floating):
        x = jnp.trunc(x)
    bits = jnp.iinfo(dtype).bits if jnp.issubdtype(dtype, jnp.integer) else 0
    if 0 < bits < 8 and not _f(x.dtype, jnp.bool_):
        # sub-byte integers wrap around, as ONNX's casts to int4 and int2 do
        wrapped = jnp.bitwise_and(x.astype(jnp.int32), (1 << bits) - 1)
        if jnp.issubdtype(dtype, jnp.signedinteger):
            wrapped = jnp.where(wrapped >= 1 << (bits - 1), wrapped - (1 << bits), wrapped)
        return wrapped.astype(dtype)
    if saturate and dtype.itemsize == 1 and _f(dtype, jnp.floating) and _f(x.dtype, jnp.floating):
        top = float(jnp.finfo(dtype).max)
        x = jnp.clip(x, -top, top)
    return x.astype(dtype)


define("Cast", flops="none")(lambda a, x: _cast(x, to_dtype(a["to"]), a.get("saturate", 1),
                                                a.get("round_mode", "up")))
define("CastLike", flops="none")(lambda a, x, like: _cast(x, like.dtype, a.get("saturate", 1)))


# --- reductions -------------------------------------------------------------------------

def _axes(a, x, axes):
    if axes is None:
        axes = a.get("axes")
    if axes is None or len(np.asarray(axes).reshape(-1)) == 0:
        return None if not a.get("noop_with_empty_axes", 0) else ()
    return tuple(int(v) % max(x.ndim, 1) for v in np.asarray(axes).reshape(-1))


def _reduction(fn, prepare=None, finish=None):
    def run(a, x, axes=None):
        dims = _axes(a, x, axes)
        if dims == ():
            return x if prepare is None else prepare(x)
        keep = bool(a.get("keepdims", 1))
        y = prepare(x) if prepare is not None else x
        out = fn(y, axis=dims, keepdims=keep)
        return (finish(out) if finish is not None else out).astype(x.dtype)
    return run


def _reduce_flops(inputs, outputs, a):
    return size(inputs[0])


def _extreme(fn, fill):
    def reduce(y, axis, keepdims):
        if y.size == 0:
            shape = jax.eval_shape(lambda v: jnp.sum(v, axis=axis, keepdims=keepdims), y).shape
            return jnp.full(shape, fill(y.dtype), y.dtype)
        return fn(y, axis=axis, keepdims=keepdims)
    return reduce


def _lowest(d):
    if d == jnp.bool_:
        return False
    return -jnp.inf if _f(d, jnp.floating) else jnp.iinfo(d).min


def _highest(d):
    if d == jnp.bool_:
        return True
    return jnp.inf if _f(d, jnp.floating) else jnp.iinfo(d).max


_REDUCTIONS = {
    "ReduceSum": (jnp.sum, None, None),
    "ReduceMean": (jnp.mean, None, None),
    "ReduceProd": (jnp.prod, None, None),
    "ReduceMax": (_extreme(jnp.max, _lowest), None, None),
    "ReduceMin": (_extreme(jnp.min, _highest), None, None),
    "ReduceL1": (jnp.sum, jnp.abs, None),
    "ReduceL2": (jnp.sum, lambda x: x * x, jnp.sqrt),
    "ReduceSumSquare": (jnp.sum, lambda x: x * x, None),
    "ReduceLogSum": (jnp.sum, None, jnp.log),
    "ReduceLogSumExp": (jax.nn.logsumexp, None, None),
}
for _name, (_fn, _pre, _post) in _REDUCTIONS.items():
    define(_name, static=(1,), flops=_reduce_flops)(_reduction(_fn, _pre, _post))


def _arg(fn):
    def run(a, x):
        axis = a.get("axis", 0) % x.ndim
        if a.get("select_last_index", 0):
            flipped = jnp.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        out = out.astype(int64())
        return jnp.expand_dims(out, axis) if a.get("keepdims", 1) else out
    return run


define("ArgMax", flops=_reduce_flops)(_arg(jnp.argmax))
define("ArgMin", flops=_reduce_flops)(_arg(jnp.argmin))


def _cumulative(fn):
    def run(a, x, axis):
        axis = int(np.asarray(axis).reshape(-1)[0]) % x.ndim
        y = jnp.flip(x, axis) if a.get("reverse", 0) else x
        out = fn(y, axis=axis)
        if a.get("exclusive", 0):
            one = jnp.ones_like(lax.slice_in_dim(out, 0, 1, axis=axis)) if fn is jnp.cumprod \
                else jnp.zeros_like(lax.slice_in_dim(out, 0, 1, axis=axis))
            out = jnp.concatenate([one, lax.slice_in_dim(out, 0, out.shape[axis] - 1, axis=axis)],
                                  axis=axis)
        out = jnp.flip(out, axis) if a.get("reverse", 0) else out
        return out.astype(x.dtype)
    return run


define("CumSum", static=(1,))(_cumulative(jnp.cumsum))
define("CumProd", static=(1,))(_cumulative(jnp.cumprod))


# --- matrix products --------------------------------------------------------------------

def _matmul_flops(inputs, outputs, a):
    k = inputs[0].shape[-1] if inputs[0].rank else 1
    return 2 * size(outputs[0]) * k


def _gemm_flops(inputs, outputs, a):
    k = inputs[0].shape[0 if a.get("transA", 0) else -1]
    return 2 * size(outputs[0]) * k + sum(size(o) for o in outputs)


define("MatMul", flops=_matmul_flops)(lambda a, x, y: jnp.matmul(x, y))


@define("Gemm", flops=_gemm_flops)
def _gemm(a, x, y, c=None):
    x = x.T if a.get("transA", 0) else x
    y = y.T if a.get("transB", 0) else y
    out = a.get("alpha", 1.0) * jnp.matmul(x, y)
    if c is not None:
        out = out + a.get("beta", 1.0) * c
    return out.astype(x.dtype)


@define("Einsum", flops="input")
def _einsum(a, *xs):
    return jnp.einsum(a["equation"].replace(" ", ""), *xs)


@define("Det", dtypes="float")
def _det(a, x):
    return jnp.linalg.det(x)


def spec_flops(spec: TensorSpec) -> int:
    return size(spec)
