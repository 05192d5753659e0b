"""F: any JAX function as a layer, its output shapes inferred with ``jax.eval_shape``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import TensorSpec
from .base import Layer

__all__ = ["F"]


@register("function")
@dataclasses.dataclass(frozen=True)
class F(Layer):
    """Wraps ``fn(*arrays) -> array or tuple of arrays`` as a stateless layer.

    With ``needs_rng=True`` it is called as ``fn(*arrays, rng=key)`` in training and
    ``fn(*arrays, rng=None)`` in inference mode. Two ``F`` layers are equal when they
    wrap the same function object.

    Example:
      >>> import jax.numpy as jnp
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.F(jnp.tanh)(mg.Input(("batch", 4)))
      SymbolicTensor(f32[batch,4], from 'tanh')
    """

    fn: Callable
    needs_rng: bool = False

    user_code: ClassVar[bool] = True

    def validate(self):
        if not callable(self.fn):
            self.invalid(f"F wraps a callable, got {type(self.fn).__name__}")

    def uses_rng(self) -> bool:
        return self.needs_rng

    @property
    def default_name(self) -> str:
        name = getattr(self.fn, "__name__", "")
        return name if name.isidentifier() else "function"

    def _call(self, inputs, rng):
        if self.needs_rng:
            return self.fn(*inputs, rng=rng)
        return self.fn(*inputs)

    def infer(self, inputs):
        rng = jax.eval_shape(jax.random.key, 0) if self.needs_rng else None
        out = jax.eval_shape(self._call, [s.to_jax() for s in inputs], rng)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(o, jax.ShapeDtypeStruct) for o in outs):
            raise ShapeError(f"{self.default_name} must return an array or a tuple of arrays",
                             expected="array or tuple of arrays")
        return tuple(TensorSpec.from_jax(o) for o in outs)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        out = self._call(inputs, None if inference_mode else rng)
        return (tuple(out) if isinstance(out, (tuple, list)) else (out,)), state
