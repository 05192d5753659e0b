"""Dynamic loss scaling for float16 training.

float16 has 5 exponent bits: small gradients underflow to zero. The loss is multiplied
by a large scale before differentiation and the gradients divided by it after. When a
step's gradients are not finite the update is skipped and the scale halved; after
``period`` finite steps in a row it is doubled. The scale is part of the TrainState,
so it is checkpointed and resumed with the run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["DynamicLossScale", "all_finite"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """A loss scale that adapts to the gradients.

    Attributes:
      scale: float32 scalar the loss is multiplied by.
      good_steps: int32 scalar, finite steps since the scale last changed.
      period: finite steps after which the scale grows (static).
      factor: what the scale is multiplied or divided by (static).
      min_scale: the scale never drops below this (static).

    Example:
      >>> import jax.numpy as jnp
      >>> ls = DynamicLossScale.create(2.0 ** 15, period=2)
      >>> ls = ls.adjust(jnp.array(False))
      >>> float(ls.scale), int(ls.good_steps)
      (16384.0, 0)
      >>> ls = ls.adjust(jnp.array(True)).adjust(jnp.array(True))
      >>> float(ls.scale)
      32768.0
    """

    scale: jax.Array
    good_steps: jax.Array
    period: int = dataclasses.field(default=2000, metadata=dict(static=True))
    factor: float = dataclasses.field(default=2.0, metadata=dict(static=True))
    min_scale: float = dataclasses.field(default=1.0, metadata=dict(static=True))

    @classmethod
    def create(cls, initial_scale: float = 2.0 ** 15, period: int = 2000,
               factor: float = 2.0, min_scale: float = 1.0) -> DynamicLossScale:
        return cls(jnp.asarray(initial_scale, jnp.float32), jnp.zeros((), jnp.int32),
                   int(period), float(factor), float(min_scale))

    def scale_loss(self, loss: jax.Array) -> jax.Array:
        return loss * self.scale.astype(loss.dtype)

    def unscale(self, grads: Any) -> Any:
        return jax.tree.map(lambda g: g / self.scale.astype(g.dtype), grads)

    def adjust(self, finite: jax.Array) -> DynamicLossScale:
        """The scale after a step whose gradients were (not) all finite."""
        grow = finite & (self.good_steps + 1 >= self.period)
        scale = jnp.where(finite, jnp.where(grow, self.scale * self.factor, self.scale),
                          jnp.maximum(self.scale / self.factor, self.min_scale))
        good = jnp.where(finite & ~grow, self.good_steps + 1, 0).astype(jnp.int32)
        return dataclasses.replace(self, scale=scale.astype(jnp.float32), good_steps=good)


def all_finite(tree: Any) -> jax.Array:
    """A bool scalar: every element of every array in ``tree`` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
