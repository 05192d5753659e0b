"""MaxPool over channel-last inputs: 1D, 2D or 3D by ``len(window)``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax

from ..errors import ShapeError
from ..specs import is_symbolic, shape_str
from .base import Layer, expect_count, normalize_tuple, set_field
from .conv import normalize_padding, window_output_size
from .registry import register

__all__ = ["MaxPool"]


@register("max_pool")
@dataclasses.dataclass(frozen=True)
class MaxPool(Layer):
    """The maximum over windows of a ``(batch, *spatial, channels)`` input.

    ``strides`` defaults to ``window`` (as in Keras and PyTorch).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.MaxPool((2, 2))(mg.Input(("batch", 28, 28, 16)))
      SymbolicTensor(f32[batch,14,14,16], from 'max_pool')
    """

    window: tuple[int, ...]
    strides: Any = None
    padding: Any = "VALID"

    def validate(self):
        n = len(self.window) if isinstance(self.window, (tuple, list)) else 0
        if n not in (1, 2, 3):
            self.invalid(f"window must be a tuple of 1, 2 or 3 ints, got {self.window!r}")
        set_field(self, "window", normalize_tuple(self.window, n, "window", self))
        strides = self.window if self.strides is None else self.strides
        set_field(self, "strides", normalize_tuple(strides, n, "strides", self))
        set_field(self, "padding", normalize_padding(self, self.padding, n))
        if any(v < 1 for v in self.window + self.strides):
            self.invalid(f"window and strides must be positive, got {self.window}, {self.strides}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        n = len(self.window)
        if x.rank != n + 2:
            raise ShapeError(f"{n}D pooling takes (batch, {n} spatial dims, channels)",
                             expected=f"rank {n + 2}")
        spatial = x.shape[1:-1]
        pads = self.padding if not isinstance(self.padding, str) else (self.padding,) * n
        out = []
        for size, w, s, p in zip(spatial, self.window, self.strides, pads):
            o = window_output_size(size, w, s, p)
            if o is None or (not is_symbolic(o) and o < 1):
                raise ShapeError(f"the window {self.window} is larger than the input "
                                 f"{shape_str(spatial)}", expected=f"spatial dims >= {self.window}")
            out.append(o)
        return (x.with_shape((x.shape[0], *out, x.shape[-1])),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        if jnp.issubdtype(x.dtype, jnp.floating):
            init = jnp.array(-jnp.inf, x.dtype)
        else:
            init = jnp.array(jnp.iinfo(x.dtype).min, x.dtype)
        padding = self.padding if isinstance(self.padding, str) else ((0, 0), *self.padding, (0, 0))
        y = lax.reduce_window(x, init, lax.max, (1, *self.window, 1), (1, *self.strides, 1), padding)
        return (y,), state
