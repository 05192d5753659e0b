"""Cast: converts a tensor's dtype. The dtype policy inserts these as graph nodes."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.registry import register
from .base import Layer, expect_count, field, to_dtype
from .flops import size

__all__ = ["Cast", "cast"]


@register("cast")
@dataclasses.dataclass(frozen=True)
class Cast(Layer):
    """``x.astype(dtype)``. ``inserted`` marks the casts a policy added (which the
    compiler may fold away); casts the user wrote are kept."""

    dtype: np.dtype = field(converter=to_dtype)
    inserted: bool = False

    def infer(self, inputs):
        expect_count(inputs, 1)
        return (inputs[0].with_dtype(self.dtype),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (inputs[0].astype(self.dtype),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """One convert per element, as XLA counts it; none to the same dtype."""
        return 0 if inputs[0].dtype == self.dtype else size(outputs[0])


def cast(x, dtype):
    """``Cast(dtype)(x)``: an explicit dtype conversion in the graph."""
    return Cast(dtype)(x)
