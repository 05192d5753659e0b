"""The ``onnx`` family's ``Resize`` and ``Upsample``: separable per axis, each output
position's source coordinate and taps computed when the graph is traced (the shapes
are static), the values gathered and weighted with ``jax.numpy``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from .layer import define


def _source(i: np.ndarray, scale: float, n_in: int, n_out: int, mode: str, roi: tuple) -> np.ndarray:
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(i, dtype=float)
    if mode == "align_corners":
        length = scale * n_in  # the resized length before rounding, as ONNX's reference
        return i * (n_in - 1) / (length - 1) if length > 1 else np.zeros_like(i, dtype=float)
    if mode == "asymmetric":
        return i / scale
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (i + 0.5) / scale - 0.5
    if mode == "tf_crop_and_resize":
        start, end = roi
        if n_out > 1:
            return start * (n_in - 1) + i * (end - start) * (n_in - 1) / (n_out - 1)
        return np.full(i.shape, 0.5 * (start + end) * (n_in - 1))
    raise ShapeError(f"Resize: unknown coordinate_transformation_mode {mode!r}",
                     expected="half_pixel, asymmetric, align_corners, ...")


def _nearest(x: np.ndarray, how: str, scale: float) -> np.ndarray:
    if how == "floor":
        return np.floor(x)
    if how == "ceil":
        return np.ceil(x)
    if how == "round_prefer_ceil":
        return np.floor(x + 0.5)
    # round_prefer_floor: halves go down
    return np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x))


def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                     ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a], -1)


def _axis(x, axis: int, n_out: int, scale: float, a, roi: tuple):
    n_in = x.shape[axis]
    mode = a.get("mode", "nearest")
    coord = _source(np.arange(n_out, dtype=np.float64), scale, n_in, n_out,
                    a.get("coordinate_transformation_mode", "half_pixel"), roi)
    if mode == "nearest":
        taps = _nearest(coord, a.get("nearest_mode", "round_prefer_floor"), scale)[:, None]
        weights = np.ones_like(taps)
    else:
        base = np.floor(coord)
        r = coord - base
        if mode == "linear":
            taps = np.stack([base, base + 1], -1)
            weights = np.stack([1 - r, r], -1)
        elif mode == "cubic":
            taps = base[:, None] + np.arange(-1, 3)
            weights = _cubic(r, a.get("cubic_coeff_a", -0.75))
        else:
            raise ShapeError(f"Resize: unknown mode {mode!r}", expected="nearest, linear, cubic")
        if a.get("exclude_outside", 0):
            weights = np.where((taps < 0) | (taps >= n_in), 0, weights)
            weights = weights / weights.sum(-1, keepdims=True)
    index = np.clip(taps, 0, n_in - 1).astype(np.int32)
    moved = jnp.moveaxis(x, axis, -1)
    gathered = jnp.take(moved, jnp.asarray(index.reshape(-1)), axis=-1)
    gathered = gathered.reshape(moved.shape[:-1] + index.shape)
    out = jnp.sum(gathered * jnp.asarray(weights, np.float64).astype(
        jnp.promote_types(x.dtype, jnp.float32)), axis=-1)
    if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        outside = (coord < 0) | (coord > n_in - 1)
        out = jnp.where(jnp.asarray(outside), a.get("extrapolation_value", 0.0), out)
    if jnp.issubdtype(x.dtype, jnp.integer):
        out = jnp.round(out)
    return jnp.moveaxis(out.astype(x.dtype), -1, axis)


@define("Resize", static=(1, 2, 3))
def _resize(a, x, roi=None, scales=None, sizes=None):
    if a.get("antialias", 0):
        raise ShapeError("Resize with antialias is not implemented", expected="antialias=0")
    axes = a.get("axes")
    axes = list(range(x.ndim)) if axes is None else [v % x.ndim for v in axes]
    if sizes is not None and np.size(sizes):
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        ratios = [s / x.shape[ax] for s, ax in zip(sizes, axes)]
        policy = a.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [ratio] * len(axes)
            sizes = [int(np.floor(ratio * x.shape[ax] + 0.5)) for ax in axes]
    else:
        ratios = [float(v) for v in np.asarray(scales).reshape(-1)]
        sizes = [int(np.floor(x.shape[ax] * r)) for ax, r in zip(axes, ratios)]
    roi_values = np.asarray(roi, np.float64).reshape(-1) if roi is not None and np.size(roi) else None
    out = x
    for k, (ax, n, ratio) in enumerate(zip(axes, sizes, ratios)):
        if n == x.shape[ax] and ratio == 1.0 and roi_values is None:
            continue
        span = (roi_values[k], roi_values[k + len(axes)]) if roi_values is not None else (0.0, 1.0)
        out = _axis(out, ax, n, ratio, a, span)
    return out


class _Asymmetric:
    """An ``Upsample`` node's attributes as ``Resize`` reads them."""

    def __init__(self, a):
        self.a = a

    def get(self, name, default=None):
        if name == "coordinate_transformation_mode":
            return "asymmetric"
        if name == "nearest_mode":
            return "floor"
        return self.a.get(name, default)


@define("Upsample", static=(1,))
def _upsample(a, x, scales=None):
    scales = a.get("scales") if scales is None else scales
    return _resize(_Asymmetric(a), x, None, np.asarray(scales, np.float64), None)
