"""Pooling, 1D, 2D or 3D by ``len(window)``, and global pooling, over channel-last
(``data_format="NHWC"``, the default) or channel-first (``"NCHW"``) inputs."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from .base import Layer, expect_count, field, padding_for, per_spatial_dim, spatial_dims
from .flops import size, upcast_sum
from .spatial import any_data_format, data_format, window_output_size

__all__ = ["MaxPool", "AvgPool", "GlobalMaxPool", "GlobalAvgPool"]


class _Pool(Layer):
    """Windowed pooling; ``strides`` defaults to ``window`` (as in Keras and PyTorch)."""

    data_format: str  # a field of each subclass

    size_field = "window"

    @property
    def channels_last(self) -> bool:
        return self.data_format.endswith("C")

    def validate(self):
        if any(v < 1 for v in self.window + self.strides):
            self.invalid(f"window and strides must be positive, got {self.window}, {self.strides}")

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        n = len(self.window)
        if x.rank != n + 2:
            raise ShapeError(f"{n}D pooling takes {self.data_format} input of rank {n + 2}",
                             expected=f"rank {n + 2}")
        spatial = x.shape[1:-1] if self.channels_last else x.shape[2:]
        pads = self.padding if not isinstance(self.padding, str) else (self.padding,) * n
        out = []
        for extent, w, s, p in zip(spatial, self.window, self.strides, pads):
            o = window_output_size(extent, w, s, p)
            if o is None or (not is_symbolic(o) and o < 1):
                raise ShapeError(f"the window {self.window} is larger than the input "
                                 f"{shape_str(spatial)}", expected=f"spatial dims >= {self.window}")
            out.append(o)
        if self.channels_last:
            return (x.with_shape((x.shape[0], *out, x.shape[-1])),)
        return (x.with_shape((x.shape[0], x.shape[1], *out)),)

    def _window_flops(self, outputs):
        """``window - 1`` per output element: XLA's count of a reduce_window."""
        return size(outputs[0]) * (size(self.window) - 1)

    def _reduce(self, x, init, op):
        if self.channels_last:
            window, strides = (1, *self.window, 1), (1, *self.strides, 1)
            padding = self.padding if isinstance(self.padding, str) else ((0, 0), *self.padding, (0, 0))
        else:
            window, strides = (1, 1, *self.window), (1, 1, *self.strides)
            padding = self.padding if isinstance(self.padding, str) else ((0, 0), (0, 0), *self.padding)
        return lax.reduce_window(x, init, op, window, strides, padding)


@register("max_pool")
@dataclasses.dataclass(frozen=True)
class MaxPool(_Pool):
    """The maximum over windows of a ``(batch, *spatial, channels)`` input.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.MaxPool((2, 2))(mg.Input(("batch", 28, 28, 16)))
      SymbolicTensor(f32[batch,14,14,16], from 'max_pool')
    """

    window: tuple[int, ...] = field(converter=spatial_dims("window"))
    strides: tuple[int, ...] = field(default=None, converter=per_spatial_dim("strides", "window", "window"))
    padding: str | tuple[tuple[int, int], ...] = field(default="VALID", converter=padding_for("window"))
    data_format: str = field(default="NHWC", converter=data_format)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        # NumPy (not traced) init values keep reduce_window differentiable under jit.
        if jnp.issubdtype(x.dtype, jnp.floating):
            init = np.array(-np.inf, x.dtype)
        else:
            init = np.array(np.iinfo(x.dtype).min, x.dtype)
        return (self._reduce(x, init, lax.max),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return self._window_flops(outputs)


@register("avg_pool")
@dataclasses.dataclass(frozen=True)
class AvgPool(_Pool):
    """The mean over windows of a ``(batch, *spatial, channels)`` float input.

    With padding, ``count_include_pad=True`` (the default, as PyTorch and Flax) divides
    by the window size; ``False`` (as Keras) divides by the number of real elements.
    """

    window: tuple[int, ...] = field(converter=spatial_dims("window"))
    strides: tuple[int, ...] = field(default=None, converter=per_spatial_dim("strides", "window", "window"))
    padding: str | tuple[tuple[int, int], ...] = field(default="VALID", converter=padding_for("window"))
    data_format: str = field(default="NHWC", converter=data_format)
    count_include_pad: bool = True

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        zero = np.zeros((), x.dtype)
        total = self._reduce(x, zero, lax.add)
        if self.count_include_pad or self.padding == "VALID":
            count = 1
            for w in self.window:
                count *= w
            return (total / jnp.asarray(count, x.dtype),), state
        if self.channels_last:
            ones = jnp.ones(x.shape[1:-1], x.dtype)[None, ..., None]
        else:
            ones = jnp.ones(x.shape[2:], x.dtype)[None, None]
        counts = self._reduce(ones, zero, lax.add)
        return (total / counts,), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The window sums and a divide per output element; without
        ``count_include_pad``, also the window sums of a ones mask over the spatial
        dims."""
        (y,) = outputs
        count = self._window_flops(outputs) + size(y)
        if not (self.count_include_pad or self.padding == "VALID"):
            spatial = y.shape[1:-1] if self.channels_last else y.shape[2:]
            count = count + size(spatial) * (size(self.window) - 1)
        return count


class _GlobalPool(Layer):
    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank < 3:
            raise ShapeError(f"takes {self.data_format} input (batch, channels and spatial "
                             f"dims)", expected="rank >= 3")
        spatial = (1,) * (x.rank - 2) if self.keepdims else ()
        if self.data_format == "NHWC":
            return (x.with_shape((x.shape[0], *spatial, x.shape[-1])),)
        return (x.with_shape((x.shape[0], x.shape[1], *spatial)),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        axes = tuple(range(1, x.ndim - 1) if self.data_format == "NHWC" else range(2, x.ndim))
        return (self.reduce(x, axis=axes, keepdims=self.keepdims),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The reduction over the spatial axes (and the divide of the mean)."""
        count = size(inputs[0]) - size(outputs[0])
        if self.reduce is jnp.mean:
            count = count + size(outputs[0]) + upcast_sum(size(inputs[0]), size(outputs[0]),
                                                          inputs[0].dtype)
        return count


@register("global_avg_pool")
@dataclasses.dataclass(frozen=True)
class GlobalAvgPool(_GlobalPool):
    """The mean over all spatial axes: ``(batch, *spatial, C) -> (batch, C)``
    (``(batch, C, *spatial)`` with ``data_format="NCHW"``)."""

    keepdims: bool = False
    data_format: str = field(default="NHWC", converter=any_data_format)
    reduce = staticmethod(jnp.mean)


@register("global_max_pool")
@dataclasses.dataclass(frozen=True)
class GlobalMaxPool(_GlobalPool):
    """The maximum over all spatial axes: ``(batch, *spatial, C) -> (batch, C)``
    (``(batch, C, *spatial)`` with ``data_format="NCHW"``)."""

    keepdims: bool = False
    data_format: str = field(default="NHWC", converter=any_data_format)
    reduce = staticmethod(jnp.max)
