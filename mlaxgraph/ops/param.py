"""Param: a learned tensor that is not a function of the inputs (ViT's CLS token, a
learned position table)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ..core.errors import DTypeError
from ..core.registry import register
from ..core.specs import TensorSpec
from .base import Initializer, Layer, ParamSpec, expect_count, field, to_axes, to_dtype, to_ints
from .flops import size

__all__ = ["Param"]


def normal_002(key, shape, dtype):
    """Normal with standard deviation 0.02, as GPT-2's and ViT's learned tables."""
    return 0.02 * jax.random.normal(key, shape, dtype)


@register("param")
@dataclasses.dataclass(frozen=True)
class Param(Layer):
    """A learned tensor of ``shape``, its weight named ``value``: called with no
    inputs, ``ops.Param((1, 1, d), name="cls")()``; the output is the weight in
    ``dtype`` (float32 by default). Default initializer: normal, standard deviation
    0.02. Logical axes (for sharding): ``axes`` (one name or None per dim; none by
    default).

    Example:
      >>> from mlaxgraph import ops
      >>> ops.Param((1, 1, 64), name="cls")()
      SymbolicTensor(f32[1,1,64], from 'cls')
    """

    shape: tuple[int, ...] = field(converter=to_ints("shape"))
    init: Initializer | None = None
    dtype: np.dtype = field(default="float32", converter=to_dtype)
    axes: tuple[str | None, ...] | None = field(default=None, converter=to_axes)

    def validate(self):
        if any(d < 1 for d in self.shape):
            self.invalid(f"shape must hold positive dims, got {self.shape}")
        if not np.issubdtype(self.dtype, np.floating) and self.dtype.name != "bfloat16":
            self.invalid(f"dtype must be a float dtype, got {self.dtype}", DTypeError)
        if self.axes is not None and len(self.axes) != len(self.shape):
            self.invalid(f"axes name {len(self.axes)} dims, the shape has {len(self.shape)}")

    def infer(self, inputs):
        expect_count(inputs, 0)
        return (TensorSpec(self.shape, self.dtype),)

    def param_specs(self, inputs):
        return {"value": ParamSpec(self.shape, self.init or normal_002, self.axes)}

    def output_axes(self, input_axes, inputs, outputs):
        return (self.axes or (None,) * len(self.shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (params["value"].astype(self.dtype),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0 if np.dtype(param_dtype) == self.dtype else size(outputs[0])

    def backward_flops(self, inputs, outputs, forward, *, input_gradients=True):
        return forward
