"""Shape ops: Flatten, Reshape, concat. The leading (batch) axis is kept by Flatten and
Reshape, as in Keras."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax.numpy as jnp

from ..errors import ShapeError
from ..specs import is_symbolic, shape_str
from .base import Layer, expect_count, same_dtype
from .registry import register

__all__ = ["Flatten", "Reshape", "Concat", "flatten", "reshape", "concat"]


def _product(dims):
    result = 1
    for d in dims:
        result = result * d
    return result


@register("flatten")
@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    """``(batch, d1, d2, ...) -> (batch, d1 * d2 * ...)``."""

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank < 1:
            raise ShapeError("needs a leading batch axis", expected="rank >= 1")
        return (x.with_shape((x.shape[0], _product(x.shape[1:]))),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        return (x.reshape(x.shape[0], -1),), state


def flatten(x):
    """``Flatten()(x)``."""
    return Flatten()(x)


@register("reshape")
@dataclasses.dataclass(frozen=True)
class Reshape(Layer):
    """Reshapes every axis but the leading (batch) one to ``shape``; one entry may be -1.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.Reshape((7, 7, -1))(mg.Input(("batch", 1568)))
      SymbolicTensor(f32[batch,7,7,32], from 'reshape')
    """

    shape: tuple[int, ...]

    def validate(self):
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            self.invalid(f"shape must be a tuple of ints, got {self.shape!r}")
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            self.invalid(f"shape may hold one -1 and otherwise dims >= 0, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank < 1:
            raise ShapeError("needs a leading batch axis", expected="rank >= 1")
        size = _product(x.shape[1:])
        known = math.prod(d for d in self.shape if d != -1)
        target = self.shape
        if -1 in target:
            if known == 0 or is_symbolic(size) or size % known:
                raise ShapeError(f"cannot infer -1: {size} elements per example do not divide "
                                 f"by {known}", expected=f"a multiple of {known} elements")
            target = tuple(size // known if d == -1 else d for d in target)
        elif is_symbolic(size) or size != known:
            raise ShapeError(f"{size} elements per example cannot take the shape {self.shape}",
                             expected=f"{x.dtype}[{x.shape[0]},... {known} elements]")
        return (x.with_shape((x.shape[0], *target)),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        return (x.reshape((x.shape[0], *self.shape)),), state


def reshape(x, shape):
    """``Reshape(shape)(x)``: the batch axis is kept."""
    return Reshape(tuple(shape))(x)


@register("concat")
@dataclasses.dataclass(frozen=True)
class Concat(Layer):
    """Concatenates its inputs along ``axis``; other dims and dtypes must match."""

    axis: int = -1

    def infer(self, inputs):
        if not inputs:
            raise ShapeError("needs at least one input", expected="1 or more tensors")
        same_dtype(inputs)
        rank = inputs[0].rank
        if not -rank <= self.axis < rank:
            raise ShapeError(f"axis {self.axis} is out of range for rank {rank}",
                             expected=f"rank > {self.axis}")
        axis = self.axis % rank
        for spec in inputs[1:]:
            if spec.rank != rank or any(a != b for i, (a, b) in enumerate(zip(spec.shape, inputs[0].shape)) if i != axis):
                raise ShapeError(f"all dims but axis {self.axis} must match",
                                 expected=", ".join(shape_str(inputs[0].shape[:axis] + ("*",) + inputs[0].shape[axis + 1:]) for _ in inputs))
        total = inputs[0].shape[axis]
        for spec in inputs[1:]:
            total = total + spec.shape[axis]
        shape = list(inputs[0].shape)
        shape[axis] = total
        return (inputs[0].with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.concatenate(inputs, axis=self.axis),), state


def concat(tensors: Sequence, axis: int = -1):
    """``Concat(axis)(*tensors)``."""
    return Concat(axis)(*tensors)
