"""CausalMask: the lower-triangular mask of a decoder's self-attention."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import TensorSpec
from .base import Layer, expect_count
from .flops import size

__all__ = ["CausalMask", "causal_mask"]


@register("causal_mask")
@dataclasses.dataclass(frozen=True)
class CausalMask(Layer):
    """A boolean ``(length, length)`` lower-triangular mask for a ``(batch, length, ...)``
    input: position ``i`` attends to positions ``<= i``."""

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank < 2:
            raise ShapeError("needs a (batch, length, ...) input", expected="rank >= 2")
        return (TensorSpec((x.shape[1], x.shape[1]), np.dtype(bool)),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        length = inputs[0].shape[1]
        return (jnp.tril(jnp.ones((length, length), bool)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 2 * size(outputs[0])  # compare of two iotas, select


def causal_mask(x):
    """``CausalMask()(x)``: the mask that stops each position seeing later ones."""
    return CausalMask()(x)
