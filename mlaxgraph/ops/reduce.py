"""Reductions over axes: ``ops.sum``, ``ops.mean``, ``ops.max`` (as ``jnp``'s)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError
from ..core.registry import register
from .base import Layer, expect_count, field
from .flops import size, upcast_sum
from .tensor import _check_axes

__all__ = ["Sum", "Mean", "Max", "sum", "mean", "max"]


def _axes(value: Any, layer: Layer) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    try:
        return tuple(int(a) for a in value)
    except (TypeError, ValueError):
        layer.invalid(f"axis must be None, an int or a tuple of ints, got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Reduce(Layer):
    """Reduces over ``axis`` (all axes when None); ``keepdims`` keeps them as size 1."""

    axis: tuple[int, ...] | None = field(default=None, converter=_axes)
    keepdims: bool = False

    def _reduced(self, x):
        return list(range(x.rank)) if self.axis is None else _check_axes(self.axis, x.rank)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        axes = self._reduced(x)
        if self.keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        dtype = jax.eval_shape(lambda v: self.fn(v, axis=None),
                               jax.ShapeDtypeStruct((1,), x.dtype)).dtype
        return (x.with_shape(shape).with_dtype(dtype),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (self.fn(inputs[0], axis=self.axis, keepdims=self.keepdims),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """A reduction folds ``input - output`` elements; sums and means of 16-bit
        floats add the converts to float32 and back."""
        (x,), (y,) = inputs, outputs
        return size(x) - size(y) + self.extra_flops(x, y)

    def extra_flops(self, x, y):
        return 0


@register("sum")
@dataclasses.dataclass(frozen=True)
class Sum(_Reduce):
    fn = staticmethod(jnp.sum)

    def extra_flops(self, x, y):
        if x.dtype == np.dtype(bool):
            return size(x)  # the convert to int32
        return upcast_sum(size(x), size(y), x.dtype)


@register("mean")
@dataclasses.dataclass(frozen=True)
class Mean(_Reduce):
    fn = staticmethod(jnp.mean)

    def infer(self, inputs):
        if inputs and not inputs[0].is_float:
            raise DTypeError(f"takes a float input, got {inputs[0].dtype}",
                             expected="a float dtype; cast with ops.cast")
        return super().infer(inputs)

    def extra_flops(self, x, y):
        return size(y) + upcast_sum(size(x), size(y), x.dtype)  # the divide


@register("max")
@dataclasses.dataclass(frozen=True)
class Max(_Reduce):
    fn = staticmethod(jnp.max)


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001 - mirrors jnp.sum
    """``Sum(axis, keepdims)(x)``."""
    return Sum(axis, keepdims)(x)


def mean(x, axis=None, keepdims: bool = False):
    """``Mean(axis, keepdims)(x)``."""
    return Mean(axis, keepdims)(x)


def max(x, axis=None, keepdims: bool = False):  # noqa: A001 - mirrors jnp.max
    """``Max(axis, keepdims)(x)``."""
    return Max(axis, keepdims)(x)
