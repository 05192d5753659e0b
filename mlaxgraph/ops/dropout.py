"""Dropout: random in training, the identity in inference mode."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..core.registry import register
from .base import Layer, expect_count, expect_float
from .flops import size

__all__ = ["Dropout"]


@register("dropout")
@dataclasses.dataclass(frozen=True)
class Dropout(Layer):
    """Zeroes each element with probability ``rate`` and scales the rest by
    ``1 / (1 - rate)`` (inverted dropout); the identity when ``inference_mode=True``.

    Needs ``rng`` in training; each dropout layer gets its own key derived from it.
    """

    rate: float

    random = True

    def validate(self):
        if not isinstance(self.rate, (int, float)) or not 0.0 <= self.rate < 1.0:
            self.invalid(f"rate must be in [0, 1), got {self.rate!r}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        expect_float(inputs[0])
        return (inputs[0],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        if inference_mode or self.rate == 0.0:
            return (x,), state
        keep = jax.random.bernoulli(rng, 1.0 - self.rate, x.shape)
        scaled = x / jnp.asarray(1.0 - self.rate, x.dtype)
        return (jnp.where(keep, scaled, jnp.zeros((), x.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Training: a compare of uniform numbers, a divide and a select per element
        (the random bits themselves are not counted); inference: none."""
        if inference_mode or self.rate == 0.0:
            return 0
        return 3 * size(outputs[0])

    def xla_cost_caveat(self, inference_mode):
        if inference_mode or self.rate == 0.0:
            return None
        return "XLA also counts hashing the random bits (threefry's integer ops)"
