"""Upsample and resize: nearest-neighbour and bilinear interpolation over the spatial
dims, as PyTorch's ``nn.Upsample`` / ``F.interpolate`` with ``align_corners=False``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from .base import Layer, expect_count, expect_float, field, to_ints
from .flops import size
from .spatial import SpatialLayer, any_data_format, any_rank_size, data_format

__all__ = ["Upsample", "Resize", "resize", "interpolation"]

METHODS = ("nearest", "bilinear")


def _method(value: Any, layer: Layer) -> str:
    method = str(value).lower()
    method = {"linear": "bilinear", "trilinear": "bilinear"}.get(method, method)
    if method not in METHODS:
        layer.invalid(f"method must be 'nearest' or 'bilinear', got {value!r}")
    return method


def interpolation(n_in: int, n_out: int, method: str):
    """Per output position of one axis: the source indices and, for bilinear, the weight
    of the second: PyTorch's ``align_corners=False`` rule, ``src = (dst + 0.5) * in /
    out - 0.5`` clamped at 0 (bilinear) and ``floor(dst * in / out)`` (nearest)."""
    dst = np.arange(n_out, dtype=np.float64)
    if method == "nearest":
        return np.minimum(np.floor(dst * n_in / n_out).astype(np.int32), n_in - 1), None, None
    src = np.maximum((dst + 0.5) * n_in / n_out - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int32), n_in - 1)
    high = np.minimum(low + 1, n_in - 1)
    return low, high, src - low


def _gather(x, axis: int, indices: np.ndarray):
    """``x`` at the (in-range) ``indices`` along ``axis``: one gather, no index checks."""
    return x.at[(slice(None),) * axis + (indices,)].get(mode="promise_in_bounds")


class _Interpolate(Layer):
    """Shared by Upsample and Resize: ``_sizes(spatial)`` gives the output sizes."""

    data_format: str  # a field of each subclass

    @property
    def channels_last(self) -> bool:
        return self.data_format.endswith("C")

    def _axes(self, rank):
        return tuple(range(1, rank - 1)) if self.channels_last else tuple(range(2, rank))

    def _check(self, inputs, n):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        if x.rank != n + 2:
            raise ShapeError(f"takes {self.data_format} input with {n} spatial dims",
                             expected=f"rank {n + 2}")
        spatial = tuple(x.shape[a] for a in self._axes(x.rank))
        if any(is_symbolic(d) for d in spatial):
            raise ShapeError("the spatial dims must be known ints", expected="concrete spatial dims")
        return x, spatial

    def _infer(self, x, spatial):
        axes = self._axes(x.rank)
        shape = list(x.shape)
        for a, o in zip(axes, self._sizes(spatial)):
            shape[a] = o
        return (x.with_shape(shape),)

    def _interpolate(self, x):
        axes = self._axes(x.ndim)
        sizes = self._sizes(tuple(x.shape[a] for a in axes))
        for a, n_out in zip(axes, sizes):
            n_in = x.shape[a]
            if n_in == n_out:
                continue
            low, high, weight = interpolation(n_in, n_out, self.method)
            if weight is None:
                x = _gather(x, a, low)
                continue
            shape = [1] * x.ndim
            shape[a] = n_out
            w = weight.reshape(shape)
            x = _gather(x, a, low) * np.asarray(1 - w, x.dtype) + _gather(x, a, high) * np.asarray(w, x.dtype)
        return x

    def _flops(self, x):
        """Bilinear: per resized axis, two multiplies and an add per element of its
        result; nearest moves data only."""
        if self.method == "nearest":
            return 0
        shape = list(x.shape)
        axes = self._axes(x.rank)
        count = 0
        for a, n_out in zip(axes, self._sizes(tuple(x.shape[a] for a in axes))):
            if shape[a] == n_out:
                continue
            shape[a] = n_out
            count = count + 3 * size(shape)
        return count


@register("upsample")
@dataclasses.dataclass(frozen=True)
class Upsample(SpatialLayer, _Interpolate):
    """Scales the spatial dims by ``scale`` (an int for every spatial dim, or one per
    dim): ``method="nearest"`` repeats, ``"bilinear"`` interpolates (linearly along
    each axis: bilinear in 2D, trilinear in 3D) as PyTorch's ``nn.Upsample`` with
    ``align_corners=False``. ``data_format`` ``"NHWC"`` (default) or ``"NCHW"``.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.Upsample(2)(mg.Input(("batch", 7, 7, 16)))
      SymbolicTensor(f32[batch,14,14,16], from 'upsample')
    """

    scale: int | tuple[int, ...] = field(converter=any_rank_size("scale"))
    method: str = field(default="nearest", converter=_method)
    data_format: str = field(default="NHWC", converter=data_format)

    size_field = "scale"

    def validate(self):
        if any(s < 1 for s in ((self.scale,) if isinstance(self.scale, int) else self.scale)):
            self.invalid(f"scale must be positive, got {self.scale}")

    def _sizes(self, spatial):
        return tuple(d * s for d, s in zip(spatial, self.scale))

    def infer(self, inputs):
        if isinstance(self.scale, int):
            return self.resolved(inputs).infer(inputs)
        return self._infer(*self._check(inputs, len(self.scale)))

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if isinstance(self.scale, int):
            return self.resolved(inputs).apply(params, state, inputs, rng=rng, inference_mode=inference_mode)
        return (self._interpolate(inputs[0]),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        if isinstance(self.scale, int):
            return self.resolved(inputs).flops(inputs, outputs, param_dtype=param_dtype,
                                               inference_mode=inference_mode)
        return self._flops(inputs[0])


@register("resize")
@dataclasses.dataclass(frozen=True)
class Resize(_Interpolate):
    """Resizes the spatial dims to ``shape`` (one size per spatial dim), nearest or
    bilinear, as PyTorch's ``F.interpolate(size=..., align_corners=False)`` (no
    antialiasing when shrinking)."""

    shape: tuple[int, ...] = field(converter=to_ints("shape"))
    method: str = field(default="bilinear", converter=_method)
    data_format: str = field(default="NHWC", converter=any_data_format)

    def validate(self):
        if not 1 <= len(self.shape) <= 3 or any(d < 1 for d in self.shape):
            self.invalid(f"shape must hold 1 to 3 positive spatial sizes, got {self.shape}")

    def _sizes(self, spatial):
        return self.shape

    def infer(self, inputs):
        return self._infer(*self._check(inputs, len(self.shape)))

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (self._interpolate(inputs[0]),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return self._flops(inputs[0])


def resize(x, shape, method: str = "bilinear", data_format: str = "NHWC"):
    """``Resize(shape, method, data_format)(x)``: ``shape`` the spatial sizes."""
    return Resize(tuple(shape), method, data_format)(x)
