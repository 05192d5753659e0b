"""MatMul: ``a @ b`` of two symbolic tensors, as ``jnp.matmul``."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import shape_str
from .base import Layer, expect_count, same_dtype
from .elementwise import broadcast_shapes
from .flops import size

__all__ = ["MatMul", "matmul"]


@register("matmul")
@dataclasses.dataclass(frozen=True)
class MatMul(Layer):
    """``a @ b``: contracts the last axis of ``a`` with the second-to-last of ``b``
    (the last when ``b`` has rank 1), leading axes broadcast, as ``jnp.matmul``.

    Example:
      >>> import mlaxgraph as mg
      >>> q, k = mg.Input(("batch", 8, 16)), mg.Input(("batch", 16, 8))
      >>> q @ k
      SymbolicTensor(f32[batch,8,8], from 'matmul')
    """

    def infer(self, inputs):
        expect_count(inputs, 2)
        same_dtype(inputs)
        a, b = inputs
        if a.rank < 1 or b.rank < 1:
            raise ShapeError("matmul needs inputs of rank >= 1", expected="rank >= 1")
        a_shape = (1,) + a.shape if a.rank == 1 else a.shape
        b_shape = b.shape + (1,) if b.rank == 1 else b.shape
        if not a_shape[-1] == b_shape[-2]:
            raise ShapeError(f"the contracted dims differ: {a_shape[-1]} and {b_shape[-2]}",
                             expected=f"{shape_str(a.shape)} @ [...,{a_shape[-1]},n]")
        batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
        if batch is None:
            raise ShapeError("the leading (batch) dims do not broadcast",
                             expected=f"{shape_str(a.shape)} @ {shape_str(a_shape[:-2])}+[k,n]")
        shape = batch + ((a_shape[-2],) if a.rank > 1 else ()) + ((b_shape[-1],) if b.rank > 1 else ())
        return (a.with_shape(shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.matmul(*inputs),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``2 * k`` per output element."""
        return 2 * size(outputs[0]) * inputs[0].shape[-1]


def matmul(a, b):
    """``MatMul()(a, b)``, as ``a @ b``."""
    return MatMul()(a, b)
