"""BatchNorm. Precision-sensitive: a half-precision policy runs it in float32."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from ..errors import ShapeError
from ..specs import is_symbolic
from . import initializers
from .base import Layer, ParamSpec, cast_params, expect_count, expect_float
from .registry import register

__all__ = ["BatchNorm"]


@register("batch_norm")
@dataclasses.dataclass(frozen=True)
class BatchNorm(Layer):
    """Batch normalization over every axis but ``axis``.

    Params: ``scale`` (ones), ``bias`` (zeros), each ``(features,)``; state ``mean``
    (zeros) and ``var`` (ones). Training uses the batch mean and biased variance and
    updates ``new = momentum * old + (1 - momentum) * batch``; inference uses the
    running statistics.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.BatchNorm(name="bn")(mg.Input(("batch", 8, 8, 16)))
      SymbolicTensor(f32[batch,8,8,16], from 'bn')
    """

    momentum: float = 0.9
    epsilon: float = 1e-5
    axis: int = -1
    use_scale: bool = True
    use_bias: bool = True

    precision_sensitive = True

    def validate(self):
        if not 0.0 <= float(self.momentum) <= 1.0:
            self.invalid(f"momentum must be in [0, 1], got {self.momentum!r}")
        if not float(self.epsilon) > 0.0:
            self.invalid(f"epsilon must be > 0, got {self.epsilon!r}")
        if not isinstance(self.axis, int):
            self.invalid(f"axis must be an int, got {self.axis!r}")

    def _features(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        if not -x.rank <= self.axis < x.rank:
            raise ShapeError(f"axis {self.axis} is out of range for rank {x.rank}",
                             expected=f"an input of rank > {self.axis if self.axis >= 0 else -self.axis - 1}")
        features = x.shape[self.axis]
        if is_symbolic(features):
            raise ShapeError("the normalized axis must have a known size",
                             expected=f"a concrete dim at axis {self.axis}")
        return features

    def infer(self, inputs):
        self._features(inputs)
        return (inputs[0],)

    def param_specs(self, inputs):
        f = self._features(inputs)
        specs = {}
        if self.use_scale:
            specs["scale"] = ParamSpec((f,), initializers.ones, ("embed",))
        if self.use_bias:
            specs["bias"] = ParamSpec((f,), initializers.zeros, ("embed",))
        return specs

    def state_specs(self, inputs):
        f = self._features(inputs)
        return {"mean": ParamSpec((f,), initializers.zeros, ("embed",)),
                "var": ParamSpec((f,), initializers.ones, ("embed",))}

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        axis = self.axis % x.ndim
        reduce = tuple(i for i in range(x.ndim) if i != axis)
        shape = tuple(x.shape[i] if i == axis else 1 for i in range(x.ndim))
        p = cast_params(params, x.dtype)
        if inference_mode:
            mean = state["mean"].astype(x.dtype)
            var = state["var"].astype(x.dtype)
            new_state = state
        else:
            mean = jnp.mean(x, axis=reduce)
            var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=reduce)
            m = self.momentum
            new_state = {
                "mean": m * state["mean"] + (1.0 - m) * mean.astype(state["mean"].dtype),
                "var": m * state["var"] + (1.0 - m) * var.astype(state["var"].dtype),
            }
        y = (x - mean.reshape(shape)) * lax.rsqrt(var.reshape(shape) + jnp.asarray(self.epsilon, x.dtype))
        if self.use_scale:
            y = y * p["scale"].reshape(shape)
        if self.use_bias:
            y = y + p["bias"].reshape(shape)
        return (y,), new_state
