"""Quantization: the arithmetic of the schemes, and ``Quantize``, the node that casts
activations to int8 or float8 with their scales.

A scheme stores a layer's weights as integers or float8 with float32 scales, symmetric
(zero maps to zero) and scaled by the absolute maximum (``absmax``):

- ``int8``: weights int8 in ``[-127, 127]``, one scale per output channel; the layer's
  input is cast to int8 by a ``Quantize`` node (one scale per token), and the product
  is an int8 x int8 -> int32 ``dot_general`` (or convolution), scaled back to float.
- ``int8_weight_only``: the same weights; the input stays float, the weights are cast
  to it inside the layer.
- ``int4_weight_only``: weights in ``[-8, 7]`` (scaled by ``absmax / 7``), one scale
  per group of ``group_size`` consecutive inputs and output channel, two values a
  byte (uint8: the even input in the low nibble, the odd one in the high nibble).
- ``float8``: weights and activations float8 e4m3 (``float8_e4m3fn``, largest value
  448) with a scale per output channel and per token, multiplied in float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec
from . import initializers
from .base import Layer, expect_count, expect_float, field, to_dtype
from .flops import dim_max, size

__all__ = ["Quantize", "int8_product", "padded_row_flops", "SCHEMES", "INT8_MAX", "INT4_MIN", "INT4_MAX", "FLOAT8_MAX",
           "FLOAT8", "absmax_scale", "quantize_to", "pack_int4", "unpack_int4",
           "group_scales", "quantize_weight", "range_scale", "dequantized_dot"]

#: The schemes ``mg.quantize`` knows.
SCHEMES = ("int8", "int8_weight_only", "int4_weight_only", "float8")
INT8_MAX = 127
INT4_MIN, INT4_MAX = -8, 7
FLOAT8 = np.dtype(jnp.float8_e4m3fn)
FLOAT8_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max)  # 448


def _bound(dtype: np.dtype) -> float:
    return FLOAT8_MAX if dtype == FLOAT8 else float(INT8_MAX)


def absmax_scale(x: jax.Array, axes: tuple[int, ...], bound: float) -> jax.Array:
    """``max |x| * (1 / bound)`` over ``axes`` (kept as size-1 dims), in float32 (times
    the reciprocal, as XLA rewrites a division by a constant, so the scale is the same
    eagerly and jitted); 1 where the values are all zero (they quantize to zero
    whatever the scale). A NaN among the values makes the scale NaN, so it reaches the
    result as the float computation's NaN would."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axes, keepdims=True)
    return jnp.where(amax == 0, jnp.float32(1), amax * jnp.float32(1.0 / bound))


def range_scale(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """``(scale, zero)`` of asymmetric int8 over ``axes`` (kept as size-1 dims): the
    range ``[min(x, 0), max(x, 0)]`` spread over the 255 steps of ``[-128, 127]``,
    ``scale = (high - low) * (1 / 255)`` in float32 (1 where the values are all zero)
    and ``zero = round(-low / scale) - 128`` in int32, the integer zero maps to; ``x =
    (q - zero) * scale`` up to rounding."""
    x = x.astype(jnp.float32)
    low = jnp.minimum(jnp.min(x, axis=axes, keepdims=True), 0)
    high = jnp.maximum(jnp.max(x, axis=axes, keepdims=True), 0)
    span = high - low
    scale = jnp.where(span == 0, jnp.float32(1), span * jnp.float32(1.0 / 255))  # NaN stays
    zero = jnp.round(-low / scale).astype(jnp.int32) - 128
    return scale, jnp.clip(zero, -128, 127)


def quantize_to(x: jax.Array, scale: jax.Array, dtype: Any, low: float | None = None,
                high: float | None = None) -> jax.Array:
    """``x / scale`` rounded to ``dtype``: to the nearest integer (ties to even) and
    clipped to ``[low, high]`` (int8's ``[-127, 127]`` by default) for an integer dtype;
    clipped to +-448 and rounded by the cast for float8."""
    dtype = np.dtype(dtype)
    y = x.astype(jnp.float32) / scale
    if dtype == FLOAT8:
        return jnp.clip(y, -FLOAT8_MAX, FLOAT8_MAX).astype(dtype)
    low = -INT8_MAX if low is None else low
    high = INT8_MAX if high is None else high
    return jnp.clip(jnp.round(y), low, high).astype(dtype)


def pack_int4(q: jax.Array, axis: int) -> jax.Array:
    """int4 values (held in int8, in ``[-8, 7]``) two a byte along ``axis`` (of even
    size): value ``2i`` in the low nibble of byte ``i``, value ``2i + 1`` in the high."""
    axis = axis % q.ndim
    q = jnp.moveaxis(q, axis, -1)
    low = q[..., 0::2].astype(jnp.uint8) & jnp.uint8(0x0F)
    high = (q[..., 1::2].astype(jnp.uint8) & jnp.uint8(0x0F)) << jnp.uint8(4)
    return jnp.moveaxis(low | high, -1, axis)


def unpack_int4(packed: jax.Array, axis: int) -> jax.Array:
    """The int4 values (as int8) of bytes ``pack_int4`` made, ``axis`` twice as long."""
    axis = axis % packed.ndim
    p = jnp.moveaxis(packed, axis, -1)
    # Shifting the nibble to the top of a signed byte and back extends its sign.
    low = jax.lax.shift_right_arithmetic((p << jnp.uint8(4)).astype(jnp.int8), jnp.int8(4))
    high = jax.lax.shift_right_arithmetic(p.astype(jnp.int8), jnp.int8(4))
    both = jnp.stack([low, high], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))
    return jnp.moveaxis(both, -1, axis)


def group_scales(w: jax.Array, axis: int, group: int) -> tuple[jax.Array, jax.Array]:
    """``(q, scale)`` of int4 quantization by groups of ``group`` along ``axis``: ``q``
    int8 in ``[-8, 7]`` of ``w``'s shape, ``scale`` float32 with ``axis`` divided by
    ``group``."""
    axis = axis % w.ndim
    n = w.shape[axis]
    grouped = w.reshape(w.shape[:axis] + (n // group, group) + w.shape[axis + 1:])
    scale = absmax_scale(grouped, (axis + 1,), float(INT4_MAX))
    q = quantize_to(grouped, scale, jnp.int8, INT4_MIN, INT4_MAX)
    return q.reshape(w.shape), jnp.squeeze(scale, axis + 1)


def dequantize_groups(q: jax.Array, scale: jax.Array, axis: int, dtype: Any) -> jax.Array:
    """int4 values (int8, ``axis`` full length) times their groups' scales, in ``dtype``."""
    axis = axis % q.ndim
    groups = scale.shape[axis]
    grouped = q.reshape(q.shape[:axis] + (groups, q.shape[axis] // groups) + q.shape[axis + 1:])
    w = grouped.astype(dtype) * jnp.expand_dims(scale, axis + 1).astype(dtype)
    return w.reshape(q.shape)


def int8_product(q: jax.Array, kernel: jax.Array, axis: int = 0) -> jax.Array:
    """int8 ``q`` ``(..., in)`` times an int8 ``kernel`` whose axis ``axis`` is the
    inputs (``(in, out)``, or ``(out, in)`` with ``axis=1``): ``(..., out)`` int32.

    A product of one row (a decoding step at batch 1) is computed on two, the second
    zeros: XLA's CPU backend rewrites a dot of one row into a multiply-and-reduce in
    int32, converting the whole kernel to int32 at each call (GPT-2's 768 x 50,257
    head: 43 ms), and runs two rows in its int8 matrix product (1.7 ms)."""
    lead = q.shape[:-1]
    one_row = all(isinstance(d, int) for d in lead) and int(np.prod(lead)) == 1
    if one_row:
        q = jnp.pad(q.reshape((1, q.shape[-1])), ((0, 1), (0, 0)))
    dims = (((q.ndim - 1,), (axis,)), ((), ()))
    acc = jax.lax.dot_general(q, kernel, dims, preferred_element_type=jnp.int32)
    return acc[:1].reshape(lead + acc.shape[-1:]) if one_row else acc


def padded_row_flops(rows: Any, inputs: Any, outputs: Any) -> Any:
    """What ``int8_product`` adds to a product of ``rows`` rows (an int or a symbolic
    dim, rows >= 1): for one row, the second row's dot and the pad (XLA counts one for
    it); else nothing."""
    return (2 * inputs * outputs + 1) * dim_max(0, 2 - rows)


@functools.partial(jax.checkpoint, static_argnums=(3, 4, 5, 6), prevent_cse=False)
def dequantized_dot(x, kernel, scale, scheme: str, scale_after: bool, precision, preferred):
    """``x`` (``(..., in)``) times a weight-only scheme's stored 2-d ``kernel`` ``(in,
    out)`` dequantized to ``x``'s dtype: int4 by its groups' scales, the others by one
    scale per column, applied to the kernel or (``scale_after``) to the product.

    Checkpointed: what the backward pass keeps is the stored kernel and its scale,
    dequantized again there, not the float kernel (under a scan over blocks that would
    be every block's frozen kernels again, in float: a QLoRA step holding more than
    the float model's weights). ``preferred``: the product's accumulation dtype (a
    Linear's ``preferred_element_type``), which the result keeps."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    kw = {"precision": precision, "preferred_element_type": preferred}
    if scheme == "int4_weight_only":
        w = dequantize_groups(unpack_int4(kernel, 0), scale, 0, x.dtype)
        return jax.lax.dot_general(x, w, dims, **kw)
    if scale_after:
        y = jax.lax.dot_general(x, kernel.astype(x.dtype), dims, **kw)
        return y * scale.astype(y.dtype)
    w = kernel.astype(x.dtype) * scale.astype(x.dtype)
    return jax.lax.dot_general(x, w, dims, **kw)


def quantize_weight(w: jax.Array, scheme: str, *, reduce: tuple[int, ...], axis: int,
                    group: int | None) -> tuple[jax.Array, jax.Array]:
    """A float weight as ``scheme`` stores it: ``(values, scale)``. ``reduce``: the axes
    one scale covers for int8 and float8 (all but the output channel's; the scale keeps
    only the others); ``axis``: the input axis int4 groups and packs along."""
    if scheme == "int4_weight_only":
        q, scale = group_scales(w, axis, group or 2)
        return pack_int4(q, axis), scale
    dtype = FLOAT8 if scheme == "float8" else np.dtype(jnp.int8)
    scale = absmax_scale(w, reduce, _bound(dtype))
    return quantize_to(w, scale, dtype), jnp.squeeze(scale, reduce)


def _to_quantized_dtype(value: Any, layer: Layer) -> np.dtype:
    dtype = to_dtype(value, layer)
    if dtype not in (np.dtype(jnp.int8), FLOAT8):
        layer.invalid(f"dtype must be int8 or float8_e4m3fn, got {dtype}", DTypeError)
    return dtype


def _to_axes(value: Any, layer: Layer) -> tuple[int, ...]:
    try:
        axes = tuple(int(a) for a in value)
    except (TypeError, ValueError):
        layer.invalid(f"axes must be a tuple of ints, got {value!r}")
    if not axes or len(set(axes)) != len(axes):
        layer.invalid(f"axes must name distinct axes, got {value!r}")
    return axes


@register("quantize")
@dataclasses.dataclass(frozen=True)
class Quantize(Layer):
    """Casts a float tensor to ``dtype`` (int8 or float8_e4m3fn) with a scale: outputs
    ``(q, scale)``, ``q = round(x / scale)`` (clipped to ``[-127, 127]``; float8: to
    +-448, rounded by the cast) and ``scale = max |x| * (1 / 127)`` (448 for float8) over
    ``axes`` (kept as size-1 dims, float32 whatever ``x``'s dtype: a half-precision
    scale of small values would round to zero), computed at each call. ``axes=(-1,)``
    gives one scale per token; a layer reading ``q`` multiplies its result by
    ``scale``. ``x = q * scale`` up to rounding.

    ``zero_point=True`` (int8; asymmetric, for inputs of one sign mostly, such as a
    GELU's or ReLU's output): outputs ``(q, scale, zero)``, the range ``[min(x, 0),
    max(x, 0)]`` over ``axes`` spread over the 255 steps of ``[-128, 127]``: ``scale =
    (high - low) / 255``, ``zero = round(-low / scale) - 128`` (int32, the integer 0.0
    maps to), ``q = clip(round(x / scale) + zero, -128, 127)``, so ``x = (q - zero) *
    scale`` up to rounding; a layer reading them subtracts ``zero`` times its kernel's
    column sums from its int32 product.

    State (non-trainable): ``scale``, a float32 scalar, the static scale calibration
    sets (``mg.quantize_weights(..., calibration=batches)``), and with ``zero_point``
    ``zero``, an int32 scalar. Where ``scale`` is positive it is used for every value
    (broadcast to the scale's shape; values beyond the range clip) instead of the
    per-call scale (and ``zero`` instead of the per-call zero); ``init`` makes it 0:
    per-call scales.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.Quantize("int8")(mg.Input(("batch", 8)))
      (SymbolicTensor(i8[batch,8], from 'quantize'), SymbolicTensor(f32[batch,1], from 'quantize'#1))
    """

    dtype: np.dtype = field(default="int8", converter=_to_quantized_dtype)
    axes: tuple[int, ...] = field(default=(-1,), converter=_to_axes)
    zero_point: bool = False

    #: Its output carries no usable gradient to its input (``mg.train`` reads it).
    casts_activations = True

    def validate(self):
        super().validate()
        if not isinstance(self.zero_point, bool):
            self.invalid(f"zero_point must be a bool, got {self.zero_point!r}")
        if self.zero_point and self.dtype != np.dtype(jnp.int8):
            self.invalid("zero_point is for int8, not float8")

    def _axes(self, rank: int) -> tuple[int, ...]:
        axes = tuple(a % rank for a in self.axes if -rank <= a < rank)
        if len(axes) != len(self.axes) or len(set(axes)) != len(axes):
            raise ShapeError(f"axes {self.axes} do not name distinct axes of a rank-{rank} input",
                             expected=f"a tensor of rank > {max(abs(a) for a in self.axes) - 1}")
        return axes

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        axes = self._axes(x.rank)
        scale = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        outputs = (x.with_dtype(self.dtype), x.with_shape(scale).with_dtype(np.dtype(jnp.float32)))
        if self.zero_point:
            outputs = outputs + (outputs[1].with_dtype(np.dtype(jnp.int32)),)
        return outputs

    def state_specs(self, inputs):
        specs = {"scale": ParamSpec((), initializers.zeros, (), dtype=np.dtype(jnp.float32))}
        if self.zero_point:
            specs["zero"] = ParamSpec((), initializers.zeros, (), dtype=np.dtype(jnp.int32))
        return specs

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        static = state["scale"]
        if self.zero_point:
            scale, zero = range_scale(x, self._axes(x.ndim))
            scale = jnp.where(static > 0, static, scale)
            zero = jnp.where(static > 0, state["zero"], zero)
            shifted = jnp.round(x.astype(jnp.float32) / scale) + zero.astype(jnp.float32)
            q = jnp.clip(shifted, -128, 127).astype(jnp.int8)
            return (q, scale, zero), state
        scale = absmax_scale(x, self._axes(x.ndim), _bound(self.dtype))
        scale = jnp.where(static > 0, static, scale)
        return (quantize_to(x, scale, self.dtype), scale), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per element: the absolute value and the max reducing it, the divide, the
        two-sided clip and the convert, and the round for int8; per scale, the multiply
        and the select of the all-zero guard (its compare folds into the reduction), as
        XLA counts them; the clip's two bounds for int8. With a zero point: the min and
        the max instead of the absolute value, the add of the zero, and per scale the
        range, the zero's round, convert and clip."""
        (x,), scale = inputs, outputs[1]
        if self.zero_point:  # the min and max, the add of the zero; per scale the range
            count = 8 * size(x) + 14 * size(scale) + 4
        elif self.dtype == FLOAT8:
            count = 6 * size(x) + 3 * size(scale) + 1
        else:
            count = 7 * size(x) + 3 * size(scale) + 3
        if x.dtype != np.float32:  # x converted to float32
            count = count + size(x)
        return count
