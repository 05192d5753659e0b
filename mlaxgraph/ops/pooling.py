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
           "window_max", "window_sum", "window_mean", "window_counts", "sliced",
           "ceil_mode_extra"]

#: ``window_max`` and ``window_sum`` (the pooling layers', and the ONNX and PyTorch
#: importers' pooling) reduce over strided slices for windows of at most this many
#: taps (3 x 3 and smaller in 2D; 2 x 2 x 2 in 3D) and call ``reduce_window`` above.
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
    # NumPy (not traced) init values keep reduce_window differentiable under jit.
    low = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else
                   np.iinfo(x.dtype).min, x.dtype)
    best = None
    for tap in _taps(x, window, strides, padding, axes, dilation, low, lax.max):
        if best is None:
            best = tap
            continue
        take = tap > best
        if jnp.issubdtype(x.dtype, jnp.floating):
            take = take | (tap != tap)
        best = jnp.where(take, tap, best)
    return best


def window_sum(x, window, strides, padding, axes, dilation=None, by_slices=True):
    """The sum over windows of ``x`` along ``axes`` (zero padded), as ``lax.reduce_window``
    with ``lax.add`` computes it up to the order of the additions.

    Windows of at most ``MAX_SLICED_TAPS`` taps are the sum of their taps, each a strided
    slice of the padded input, added in the window's row-major order; its gradient is a
    sum of pads, which XLA's CPU backend fuses, where ``reduce_window``'s is a
    ``reduce_window`` over the padded cotangent (3x3 windows of stride 2: 5x faster,
    benchmarks/RESULTS.md, section 14). Larger windows, symbolic extents and
    ``by_slices=False`` call ``reduce_window``.
    """
    total = None
    for tap in _taps(x, window, strides, padding, axes, dilation, np.zeros((), x.dtype), lax.add,
                     by_slices):
        total = tap if total is None else total + tap
    return total


def _taps(x, window, strides, padding, axes, dilation, fill, op, by_slices=True):
    """The taps of the windows, each a strided slice of ``x`` padded with ``fill``, in
    the window's row-major order; or, for a window not ``sliced`` (or without
    ``by_slices``), one value: the windows reduced by ``op`` with ``lax.reduce_window``."""
    dilation = tuple(dilation or (1,) * len(window))
    extents = [x.shape[a] for a in axes]
    if not (by_slices and sliced(window, extents)):
        full = [1] * x.ndim
        win, step, dil = list(full), list(full), list(full)
        pads = padding if isinstance(padding, str) else [(0, 0)] * x.ndim
        for i, a in enumerate(axes):
            win[a], step[a], dil[a] = window[i], strides[i], dilation[i]
            if not isinstance(padding, str):
                pads[a] = tuple(padding[i])
        yield lax.reduce_window(x, fill, op, tuple(win), tuple(step), pads,
                                window_dilation=tuple(dil))
        return
    spans = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
    pairs = (lax.padtype_to_pads(extents, spans, strides, padding)
             if isinstance(padding, str) else [tuple(p) for p in padding])
    if any(lo or hi for lo, hi in pairs):
        widths = [(0, 0)] * x.ndim
        for a, pair in zip(axes, pairs):
            widths[a] = pair
        x = jnp.pad(x, widths, constant_values=fill)
    counts = [(x.shape[a] - span) // s + 1 for a, span, s in zip(axes, spans, strides)]
    for taps in itertools.product(*(range(w) for w in window)):
        # one strided slice over every window dim: its transpose in the gradient is one
        # pad, which XLA fuses (a slice per dim, chained, made the 3x3 gradient 4x slower)
        start, limit, step = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for a, t, d, s, n in zip(axes, taps, dilation, strides, counts):
            start[a], limit[a], step[a] = t * d, t * d + s * (n - 1) + 1, s
        yield lax.slice(x, tuple(start), tuple(limit), tuple(step))


def window_mean(x, window, strides, pads, axes, dilation=None, counted=None):
    """The mean over windows of ``x`` (static extents; ``pads`` the ``(low, high)`` pairs
    per window dim): ``window_sum`` divided by the taps ``window_counts`` counts
    (``counted``: the padding that counts, as with ``count_include_pad``; None: none).

    Where every window counts as many taps, the divisor is one number and the sums are
    the slices'. Where the counts differ (padding not counted, ``ceil_mode``'s room),
    the sums are ``reduce_window``'s: XLA's CPU backend runs the slices' gradient, whose
    cotangent is then scaled by a constant of the output's spatial shape, 1.2 - 1.8x
    slower than ``reduce_window``'s (benchmarks/RESULTS.md, section 14)."""
    extents = [x.shape[a] for a in axes]
    counts = window_counts(extents, window, strides, pads, dilation, counted)
    uniform = bool(np.all(counts == counts.flat[0]))
    total = window_sum(x, window, strides, pads, axes, dilation, by_slices=uniform)
    if uniform:
        return total / jnp.asarray(counts.flat[0], x.dtype)
    shape = [1] * x.ndim
    for a, n in zip(axes, counts.shape):
        shape[a] = n
    return total / jnp.asarray(counts.reshape(shape), x.dtype)


def window_counts(extents, window, strides, pads, dilation=None, counted=None) -> np.ndarray:
    """The number of taps of each window (the output's spatial shape, static) that fall
    inside ``counted``: ``(low, high)`` per dim, the positions from ``-low`` to
    ``extent + high`` (None: the input itself, padding not counted). ``pads`` are the
    pairs the windows were computed with (explicit padding, and the room PyTorch's and
    ONNX's ``ceil_mode`` adds, which never counts)."""
    dilation = tuple(dilation or (1,) * len(window))
    counted = counted or [(0, 0)] * len(window)
    out = np.ones((), np.float64)
    for n, (lo, hi), (c_lo, c_hi), k, st, d in zip(extents, pads, counted, window, strides,
                                                   dilation):
        m = (n + lo + hi - (k - 1) * d - 1) // st + 1
        taps = np.arange(m)[:, None] * st - lo + np.arange(k)[None, :] * d
        out = np.multiply.outer(out, ((taps >= -c_lo) & (taps < n + c_hi)).sum(-1))
    return out


class _Pool(Layer):
    """Windowed pooling; ``strides`` defaults to ``window`` (as in Keras and PyTorch)."""

    data_format: str  # fields of each subclass
    window: tuple[int, ...]

    windowed = True
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

    @property
    def _axes(self) -> range:
        first = 1 if self.channels_last else 2
        return range(first, first + len(self.window))

    def _window_flops(self, outputs):
        """``window - 1`` per output element: XLA's count of a reduce_window."""
        return size(outputs[0]) * (size(self.window) - 1)


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
    The means are ``window_mean``'s: over strided slices for windows of at most
    ``MAX_SLICED_TAPS`` taps where every window divides by one number.
    """

    window: tuple[int, ...] = field(converter=spatial_dims("window"))
    strides: tuple[int, ...] = field(default=None, converter=per_spatial_dim("strides", "window", "window"))
    padding: str | tuple[tuple[int, int], ...] = field(default="VALID", converter=padding_for("window"))
    data_format: str = field(default="NHWC", converter=data_format)
    count_include_pad: bool = True

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        include = self.count_include_pad or self.padding == "VALID"
        extents = [x.shape[a] for a in self._axes]
        if any(is_symbolic(n) for n in extents):  # reduce_window's sums, counted at run time
            total = window_sum(x, self.window, self.strides, self.padding, self._axes)
            if include:
                return (total / jnp.asarray(math.prod(self.window), x.dtype),), state
            ones = jnp.ones([x.shape[a] if a in self._axes else 1 for a in range(x.ndim)],
                            x.dtype)
            return (total / window_sum(ones, self.window, self.strides, self.padding,
                                       self._axes),), state
        pads = (lax.padtype_to_pads(extents, self.window, self.strides, self.padding)
                if isinstance(self.padding, str) else self.padding)
        return (window_mean(x, self.window, self.strides, pads, self._axes,
                            counted=pads if include else None),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The window sums and a divide per output element; without
        ``count_include_pad`` and with symbolic spatial dims, also the window sums of a
        ones mask over them (known dims: the counts are a constant)."""
        (y,) = outputs
        count = self._window_flops(outputs) + size(y)
        spatial = y.shape[1:-1] if self.channels_last else y.shape[2:]
        if not (self.count_include_pad or self.padding == "VALID") and any(
                is_symbolic(n) for n in spatial):  # the counts summed when the shapes are known
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
