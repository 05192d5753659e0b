"""Shape ops: Flatten, Reshape, concat, transpose, split. Flatten and Reshape keep the
leading (batch) axis, as in Keras."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from .base import Layer, expect_count, field, same_dtype, to_ints

__all__ = ["Flatten", "Reshape", "Concat", "Transpose", "Split", "flatten", "reshape", "concat",
           "transpose", "split"]


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

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


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

    shape: tuple[int, ...] = field(converter=to_ints("shape"))

    def validate(self):
        if self.shape.count(-1) > 1 or any(d < -1 for d in self.shape):
            self.invalid(f"shape may hold one -1 and otherwise dims >= 0, got {self.shape!r}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank < 1:
            raise ShapeError("needs a leading batch axis", expected="rank >= 1")
        size = _product(x.shape[1:])
        known = math.prod(d for d in self.shape if d != -1)
        target = self.shape
        if -1 in target:
            if known == 0 or (size % known) != 0:
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

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


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
            others = [(a, b) for i, (a, b) in enumerate(zip(spec.shape, inputs[0].shape)) if i != axis]
            if spec.rank != rank or any(a != b for a, b in others):
                pattern = shape_str(inputs[0].shape[:axis] + ("*",) + inputs[0].shape[axis + 1:])
                raise ShapeError(f"all dims but axis {self.axis} must match",
                                 expected=", ".join(pattern for _ in inputs))
        total = inputs[0].shape[axis]
        for spec in inputs[1:]:
            total = total + spec.shape[axis]
        shape = list(inputs[0].shape)
        shape[axis] = total
        return (inputs[0].with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.concatenate(inputs, axis=self.axis),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


def concat(tensors: Sequence, axis: int = -1):
    """``Concat(axis)(*tensors)``."""
    return Concat(axis)(*tensors)


@register("transpose")
@dataclasses.dataclass(frozen=True)
class Transpose(Layer):
    """Permutes all axes, the batch axis included, as ``jnp.transpose(x, perm)``."""

    perm: tuple[int, ...] = field(converter=to_ints("perm"))

    def validate(self):
        if sorted(self.perm) != list(range(len(self.perm))):
            self.invalid(f"perm must be a permutation of 0..{len(self.perm) - 1}, got {self.perm!r}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank != len(self.perm):
            raise ShapeError(f"perm {self.perm} has {len(self.perm)} axes, the input {x.rank}",
                             expected=f"rank {len(self.perm)}")
        return (x.with_shape(tuple(x.shape[a] for a in self.perm)),)

    def output_axes(self, input_axes, inputs, outputs):
        return (tuple(input_axes[0][a] for a in self.perm),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.transpose(inputs[0], self.perm),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


def transpose(x, perm):
    """``Transpose(perm)(x)``."""
    return Transpose(tuple(perm))(x)


def _sections(value: Any, layer: Layer) -> int | tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return tuple(int(i) for i in value)
    except (TypeError, ValueError):
        layer.invalid(f"sections must be an int or a tuple of indices, got {value!r}")


@register("split")
@dataclasses.dataclass(frozen=True)
class Split(Layer):
    """Splits along ``axis`` into ``sections`` equal parts (an int) or at the given
    indices (a tuple), as ``jnp.split``; one output per part."""

    sections: int | tuple[int, ...] = field(converter=_sections)
    axis: int = -1

    def validate(self):
        if isinstance(self.sections, int):
            if self.sections < 1:
                self.invalid(f"sections must be positive, got {self.sections}")
        else:
            if list(self.sections) != sorted(self.sections) or any(i < 0 for i in self.sections):
                self.invalid(f"split indices must be sorted and >= 0, got {self.sections}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if not -x.rank <= self.axis < x.rank:
            raise ShapeError(f"axis {self.axis} is out of range for rank {x.rank}",
                             expected=f"rank > {self.axis}")
        axis = self.axis % x.rank
        size = x.shape[axis]
        if is_symbolic(size):
            raise ShapeError("the split axis must have a known size", expected="a concrete dim")
        if isinstance(self.sections, int):
            if size % self.sections:
                raise ShapeError(f"{size} does not split into {self.sections} equal parts",
                                 expected=f"a size divisible by {self.sections}")
            sizes = [size // self.sections] * self.sections
        else:
            bounds = [0, *(min(i, size) for i in self.sections), size]
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        shape = list(x.shape)
        outputs = []
        for s in sizes:
            shape[axis] = s
            outputs.append(x.with_shape(shape))
        return tuple(outputs)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return tuple(jnp.split(inputs[0], self.sections, axis=self.axis)), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


def split(x, sections, axis: int = -1):
    """``Split(sections, axis)(x)``: a tuple of symbolic tensors."""
    return Split(sections, axis)(x)
