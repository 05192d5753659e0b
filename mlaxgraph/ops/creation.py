"""Tensors made from dims: ``ops.arange(n)`` and ``ops.broadcast_to(x, shape)``, whose
sizes may be symbolic dims (``tokens.shape[1]``); the running call binds them."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import MlaxGraphError, ShapeError
from ..core.registry import register
from ..core.specs import Dim, TensorSpec, as_dim, is_symbolic, shape_str
from .base import Layer, expect_count, field, to_dtype
from .elementwise import broadcast_shapes

__all__ = ["Arange", "BroadcastTo", "arange", "broadcast_to"]


def _dim(value: Any, layer: Layer) -> Dim:
    try:
        return as_dim(value)
    except MlaxGraphError as e:
        layer.invalid(e.problem)


def _dims(value: Any, layer: Layer) -> tuple[Dim, ...]:
    if isinstance(value, (str, int)):
        layer.invalid(f"shape must be a tuple of dims, got {value!r}")
    return tuple(_dim(d, layer) for d in value)


@register("arange")
@dataclasses.dataclass(frozen=True)
class Arange(Layer):
    """``[0, 1, ..., n - 1]`` of ``dtype`` (int32 by default); ``n`` an int or a symbolic
    dim (position ids: ``ops.arange(tokens.shape[1])``). It takes no input. ``limit``
    (optional) is the largest ``n`` allowed, checked when ``n`` is known (at build time,
    or when a call binds a symbolic ``n``): a position table's size, so that positions
    past it are an error rather than a lookup past the table.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> tokens = mg.Input(("batch", "seq"), "int32")
      >>> ops.arange(tokens.shape[1])
      SymbolicTensor(i32[seq], from 'arange')
    """

    n: Dim = field(converter=_dim)
    dtype: np.dtype = field(default="int32", converter=to_dtype)
    limit: int | None = None

    symbolic_fields = ("n",)

    def validate(self):
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            self.invalid(f"limit must be None or a positive int, got {self.limit!r}")
        if self.limit is not None and isinstance(self.n, int) and self.n > self.limit:
            # A call binding a symbolic n (the sequence of the arrays traced) lands here.
            raise ShapeError(f"{self.n} positions, but the position table has {self.limit} "
                             f"(positions 0 .. {self.limit - 1})",
                             expected=f"a sequence of at most {self.limit} tokens")

    def infer(self, inputs):
        expect_count(inputs, 0)
        if self.limit is not None and not is_symbolic(self.n) and self.n > self.limit:
            raise ShapeError(f"{self.n} positions, but the position table has {self.limit} "
                             f"(positions 0 .. {self.limit - 1})",
                             expected=f"a sequence of at most {self.limit} tokens")
        return (TensorSpec((self.n,), self.dtype),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.arange(self.n, dtype=self.dtype),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # an iota


def arange(n, dtype="int32", *, limit=None):
    """``Arange(n, dtype, limit)()``: position ids ``0 .. n - 1``."""
    return Arange(n, dtype, limit)()


@register("broadcast_to")
@dataclasses.dataclass(frozen=True)
class BroadcastTo(Layer):
    """Broadcasts its input to ``shape`` (NumPy rules), whose dims may be symbolic
    (``ops.broadcast_to(cls, (x.shape[0], 1, d))``)."""

    shape: tuple[Dim, ...] = field(converter=_dims)

    symbolic_fields = ("shape",)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank > len(self.shape) or broadcast_shapes(x.shape, self.shape) != self.shape:
            raise ShapeError(f"{shape_str(x.shape)} does not broadcast to {shape_str(self.shape)}",
                             expected=f"{x.dtype}[...] broadcastable to {shape_str(self.shape)}")
        return (x.with_shape(self.shape),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.broadcast_to(inputs[0], self.shape),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


def broadcast_to(x, shape):
    """``BroadcastTo(shape)(x)``."""
    return BroadcastTo(tuple(shape))(x)


