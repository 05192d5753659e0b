"""What the spatial layers share (convolutions, pooling, resizing): data formats,
window output sizes, and the int size that means every spatial dim of the input."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..core.errors import ShapeError
from ..core.specs import is_symbolic
from .base import Layer, padding_for, per_spatial_dim, spatial_dims

__all__ = ["window_output_size", "data_format", "any_data_format", "any_rank_size", "any_rank_per_dim",
           "any_rank_padding", "SpatialLayer", "CHANNELS_LAST", "CHANNELS_FIRST", "CONVOLUTION_OPS"]

#: The registered ops that convolve: mlaxgraph's own and the imported ONNX and ATen
#: families'. On the CPU, XLA runs a convolution slower inside a loop (so the scan rule
#: keeps their blocks unrolled) and in a donated step without its weights' copies (so
#: the Trainer keeps XLA's default copy analysis for a model that has one).
CONVOLUTION_OPS = frozenset({
    "conv", "conv_transpose", "quantized_conv",
    "onnx.Conv", "onnx.ConvTranspose", "onnx.ConvInteger", "onnx.DeformConv",
    "onnx.CausalConvWithState",
    "aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default",
    "aten.conv3d.default", "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv3d.padding",
    "aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input"})

CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}
CHANNELS_FIRST = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def window_output_size(size, window: int, stride: int, padding, dilation: int = 1):
    """Output length of a sliding window; ``size`` may be symbolic. None if it is empty."""
    effective = (window - 1) * dilation + 1
    if padding == "SAME":
        return -(-size // stride)
    low, high = (0, 0) if padding == "VALID" else padding
    padded = size + low + high
    if not is_symbolic(padded):
        return None if padded < effective else (padded - effective) // stride + 1
    # The form jax.eval_shape gives, so that inferred and traced shapes compare equal.
    return ((padded - effective) // stride + 1).max(0)


def data_format(value: Any, layer: SpatialLayer) -> str:
    """``NHWC``/``channels_last`` or ``NCHW``/``channels_first``, in the form for the
    layer's number of spatial dims (``NWC``, ``NHWC``, ``NDHWC``; ``NCW``, ...); for a
    layer whose number of spatial dims comes from its input (an int kernel size),
    ``NHWC`` or ``NCHW``."""
    fmt = value.upper() if isinstance(value, str) else None
    size = getattr(layer, layer.size_field)
    if isinstance(size, int):
        return any_data_format(value, layer)
    n = len(size)
    if fmt in ("NHWC", "CHANNELS_LAST", CHANNELS_LAST[n]):
        return CHANNELS_LAST[n]
    if fmt in ("NCHW", "CHANNELS_FIRST", CHANNELS_FIRST[n]):
        return CHANNELS_FIRST[n]
    layer.invalid(f"data_format must be {CHANNELS_LAST[n]!r} or {CHANNELS_FIRST[n]!r} "
                  f"for {n} spatial dims, got {value!r}")


def any_data_format(value: Any, layer: Layer) -> str:
    """``"NHWC"`` (channel-last, any number of spatial dims: ``NWC``, ``channels_last``
    taken) or ``"NCHW"`` (channel-first)."""
    fmt = value.upper() if isinstance(value, str) else None
    if fmt in ("CHANNELS_LAST", *CHANNELS_LAST.values()):
        return "NHWC"
    if fmt in ("CHANNELS_FIRST", *CHANNELS_FIRST.values()):
        return "NCHW"
    layer.invalid(f"data_format must be 'NHWC' or 'NCHW', got {value!r}")


def any_rank_size(what: str) -> Any:
    """A converter of a kernel size or window: an int (every spatial dim, their number
    taken from the input) or a tuple of 1, 2 or 3 ints."""
    tuple_form = spatial_dims(what)

    def convert(value: Any, layer: Layer):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        return tuple_form(value, layer)

    return convert


def any_rank_per_dim(what: str, of: str, default_to: str | None = None) -> Any:
    """``per_spatial_dim``, but an int stays an int while the field ``of`` is one."""
    tuple_form = per_spatial_dim(what, of, default_to)

    def convert(value: Any, layer: Layer):
        if value is None and default_to is not None:
            value = getattr(layer, default_to)
        if isinstance(getattr(layer, of), int):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                layer.invalid(f"{what} must be an int when {of} is one (its number of dims "
                              f"comes from the input); give {of} as a tuple, got {value!r}")
            return int(value)
        return tuple_form(value, layer)

    return convert


def any_rank_padding(of: str) -> Any:
    """``padding_for``, taking only ``"SAME"`` or ``"VALID"`` while the field ``of`` is an int."""
    tuple_form = padding_for(of)

    def convert(value: Any, layer: Layer):
        if isinstance(getattr(layer, of), int):
            if not isinstance(value, str) or value.upper() not in ("SAME", "VALID"):
                layer.invalid(f"padding must be 'SAME' or 'VALID' when {of} is an int; give "
                              f"{of} as a tuple for explicit pairs, got {value!r}")
            return value.upper()
        return tuple_form(value, layer)

    return convert


class SpatialLayer(Layer):
    """A layer whose int ``size_field`` (``kernel_size``, ``window``, ``scale``) means
    every spatial dim of its input: it runs as the same layer with tuples, made for the
    input's rank (``for_rank``)."""

    windowed = True
    size_field = "kernel_size"
    #: Fields that follow ``size_field``: per spatial dim when it is a tuple.
    per_dim_fields: tuple[str, ...] = ()

    def spatial_count(self) -> int | None:
        size = getattr(self, self.size_field)
        return None if isinstance(size, int) else len(size)

    def for_rank(self, rank: int) -> Layer:
        """This layer with every per-dim field a tuple of ``rank - 2`` entries."""
        n = rank - 2
        cache = self.__dict__.setdefault("_for_rank", {})
        if n not in cache:
            if n not in (1, 2, 3):
                raise ShapeError(f"{type(self).__name__} with an int {self.size_field} takes "
                                 f"inputs with 1, 2 or 3 spatial dims, got rank {rank}",
                                 expected="rank 3, 4 or 5")
            changes: dict[str, Any] = {f: (getattr(self, f),) * n
                                       for f in (self.size_field, *self.per_dim_fields)}
            layer = dataclasses.replace(self, **changes)
            object.__setattr__(layer, "_created_at", self.__dict__.get("_created_at"))
            cache[n] = layer
        return cache[n]

    def resolved(self, inputs) -> Layer:
        if self.spatial_count() is not None or not inputs:
            return self
        return self.for_rank(len(inputs[0].shape))
