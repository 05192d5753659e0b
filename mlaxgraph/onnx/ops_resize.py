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
    if how == "simple":  # Upsample's and opset 10 Resize's: down when enlarging, up when shrinking
        how = "ceil" if scale < 1 else "floor"
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
    elif a.get("antialias", 0):
        taps, weights = _antialias_taps(coord, scale, mode, a.get("cubic_coeff_a", -0.75))
        if a.get("exclude_outside", 0):
            weights = np.where((taps < 0) | (taps >= n_in), 0, weights)
            weights = weights / weights.sum(-1, keepdims=True)
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
    # the weights in the input's float type, from their float64 values (a jax float64
    # array would be float32 already, with a warning, where x64 is off)
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    out = jnp.sum(gathered * jnp.asarray(np.asarray(weights, np.float64).astype(dtype)), axis=-1)
    if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        outside = (coord < 0) | (coord > n_in - 1)
        out = jnp.where(jnp.asarray(outside), a.get("extrapolation_value", 0.0), out)
    if jnp.issubdtype(x.dtype, jnp.integer):
        out = jnp.round(out)
    return jnp.moveaxis(out.astype(x.dtype), -1, axis)


def _antialias_taps(coord, scale: float, mode: str, a: float):
    """Taps and weights of the filter stretched by ``1 / scale`` when downsampling
    (the antialiased linear and cubic of ONNX's Resize), normalized to sum 1."""
    stretch = min(scale, 1.0)
    whole = coord == np.floor(coord)
    base = np.where(whole, coord - 1, np.floor(coord))
    ratio = np.where(whole, 1.0, coord - np.floor(coord))
    reach = 1 if mode == "linear" else 2
    start = int(np.floor(-reach / stretch) + 1)
    offsets = np.arange(start, 2 - start)
    t = np.abs((offsets[None, :] - ratio[:, None]) * stretch)
    if mode == "linear":
        weights = np.clip(1 - t, 0, 1)
    else:
        weights = np.where(t <= 1, (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1,
                           np.where(t < 2, a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a, 0.0))
    weights = weights / weights.sum(-1, keepdims=True)
    return base[:, None] + offsets[None, :], weights


@define("Resize", static=(1, 2, 3))
def _resize(a, x, roi=None, scales=None, sizes=None):
    if not isinstance(a, _Asymmetric) and a.opset < 11:  # (X, scales), as Upsample reads them
        return _upsample(a, x, roi)
    axes = a.get("axes")
    axes = list(range(x.ndim)) if axes is None else [v % x.ndim for v in axes]
    if sizes is not None and np.size(sizes):
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        _static_axes(x, [ax for ax, n in zip(axes, sizes) if n != x.shape[ax]], "sizes")
        ratios = [s / x.shape[ax] for s, ax in zip(sizes, axes)]
        policy = a.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [ratio] * len(axes)
            sizes = [int(np.floor(ratio * x.shape[ax] + 0.5)) for ax in axes]
    else:
        ratios = [float(v) for v in np.asarray(scales).reshape(-1)]
        # a scale of 1 keeps its dim, symbolic (a batch) or not
        _static_axes(x, [ax for ax, r in zip(axes, ratios) if r != 1.0], "scales")
        sizes = [x.shape[ax] if r == 1.0 else int(np.floor(x.shape[ax] * r))
                 for ax, r in zip(axes, ratios)]
    roi_values = np.asarray(roi, np.float64).reshape(-1) if roi is not None and np.size(roi) else None
    if roi_values is not None:
        _static_axes(x, axes, "roi")
    out = x
    for k, (ax, n, ratio) in enumerate(zip(axes, sizes, ratios)):
        if n == x.shape[ax] and ratio == 1.0 and roi_values is None:
            continue
        span = (roi_values[k], roi_values[k + len(axes)]) if roi_values is not None else (0.0, 1.0)
        out = _axis(out, ax, n, ratio, a, span)
    return out


def _static_axes(x, axes: list[int], by: str) -> None:
    """The axes Resize changes must be of known size: a symbolic one is named, with
    how to bind it."""
    symbolic = [str(x.shape[ax]) for ax in axes if not isinstance(x.shape[ax], int)]
    if symbolic:
        raise ShapeError(f"Resize by its {by} changes the symbolic dim "
                         f"{', '.join(symbolic)}, whose output length depends on its size: "
                         f"bind it with from_onnx(..., dims={{{symbolic[0]!r}: size}})",
                         expected="a scale of 1 on the symbolic axes, or their sizes bound")


class _Asymmetric:
    """An ``Upsample`` node's (and an opset 10 ``Resize`` node's) attributes as ``Resize``
    reads them: asymmetric coordinates, the nearest value onnxruntime's "simple" mode
    picks (rounded down when enlarging, up when shrinking)."""

    def __init__(self, a):
        self.a = a

    def get(self, name, default=None):
        if name == "coordinate_transformation_mode":
            return "asymmetric"
        if name == "nearest_mode":
            return "simple"
        return self.a.get(name, default)


@define("Upsample", static=(1,))
def _upsample(a, x, scales=None):
    scales = a.get("scales") if scales is None else scales
    return _resize(_Asymmetric(a), x, None, np.asarray(scales, np.float64), None)


def _reflect(x, low: float, high: float):
    span = high - low
    below, above = x < low, x > high
    dx = jnp.where(below, low - x, x - high)
    n = jnp.trunc(dx / span)
    r = dx - n * span
    even = jnp.mod(n, 2) == 0
    return jnp.where(below, jnp.where(even, low + r, high - r),
                     jnp.where(above, jnp.where(even, high - r, low + r), x))


def _keys_cubic(r):
    a = -0.75
    return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a]


@define("GridSample", dtypes="float")
def _grid_sample(a, x, grid):
    import itertools

    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(a.get("mode", "linear"),
                                                          a.get("mode", "linear"))
    padding, aligned = a.get("padding_mode", "zeros"), bool(a.get("align_corners", 0))
    dims = x.shape[2:]
    rank = len(dims)
    g = grid.astype(jnp.float32)
    taps_per_dim = []
    for i, d in enumerate(dims):
        c = g[..., rank - 1 - i]
        v = (c + 1) / 2 * (d - 1) if aligned else ((c + 1) * d - 1) / 2
        low, high = (0.0, d - 1.0) if aligned else (-0.5, d - 0.5)
        if mode == "nearest":
            v = jnp.round(v)
        if padding == "border":
            v = jnp.where((v < low) | (v > high), jnp.clip(v, 0, d - 1), v)
        elif padding == "reflection":
            v = _reflect(v, low, high)
        if mode == "nearest":
            base, weights = v, [jnp.ones_like(v)]
            offsets = [0]
        else:
            base = jnp.floor(v)
            f = v - base
            offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
            weights = [1 - f, f] if mode == "linear" else _keys_cubic(f)
        entries = []
        for off, w in zip(offsets, weights):
            idx = base + off
            if padding == "zeros":
                valid = (idx >= 0) & (idx < d)
            else:
                valid = jnp.ones(idx.shape, bool)
                idx = jnp.clip(idx, 0, d - 1) if padding == "border" else \
                    jnp.trunc(_reflect(idx, low, high))
            entries.append((jnp.clip(idx, 0, d - 1).astype(jnp.int32), w, valid))
        taps_per_dim.append(entries)
    strides = [int(np.prod(dims[i + 1:])) for i in range(rank)]
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    out = jnp.zeros(x.shape[:2] + grid.shape[1:-1], jnp.float32)
    for combo in itertools.product(*taps_per_dim):
        index = sum(idx * s for (idx, _, _), s in zip(combo, strides))
        weight = jnp.ones_like(combo[0][1])
        valid = jnp.ones(combo[0][2].shape, bool)
        for _, w, ok in combo:
            weight, valid = weight * w, valid & ok
        values = jnp.take_along_axis(flat, index.reshape(index.shape[0], 1, -1), axis=2)
        values = values.reshape(out.shape)
        out = out + jnp.where(valid[:, None], weight[:, None], 0) * values
    return out.astype(x.dtype)


@define("AffineGrid", static=(1,), dtypes="float")
def _affine_grid(a, theta, size):
    """The sampling grid of ``GridSample`` for affine matrices ``theta``: the output
    positions, normalized to [-1, 1], times ``theta``."""
    dims = [int(v) for v in np.asarray(size).reshape(-1)[2:]]
    aligned = bool(a.get("align_corners", 0))

    def axis(n):
        if aligned:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        return (2 * np.arange(n) + 1) / n - 1

    coords = np.meshgrid(*[axis(n) for n in dims], indexing="ij")  # per dim, (D,) H, W
    base = np.stack(list(coords[::-1]) + [np.ones(dims)], axis=-1)  # x, y, (z), 1
    grid = jnp.einsum("...k,nik->n...i", jnp.asarray(base, theta.dtype), theta,
                      precision="highest")
    return grid.astype(theta.dtype)
