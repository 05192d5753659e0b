"""``Dequantize``: the node after a quantized layer that turns its int32 accumulator
back into floats, so the change of precision back is as visible as ``Quantize``'s."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from .activation import activation_caveat, activation_flops, apply_activation, to_activation
from .base import Layer, field, to_optional_dtype
from .flops import size

__all__ = ["Dequantize"]


@register("dequantize")
@dataclasses.dataclass(frozen=True)
class Dequantize(Layer):
    """The float result of a quantized layer's product: inputs ``(acc, scale,
    kernel_scale[, bias])``, output ``activation(acc * scale * kernel_scale + bias)``
    computed in float32 and cast to ``dtype`` (the layer's float input's, which
    ``mg.quantize`` gives; None: ``scale``'s). It is precision-sensitive: a
    half-precision policy leaves its float32 inputs as they are (a float8 product's
    accumulator exceeds float16's range, a per-token scale of small values is below it)
    and casts its result for the layers after it.

    ``acc``: the layer's accumulator ``(..., features)`` (int32 from an int8 x int8
    product; float32 from float8); ``scale``: the ``Quantize`` node's scale of the
    layer's input (one per token or example, broadcasting against ``acc``);
    ``kernel_scale`` and ``bias``: the layer's ``(features,)`` per-channel scales and
    bias, which the layer passes on (its weights keep their paths). ``axis``: the
    channel axis of ``acc`` (-1; 1 for a channels-first Conv). ``mg.quantize`` puts
    one, ``<layer>.dequantize``, after each layer that reads a quantized input.
    """

    activation: str | None = field(default=None, converter=to_activation)
    axis: int = -1
    dtype: np.dtype | None = field(default=None, converter=to_optional_dtype)

    precision_sensitive = True

    def validate(self):
        super().validate()
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            self.invalid(f"axis must be an int, got {self.axis!r}")

    def xla_cost_caveat(self, inference_mode):
        return activation_caveat(self.activation)

    def infer(self, inputs):
        if len(inputs) not in (3, 4):
            raise ShapeError(f"Dequantize reads (acc, scale, kernel_scale[, bias]), got "
                             f"{len(inputs)} input(s)", expected="3 or 4 tensors")
        acc, scale, channel = inputs[:3]
        if not (acc.dtype == np.dtype(jnp.int32) or acc.is_float) or not scale.is_float:
            raise DTypeError(f"Dequantize reads an int32 (or float) accumulator and a float "
                             f"scale, got {acc.dtype} and {scale.dtype}",
                             expected="int32, float32")
        if not -acc.rank <= self.axis < acc.rank:
            raise ShapeError(f"axis {self.axis} is not an axis of the rank-{acc.rank} accumulator")
        features = acc.shape[self.axis]
        for v in inputs[2:]:
            if v.shape != (features,):
                raise ShapeError(f"the per-channel inputs must be ({features},), got {v}",
                                 expected=f"[{features}]")
        return (acc.with_dtype(self.dtype or scale.dtype),)

    def _channels(self, v, rank: int):
        axis = self.axis % rank
        return v.reshape((-1,) + (1,) * (rank - 1 - axis))

    def apply(self, params, state, inputs, *, rng, inference_mode):
        acc, scale, channel = inputs[:3]
        y = acc.astype(jnp.float32) * scale.astype(jnp.float32) \
            * self._channels(channel.astype(jnp.float32), acc.ndim)
        if len(inputs) == 4:
            y = y + self._channels(inputs[3].astype(y.dtype), acc.ndim)
        return (apply_activation(self.activation, y.astype(self.dtype or scale.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per value: the accumulator's convert and two multiplies, the bias add; the
        activation."""
        (y,) = outputs
        count = 2 * size(y) + (size(y) if len(inputs) == 4 else 0)
        if np.dtype(inputs[0].dtype) != np.float32:
            count = count + size(y)  # the accumulator's convert
        if np.dtype(inputs[1].dtype) != np.float32:
            count = count + size(y)  # the cast back
        return count + activation_flops(self.activation, y)
