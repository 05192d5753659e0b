"""Pooling, 1D, 2D or 3D by ``len(window)``, and global pooling, over channel-last
(``data_format="NHWC"``, the default) or channel-first (``"NCHW"``) inputs."""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from .base import Layer, expect_count, field, padding_for, per_spatial_dim, spatial_dims
from .flops import size, upcast_sum
from .spatial import any_data_format, data_format, window_output_size

__all__ = ["MaxPool", "AvgPool", "GlobalMaxPool", "GlobalAvgPool", "MAX_SLICED_TAPS",
           "window_max", "sliced", "ceil_mode_extra"]

#: ``window_max`` (``MaxPool``'s, and the ONNX and PyTorch importers' max pooling) takes
#: the maximum over strided slices for windows of at most this many taps (3 x 3 and
#: smaller in 2D; 2 x 2 x 2 in 3D) and calls ``reduce_window`` above.
MAX_SLICED_TAPS = 9


def ceil_mode_extra(n, low, high, k, s, d=1) -> int:
    """The padding ``ceil_mode`` (PyTorch's and ONNX's pooling) adds at the end of a dim of
    ``n`` values padded by ``low`` and ``high``, window ``k`` dilated ``d``, stride ``s``:
    room for one more window, unless it would start in the end padding."""
    padded, span = n + low + high, (k - 1) * d + 1
    floor_out = (padded - span) // s + 1
    ceil_out = -(-(padded - span) // s) + 1
    if (ceil_out - 1) * s >= n + low:
        ceil_out -= 1
    return max((ceil_out - 1) * s + span - padded, 0) if ceil_out > floor_out else 0


def sliced(window, extents) -> bool:
    """Whether ``window_max`` takes the maximum over strided slices: concrete extents
    and at most ``MAX_SLICED_TAPS`` taps in the window."""
    return math.prod(window) <= MAX_SLICED_TAPS and not any(is_symbolic(d) for d in extents)


def window_max(x, window, strides, padding, axes, dilation=None):
    """The maximum over windows of ``x`` along ``axes`` (one per window dim; ``padding``
    "VALID", "SAME" or ``(low, high)`` pairs, padded with the dtype's lowest value),
    as ``lax.reduce_window`` computes it, to the bit, gradients included.

    Windows of at most ``MAX_SLICED_TAPS`` taps are a select over their taps, each a
    strided slice of the padded input: ``best = where(tap > best, tap, best)`` in the
    window's row-major order, so the first maximum of a window is chosen (and a NaN,
    which the maximum propagates). Its gradient goes to that element alone, as
    ``reduce_window``'s (``select_and_scatter``, which keeps the first maximum too); XLA's
    CPU backend computes it as selects and pads in a few fused passes, where
    ``select_and_scatter`` walks every window in a loop of its own (12x the time for
    2x2 windows, 4x for 3x3 ones of stride 2; benchmarks/RESULTS.md, section 14). Larger windows and symbolic extents
    call ``reduce_window``. Written as selects, not a custom derivative, so forward-mode
    and higher-order derivatives work as ``reduce_window``'s.
    """
    dilation = tuple(dilation or (1,) * len(window))
    # NumPy (not traced) init values keep reduce_window differentiable under jit.
    low = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else
                   np.iinfo(x.dtype).min, x.dtype)
    extents = [x.shape[a] for a in axes]
    if not sliced(window, extents):
        full = [1] * x.ndim
        win, step, dil = list(full), list(full), list(full)
        pads = padding if isinstance(padding, str) else [(0, 0)] * x.ndim
        for i, a in enumerate(axes):
            win[a], step[a], dil[a] = window[i], strides[i], dilation[i]
            if not isinstance(padding, str):
                pads[a] = tuple(padding[i])
        return lax.reduce_window(x, low, lax.max, tuple(win), tuple(step), pads,
                                 window_dilation=tuple(dil))
    spans = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
    pairs = (lax.padtype_to_pads(extents, spans, strides, padding)
             if isinstance(padding, str) else [tuple(p) for p in padding])
    if any(lo or hi for lo, hi in pairs):
        widths = [(0, 0)] * x.ndim
        for a, pair in zip(axes, pairs):
            widths[a] = pair
        x = jnp.pad(x, widths, constant_values=low)
    counts = [(x.shape[a] - span) // s + 1 for a, span, s in zip(axes, spans, strides)]
    best = None
    for taps in itertools.product(*(range(w) for w in window)):
        # one strided slice over every window dim: its transpose in the gradient is one
        # pad, which XLA fuses (a slice per dim, chained, made the 3x3 gradient 4x slower)
        start, limit, step = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for a, t, d, s, n in zip(axes, taps, dilation, strides, counts):
            start[a], limit[a], step[a] = t * d, t * d + s * (n - 1) + 1, s
        tap = lax.slice(x, tuple(start), tuple(limit), tuple(step))
        if best is None:
            best = tap
            continue
        take = tap > best
        if jnp.issubdtype(x.dtype, jnp.floating):
            take = take | (tap != tap)
        best = jnp.where(take, tap, best)
    return best


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
        return (window_max(x, self.window, self.strides, self.padding, self._axes),), state

    @property
    def _axes(self) -> range:
        first = 1 if self.channels_last else 2
        return range(first, first + len(self.window))

    def _by_slices(self, shape) -> bool:
        """Whether ``window_max`` takes the maximum over strided slices for this input."""
        return sliced(self.window, [shape[a] for a in self._axes])

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``reduce_window``'s ``window - 1`` per output element, or over slices a compare
        and a select per tap after the first (float: and a NaN test and an ``or``)."""
        if not self._by_slices(inputs[0].shape):
            return self._window_flops(outputs)
        per_tap = 4 if jnp.issubdtype(inputs[0].dtype, jnp.floating) else 2
        return size(outputs[0]) * (math.prod(self.window) - 1) * per_tap


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
