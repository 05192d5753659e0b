"""TrainState: everything a training run carries from one step to the next, as one
pytree of arrays (so it can be donated to the jitted step and checkpointed)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .loss_scale import DynamicLossScale

__all__ = ["TrainState"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """The state of a training run.

    Attributes:
      step: int32 scalar, the number of optimizer steps taken.
      params: the trainables, ``params[layer][name]``, in the policy's ``param_dtype``
        (float32 master weights under a half-precision policy).
      state: the non-trainables (BatchNorm statistics).
      opt_state: the optax optimizer's state.
      rng: the run's base key as raw key data (``jax.random.key_data``, uint32: plain
        arrays keep the jitted step on JAX's fast dispatch path); step ``n`` uses
        ``fold_in(key, n)``, so a resumed run draws the same dropout masks as an
        uninterrupted one.
      loss_scale: the dynamic loss scale (float16 training), or None.
    """

    step: jax.Array
    params: Any
    state: Any
    opt_state: Any
    rng: jax.Array
    loss_scale: DynamicLossScale | None = None

    def replace(self, **changes) -> TrainState:
        return dataclasses.replace(self, **changes)
