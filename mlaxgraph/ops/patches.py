"""A convolution computed as one matrix product over its input's patches (im2col).

XLA's CPU backend runs an ``s8 x s8 -> s32`` convolution as a generic convolution on
operands converted to ``s32``, several times (up to a hundred times) slower than a
float32 one; an ``s8 x s8 -> s32`` dot runs in its int8 GEMM. ``patch_conv`` gathers,
for each kernel tap, the strided slice of the padded input that tap reads, stacks the
taps next to the channels and contracts taps and channels with the kernel in one
``dot_general``: the same sums of the same products as ``lax.conv_general_dilated``
(exactly, for integers), at the cost of materialising the patches (taps times the
input's values, in the input's dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

__all__ = ["patch_conv"]


def _move(x: Any, source: int, destination: int) -> Any:
    return jnp.moveaxis(x, source, destination) if source != destination else x


def patch_conv(x: Any, kernel: Any, *, strides: Sequence[int], padding: Any,
               dilation: Sequence[int], groups: int, channels_last: bool,
               preferred_element_type: Any) -> Any:
    """``lax.conv_general_dilated`` of ``x`` (``N...C`` if ``channels_last`` else
    ``NC...``) with ``kernel`` (``O...I``, or ``OI...``) as one dot over patches.
    ``padding``: ``"SAME"``, ``"VALID"`` or one ``(low, high)`` pair per spatial dim;
    ``groups``: ``feature_group_count``."""
    n = kernel.ndim - 2
    if not channels_last:  # compute channel-last; the result goes back at the end
        x, kernel = _move(x, 1, -1), _move(kernel, 1, -1)
    window = kernel.shape[1:1 + n]
    spatial = x.shape[1:1 + n]
    dilated = tuple((k - 1) * d + 1 for k, d in zip(window, dilation))
    pads = (lax.padtype_to_pads(spatial, dilated, tuple(strides), padding)
            if isinstance(padding, str) else tuple(padding))
    if any(lo or hi for lo, hi in pads):
        x = lax.pad(x, jnp.zeros((), x.dtype),
                    ((0, 0, 0),) + tuple((lo, hi, 0) for lo, hi in pads) + ((0, 0, 0),))
    out = tuple((x.shape[1 + i] - dilated[i]) // strides[i] + 1 for i in range(n))
    taps = []
    for tap in _taps(window):
        start = (0,) + tuple(t * d for t, d in zip(tap, dilation)) + (0,)
        limit = ((x.shape[0],) + tuple(s + (o - 1) * st + 1 for s, o, st in
                                       zip(start[1:], out, strides)) + (x.shape[-1],))
        taps.append(lax.slice(x, start, limit, (1,) + tuple(strides) + (1,)))
    patches = jnp.stack(taps, axis=-2)                  # (N, *out, taps, C)
    features, per_group = kernel.shape[0], kernel.shape[-1]
    w = kernel.reshape(features, len(taps), per_group)  # (O, taps, C / groups)
    if groups == 1:
        y = lax.dot_general(patches, w, (((n + 1, n + 2), (1, 2)), ((), ())),
                            preferred_element_type=preferred_element_type)
    else:  # a batch dim over the groups: (groups, N, *out, O / groups)
        patches = patches.reshape(patches.shape[:-1] + (groups, per_group))
        w = w.reshape(groups, features // groups, len(taps), per_group)
        y = lax.dot_general(patches, w, (((n + 1, n + 3), (2, 3)), ((n + 2,), (0,))),
                            preferred_element_type=preferred_element_type)
        y = _move(y, 0, -2).reshape(y.shape[1:-1] + (features,))
    return y if channels_last else _move(y, -1, 1)


def _taps(window: Sequence[int]) -> list[tuple[int, ...]]:
    """Every kernel position, in the row-major order of the kernel's spatial dims."""
    positions: list[tuple[int, ...]] = [()]
    for k in window:
        positions = [p + (i,) for p in positions for i in range(k)]
    return positions
