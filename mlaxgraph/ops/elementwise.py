"""Binary elementwise ops with NumPy broadcasting and no dtype promotion."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from .base import Layer, expect_count, same_dtype
from .flops import size

__all__ = ["Add", "Sub", "Mul", "add", "sub", "mul", "broadcast_shapes"]


def broadcast_shapes(a, b):
    """NumPy broadcasting of two shapes that may hold symbolic dims; None if they clash."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif not is_symbolic(x) and x == 1:
            out.append(y)
        elif not is_symbolic(y) and y == 1:
            out.append(x)
        else:
            return None
    return tuple(out)


class Binary(Layer):
    def infer(self, inputs):
        expect_count(inputs, 2)
        same_dtype(inputs)
        a, b = inputs
        shape = broadcast_shapes(a.shape, b.shape)
        if shape is None:
            raise ShapeError("the shapes do not broadcast",
                             expected=f"{shape_str(a.shape)} and a shape broadcastable to it")
        return (a.with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        a, b = inputs
        return (self.fn(a, b),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return size(outputs[0])  # one per output element; broadcasting is free


@register("add")
@dataclasses.dataclass(frozen=True)
class Add(Binary):
    fn = staticmethod(jnp.add)


@register("sub")
@dataclasses.dataclass(frozen=True)
class Sub(Binary):
    fn = staticmethod(jnp.subtract)


@register("mul")
@dataclasses.dataclass(frozen=True)
class Mul(Binary):
    fn = staticmethod(jnp.multiply)


def add(a, b):
    return Add()(a, b)


def sub(a, b):
    return Sub()(a, b)


def mul(a, b):
    return Mul()(a, b)
