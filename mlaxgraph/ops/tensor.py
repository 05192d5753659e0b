"""Small tensor ops real models use: identity, negation, where, pad, squeeze and
expand_dims."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, MlaxGraphError, ShapeError
from ..core.registry import register
from ..core.specs import Dim, as_dim, is_symbolic, shape_str, substitute
from .base import Layer, expect_count, field, same_dtype
from .elementwise import Scalar, broadcast_shapes, to_scalar
from .flops import size

__all__ = ["Identity", "Neg", "Where", "Pad", "Squeeze", "ExpandDims", "identity", "where",
           "pad", "squeeze", "expand_dims"]


def _axis_tuple(value: Any, layer: Layer) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    try:
        return tuple(int(a) for a in value)
    except (TypeError, ValueError):
        layer.invalid(f"axis must be an int or a tuple of ints, got {value!r}")


def _check_axes(axes, rank):
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"axis {a} is out of range for rank {rank}", expected=f"rank > {a}")
    normalized = [a % rank for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ShapeError(f"axes {axes} name one axis twice", expected="distinct axes")
    return normalized


@register("identity")
@dataclasses.dataclass(frozen=True)
class Identity(Layer):
    """Returns its input (a named passthrough, as ``nn.Identity``)."""

    def infer(self, inputs):
        expect_count(inputs, 1)
        return (inputs[0],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (inputs[0],), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


@register("neg")
@dataclasses.dataclass(frozen=True)
class Neg(Layer):
    """``-x`` (unary minus of a symbolic tensor)."""

    def infer(self, inputs):
        expect_count(inputs, 1)
        if inputs[0].dtype == np.dtype(bool):
            raise DTypeError("cannot negate a boolean tensor", expected="a number dtype")
        return (inputs[0],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.negative(inputs[0]),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return size(outputs[0])


@register("where")
@dataclasses.dataclass(frozen=True)
class Where(Layer):
    """``where(condition, x, y)``: ``x`` where the boolean condition holds, else ``y``,
    broadcast together. ``x`` or ``y`` may be a Python scalar (``x_constant`` /
    ``y_constant``), weakly typed: it takes the other's dtype."""

    x_constant: Scalar | None = field(default=None, converter=to_scalar)
    y_constant: Scalar | None = field(default=None, converter=to_scalar)

    def infer(self, inputs):
        tensors = 1 + (self.x_constant is None) + (self.y_constant is None)
        expect_count(inputs, tensors)
        cond = inputs[0]
        if cond.dtype != np.dtype(bool):
            raise DTypeError(f"the condition must be boolean, got {cond.dtype}",
                             expected=f"bool{shape_str(cond.shape)}")
        values = inputs[1:]
        if not values:
            raise ShapeError("x and y cannot both be constants", expected="a tensor for x or y")
        same_dtype(values)
        shape = cond.shape
        for v in values:
            shape = broadcast_shapes(shape, v.shape)
            if shape is None:
                raise ShapeError("the condition, x and y do not broadcast",
                                 expected=", ".join(shape_str(s.shape) for s in inputs))
        return (values[0].with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        cond, rest = inputs[0], list(inputs[1:])
        dtype = rest[0].dtype
        # Constants are made in the tensor's dtype (no convert, no promotion).
        x = np.asarray(self.x_constant, dtype) if self.x_constant is not None else rest.pop(0)
        y = np.asarray(self.y_constant, dtype) if self.y_constant is not None else rest.pop(0)
        return (jnp.where(cond, x, y),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return size(outputs[0])  # a select per element


def _pad_amount(value: Any) -> Dim:
    if isinstance(value, str) or hasattr(value, "_get_vars"):  # a symbolic dim
        return as_dim(value)
    return int(value)


def _pad_width(value: Any, layer: Layer) -> tuple[tuple[Dim, Dim], ...]:
    try:
        pairs = tuple((_pad_amount(lo), _pad_amount(hi)) for lo, hi in value)
    except (TypeError, ValueError, MlaxGraphError):
        layer.invalid(f"pad_width must hold one (low, high) pair of ints or dims per dim, got {value!r}")
    if any(not is_symbolic(a) and a < 0 for pair in pairs for a in pair):
        layer.invalid(f"pad_width must be >= 0, got {value!r}")
    return pairs


def _zero(amount: Dim) -> bool:
    return not is_symbolic(amount) and amount == 0


@register("pad")
@dataclasses.dataclass(frozen=True)
class Pad(Layer):
    """Pads each dim by its ``(low, high)`` pair, as ``jnp.pad``: with ``value``
    (``mode="constant"``), or by reflecting (``"reflect"``) or repeating the edge
    (``"edge"``). An amount may be a symbolic dim (an expression of the input's dims,
    ``skip.shape[1] - x.shape[1]``: pad to another tensor's size), bound when called.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x, skip = mg.Input(("batch", "h", 4)), mg.Input(("batch", "g", 4))
      >>> ops.pad(x, ((0, 0), (0, skip.shape[1] - x.shape[1]), (0, 0)))
      SymbolicTensor(f32[batch,g,4], from 'pad')
    """

    pad_width: tuple[tuple[Dim, Dim], ...] = field(converter=_pad_width)
    value: float = 0.0
    mode: str = "constant"

    symbolic_fields = ("pad_width",)

    def bind(self, dims):
        if not dims or all(not is_symbolic(a) for pair in self.pad_width for a in pair):
            return self
        bound = dataclasses.replace(self, pad_width=tuple(substitute(pair, dims) for pair in self.pad_width))
        object.__setattr__(bound, "_created_at", self.__dict__.get("_created_at"))
        return bound

    def validate(self):
        if self.mode not in ("constant", "reflect", "edge"):
            self.invalid(f"mode must be 'constant', 'reflect' or 'edge', got {self.mode!r}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if len(self.pad_width) != x.rank:
            raise ShapeError(f"pad_width has {len(self.pad_width)} pairs for a rank-{x.rank} input",
                             expected=f"{x.rank} (low, high) pairs")
        shape = []
        for d, (lo, hi) in zip(x.shape, self.pad_width):
            if _zero(lo) and _zero(hi):
                shape.append(d)
                continue
            if (self.mode == "reflect" and not any(map(is_symbolic, (d, lo, hi)))
                    and max(lo, hi) >= d):
                raise ShapeError(f"reflect padding of {max(lo, hi)} needs a dim above it, got {d}",
                                 expected=f"dims > {max(lo, hi)}")
            shape.append(d + lo + hi)
        return (x.with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        if any(not is_symbolic(a) and a < 0 for pair in self.pad_width for a in pair):
            raise ShapeError(f"pad_width {self.pad_width} is negative once bound: the input is larger "
                             f"than the size it is padded to", expected="pad amounts >= 0")
        if self.mode == "constant":
            return (jnp.pad(x, self.pad_width, constant_values=np.array(self.value, x.dtype)),), state
        return (jnp.pad(x, self.pad_width, mode=self.mode),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


def pad(x, pad_width, value: float = 0.0, mode: str = "constant"):
    """``Pad(pad_width, value, mode)(x)``: ``pad_width`` one ``(low, high)`` pair per dim."""
    return Pad(pad_width, value, mode)(x)


@register("squeeze")
@dataclasses.dataclass(frozen=True)
class Squeeze(Layer):
    """Removes the given axes, each of size 1."""

    axis: tuple[int, ...] = field(converter=_axis_tuple)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        axes = _check_axes(self.axis, x.rank)
        for a in axes:
            if x.shape[a] != 1:
                raise ShapeError(f"axis {a} has size {x.shape[a]}, not 1",
                                 expected=f"size 1 at axes {self.axis}")
        return (x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes)),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.squeeze(inputs[0], self.axis),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


@register("expand_dims")
@dataclasses.dataclass(frozen=True)
class ExpandDims(Layer):
    """Inserts axes of size 1 at the given positions of the output, as
    ``jnp.expand_dims``."""

    axis: tuple[int, ...] = field(converter=_axis_tuple)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        rank = x.rank + len(self.axis)
        axes = _check_axes(self.axis, rank)
        dims = iter(x.shape)
        return (x.with_shape(tuple(1 if i in axes else next(dims) for i in range(rank))),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.expand_dims(inputs[0], self.axis),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


def identity(x):
    """``Identity()(x)``."""
    return Identity()(x)


def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y``; either may be a Python scalar."""
    scalar = (bool, int, float)
    x_const = x if isinstance(x, scalar) else None
    y_const = y if isinstance(y, scalar) else None
    tensors = [t for t in (x, y) if not isinstance(t, scalar)]
    return Where(x_const, y_const)(condition, *tensors)


def squeeze(x, axis):
    """``Squeeze(axis)(x)``."""
    return Squeeze(axis)(x)


def expand_dims(x, axis):
    """``ExpandDims(axis)(x)``."""
    return ExpandDims(axis)(x)
