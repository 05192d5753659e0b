"""The ``aten`` family's resampling operators (``F.interpolate``): nearest and bilinear
upsampling and downsampling with PyTorch's source coordinates, in ATen's signatures.

PyTorch maps an output position to the input with the scale ``1 / scale_factor``
when ``scale_factor`` is given (not recomputed), ``in / out`` otherwise, computed in
float32: nearest takes ``floor(i * scale)``; bilinear (``align_corners=False``)
interpolates at ``(i + 0.5) * scale - 0.5`` (at least 0) between its two neighbours,
without antialiasing when it downsamples; ``align_corners=True`` at
``i * (in - 1) / (out - 1)``. The positions and weights are known from the shapes,
so they are computed here with NumPy and the resampling is two gathers."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from .layer import define


def _sizes(x, output_size, scale_factors) -> tuple[list, list]:
    """The output's spatial sizes and each axis' scale factor (None: from the sizes)."""
    spatial = x.shape[2:]
    if output_size is None:
        if scale_factors is None:
            raise ShapeError("interpolate takes an output size or scale factors, got neither")
        output_size = [int(np.floor(np.float64(d) * s)) for d, s in zip(spatial, scale_factors)]
    if not all(isinstance(d, (int, np.integer)) for d in tuple(spatial) + tuple(output_size)):
        raise ShapeError("interpolate on a symbolic size: mlaxgraph resamples inputs whose "
                         "spatial sizes are fixed when the graph is built")
    scales = list(scale_factors) if scale_factors is not None else [None] * len(spatial)
    return [int(d) for d in output_size], scales


def _scale(n_in: int, n_out: int, factor: Any, align_corners: bool = False) -> np.float32:
    if align_corners:
        return np.float32((n_in - 1) / (n_out - 1)) if n_out > 1 else np.float32(0)
    if factor is not None and factor > 0:
        return np.float32(1.0 / factor)
    return np.float32(n_in / n_out)


def _nearest(x, output_size, scales):
    for axis, (n_out, factor) in enumerate(zip(output_size, scales), start=2):
        n_in = x.shape[axis]
        scale = _scale(n_in, n_out, factor)
        src = np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64),
                         n_in - 1)
        x = jnp.take(x, jnp.asarray(src, jnp.int32), axis=axis)
    return x


def _linear(x, output_size, scales, align_corners):
    for axis, (n_out, factor) in enumerate(zip(output_size, scales), start=2):
        n_in = x.shape[axis]
        scale = _scale(n_in, n_out, factor, align_corners)
        i = np.arange(n_out, dtype=np.float32)
        src = i * scale if align_corners else np.maximum((i + np.float32(0.5)) * scale - np.float32(0.5),
                                                          np.float32(0))
        low = np.minimum(src.astype(np.int64), n_in - 1)
        high = np.minimum(low + 1, n_in - 1)
        frac = (src - low.astype(np.float32)).astype(np.float32)
        shape = [1] * x.ndim
        shape[axis] = n_out
        w_high = jnp.asarray(frac.reshape(shape), x.dtype)
        w_low = jnp.asarray((np.float32(1) - frac).reshape(shape), x.dtype)
        x = (w_low * jnp.take(x, jnp.asarray(low, jnp.int32), axis=axis)
             + w_high * jnp.take(x, jnp.asarray(high, jnp.int32), axis=axis))
    return x


@define("aten.upsample_nearest2d.vec", "aten.upsample_nearest1d.vec", "aten.upsample_nearest3d.vec",
        flops="none")
def _upsample_nearest(x, output_size=None, scale_factors=None):
    return _nearest(x, *_sizes(x, output_size, scale_factors))


@define("aten.upsample_nearest2d.default", flops="none")
def _upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    scales = None if scales_h is None and scales_w is None else [scales_h, scales_w]
    return _nearest(x, [int(d) for d in output_size],
                    scales or [None, None])


@define("aten.upsample_bilinear2d.vec", flops="elementwise")
def _upsample_bilinear(x, output_size=None, align_corners=False, scale_factors=None):
    size, scales = _sizes(x, output_size, scale_factors)
    return _linear(x, size, scales, bool(align_corners))


@define("aten.upsample_bilinear2d.default", flops="elementwise")
def _upsample_bilinear2d(x, output_size, align_corners=False, scales_h=None, scales_w=None):
    return _linear(x, [int(d) for d in output_size], [scales_h, scales_w], bool(align_corners))
