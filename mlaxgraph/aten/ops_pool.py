"""The ``aten`` family's pooling operators, 1D, 2D and 3D (ATen's signatures): max
pooling (with PyTorch's indices), average pooling (``ceil_mode``,
``count_include_pad``, ``divisor_override``) and adaptive average and max pooling,
over the last 1, 2 or 3 axes (batched or not, as PyTorch takes them).

PyTorch's rules: ``ceil_mode`` adds room on the right for one more window when it
starts inside the input or its left padding (``ops.pooling.ceil_mode_extra``), room
never counted by an average; an adaptive pool's output ``i`` of ``o`` over ``n``
values is the window ``floor(i * n / o)`` to ``ceil((i + 1) * n / o)``; an index is
the first maximum's position in its input plane (row-major over the pooled axes)."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.pooling import ceil_mode_extra, sliced, window_max, window_mean, window_sum
from .layer import define


def _tuple(v, nd: int, default) -> tuple:
    v = default if v is None or (isinstance(v, (list, tuple)) and not v) else v
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * nd if len(v) == 1 else v


def _window(nd, kernel_size, stride, padding, dilation=1):
    k = _tuple(kernel_size, nd, 1)
    return k, _tuple(stride, nd, k), _tuple(padding, nd, 0), _tuple(dilation, nd, 1)


def _pads(x, nd, k, s, p, d, ceil_mode):
    """``(low, high)`` per pooled axis: the padding, and ``ceil_mode``'s room."""
    return [(pi, pi + (ceil_mode_extra(n, pi, pi, ki, si, di) if ceil_mode else 0))
            for n, ki, si, pi, di in zip(x.shape[x.ndim - nd:], k, s, p, d)]


def _axes(x, nd) -> tuple:
    return tuple(range(x.ndim - nd, x.ndim))


def max_pool(x, nd, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _window(nd, kernel_size, stride, padding, dilation)
    if max(d) > 1 and not sliced(k, x.shape[x.ndim - nd:]):
        # reduce_window has no gradient with dilation: the taps' select, as window_max's
        return _first_max(x, nd, k, s, p, d, ceil_mode)[0]
    return window_max(x, k, s, _pads(x, nd, k, s, p, d, ceil_mode), _axes(x, nd), d)


def max_pool_with_indices(x, nd, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The pooled values and, as PyTorch's, the index of each window's first maximum in
    its input plane (row-major over the pooled axes; a NaN is a maximum)."""
    y = max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode)
    k, s, p, d = _window(nd, kernel_size, stride, padding, dilation)
    return y, _first_max(lax.stop_gradient(x), nd, k, s, p, d, ceil_mode)[1]


def _first_max(x, nd, k, s, p, d, ceil_mode):
    """Each window's first maximum (a NaN is one) and its index in the input plane, a
    select over the window's taps in row-major order (its gradient: that tap's)."""
    spatial = x.shape[x.ndim - nd:]
    plane = jnp.broadcast_to(jnp.arange(int(np.prod(spatial)), dtype=jnp.int32).reshape(spatial), x.shape)
    pairs = _pads(x, nd, k, s, p, d, ceil_mode)
    pads = [(0, 0, 0)] * (x.ndim - nd) + [(lo, hi, 0) for lo, hi in pairs]
    xs = lax.pad(x, jnp.array(-jnp.inf, x.dtype), pads)
    ids = lax.pad(plane, jnp.int32(-1), pads)
    out = [(n + lo + hi - (ki - 1) * di - 1) // si + 1
           for n, (lo, hi), ki, di, si in zip(spatial, pairs, k, d, s)]
    best = index = None
    for taps in itertools.product(*(range(ki) for ki in k)):
        where = (Ellipsis,) + tuple(slice(t * di, t * di + si * (o - 1) + 1, si)
                                    for t, di, si, o in zip(taps, d, s, out))
        tap, at = xs[where], ids[where]
        if best is None:
            best, index = tap, at
            continue
        take = (tap > best) | (jnp.isnan(tap) & ~jnp.isnan(best))
        best, index = jnp.where(take, tap, best), jnp.where(take, at, index)
    return best, index


def avg_pool(x, nd, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    k, s, p, d = _window(nd, kernel_size, stride, padding)
    pads = _pads(x, nd, k, s, p, d, ceil_mode)
    if divisor_override:
        return window_sum(x, k, s, pads, _axes(x, nd)) / divisor_override
    # the taps each window counts: with count_include_pad the padding, not ceil_mode's room
    return window_mean(x, k, s, pads, _axes(x, nd),
                       counted=[(pi, pi) for pi in p] if count_include_pad else None)


def _bounds(n: int, o: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(o)
    return (i * n) // o, -(-((i + 1) * n) // o)


def adaptive_avg_pool(x, nd, output_size):
    """Each pooled axis in turn: the mean of each output's window (a window's mean over
    several axes is the mean of its means along each)."""
    for axis, o in zip(_axes(x, nd), _tuple(output_size, nd, 1)):
        n = x.shape[axis]
        if n % o == 0:
            shape = x.shape[:axis] + (o, n // o) + x.shape[axis + 1:]
            x = x.reshape(shape).mean(axis + 1)
            continue
        start, end = _bounds(n, o)
        x = jnp.stack([lax.slice_in_dim(x, int(a), int(b), axis=axis).mean(axis)
                       for a, b in zip(start, end)], axis)
    return x


def adaptive_max_pool(x, nd, output_size):
    """The maximum of each output's window and its first position in the input plane
    (row-major): the windows' taps gathered (a shorter window repeating its last one,
    which changes neither), then the first maximum of each (a NaN is one)."""
    lead = x.ndim - nd
    spatial = x.shape[lead:]
    plane = jnp.arange(int(np.prod(spatial)), dtype=jnp.int32).reshape(spatial)
    vals, ids = x, plane
    sizes = []
    for j, o in enumerate(_tuple(output_size, nd, 1)):
        n = spatial[j]
        start, end = _bounds(n, o)
        width = int((end - start).max())
        src = np.minimum(start[:, None] + np.arange(width)[None, :], end[:, None] - 1)
        axis = lead + 2 * j  # each earlier pooled axis is now (out, taps)
        vals = jnp.take(vals, jnp.asarray(src.reshape(-1), jnp.int32), axis=axis)
        vals = vals.reshape(vals.shape[:axis] + (o, width) + vals.shape[axis + 1:])
        ids = jnp.take(ids, jnp.asarray(src.reshape(-1), jnp.int32), axis=2 * j)
        ids = ids.reshape(ids.shape[:2 * j] + (o, width) + ids.shape[2 * j + 1:])
        sizes.append(o)
    # (..., o1, w1, o2, w2, ...) -> (..., o1, o2, ..., w1 * w2 * ...)
    order = tuple(range(lead)) + tuple(lead + 2 * j for j in range(nd)) + tuple(
        lead + 2 * j + 1 for j in range(nd))
    vals = jnp.transpose(vals, order).reshape(x.shape[:lead] + tuple(sizes) + (-1,))
    ids = jnp.transpose(ids, tuple(2 * j for j in range(nd)) + tuple(2 * j + 1 for j in range(nd)))
    ids = ids.reshape(tuple(sizes) + (-1,))
    first = jnp.argmax(lax.stop_gradient(vals), axis=-1)  # the first maximum (or NaN)
    values = jnp.take_along_axis(vals, first[..., None], axis=-1)[..., 0]
    index = jnp.take_along_axis(jnp.broadcast_to(ids, vals.shape), first[..., None], axis=-1)[..., 0]
    return values, index


for _nd in (1, 2, 3):
    define(f"aten.max_pool{_nd}d.default", flops="elementwise")(
        lambda x, *a, nd=_nd, **kw: max_pool(x, nd, *a, **kw))
    define(f"aten.max_pool{_nd}d_with_indices.default", flops="elementwise")(
        lambda x, *a, nd=_nd, **kw: max_pool_with_indices(x, nd, *a, **kw))
    define(f"aten.avg_pool{_nd}d.default", flops="elementwise")(
        lambda x, *a, nd=_nd, **kw: avg_pool(x, nd, *a, **kw))
    define(f"aten.adaptive_avg_pool{_nd}d.default", flops="input")(
        lambda x, output_size, nd=_nd: adaptive_avg_pool(x, nd, output_size))
    define(f"aten.adaptive_max_pool{_nd}d.default", flops="input")(
        lambda x, output_size, nd=_nd: adaptive_max_pool(x, nd, output_size))
define("aten._adaptive_avg_pool2d.default", flops="input")(
    lambda x, output_size: adaptive_avg_pool(x, 2, output_size))
define("aten._adaptive_avg_pool3d.default", flops="input")(
    lambda x, output_size: adaptive_avg_pool(x, 3, output_size))
