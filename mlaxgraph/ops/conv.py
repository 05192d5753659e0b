"""Conv: 1D, 2D and 3D convolution, channel-last (OHWI kernel) or channel-first (OIHW)."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from ..core.axes import UNKNOWN, same_dim, weight_axes
from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from . import initializers
from .activation import activation_caveat, activation_flops, apply_activation, to_activation
from .base import (
    Initializer,
    ParamSpec,
    cast_params,
    expect_count,
    expect_float,
    field,
    to_accumulation_dtype,
    to_axes,
    to_param_axes,
    to_precision,
)
from .flops import dim_max, size, weight_converts, window_taps
from .spatial import SpatialLayer, any_rank_padding, any_rank_per_dim, any_rank_size, data_format
from .spatial import window_output_size as window_output_size

__all__ = ["Conv", "window_output_size"]


@register("conv")
@dataclasses.dataclass(frozen=True)
class Conv(SpatialLayer):
    """An N-D convolution (N = ``len(kernel_size)``: 1, 2 or 3; an int ``kernel_size``
    means every spatial dim of the input, as ``ops.Conv(16, 3)``).

    Params: ``kernel`` in OHWI layout for channel-last data (``features, *kernel_size,
    in // groups``) or OIHW for channel-first (``features, in // groups, *kernel_size``),
    and ``bias (features,)``. Defaults: kernel LeCun normal (fan in), bias zeros.
    Logical axes (for sharding): kernel ``("mlp", None, None, "embed")`` for
    channel-last 2D (``("mlp", "embed", None, None)`` channel-first; one ``None`` per
    spatial dim) unless ``kernel_axes`` says otherwise, bias the kernel's first; the
    output's channel dim takes the kernel's first name. ``param_axes`` overrides one
    weight.

    ``precision`` and ``preferred_element_type`` (accumulation dtype) go to
    ``lax.conv_general_dilated``; the output has the input's dtype.

    ``data_format`` is ``"NHWC"`` (channel-last; also the default for 1D and 3D, where
    it means ``NWC`` / ``NDHWC``) or channel-first ``"NCHW"`` (``NCW`` / ``NCDHW``).
    ``activation`` (``"relu"``, ``"gelu"``, ``"silu"``, ``"tanh"``, ``"sigmoid"`` or
    the functional form, ``ops.relu``) is applied to the output, as Keras's.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.Conv(16, (3, 3), padding="SAME")(mg.Input(("batch", 28, 28, 1)))
      SymbolicTensor(f32[batch,28,28,16], from 'conv')
    """

    features: int
    kernel_size: int | tuple[int, ...] = field(converter=any_rank_size("kernel_size"))
    strides: int | tuple[int, ...] = field(default=1, converter=any_rank_per_dim("strides", "kernel_size"))
    padding: str | tuple[tuple[int, int], ...] = field(default="VALID",
                                                       converter=any_rank_padding("kernel_size"))
    dilation: int | tuple[int, ...] = field(default=1, converter=any_rank_per_dim("dilation", "kernel_size"))
    groups: int = 1
    use_bias: bool = True
    data_format: str = field(default="NHWC", converter=data_format)
    kernel_init: Initializer | None = None
    bias_init: Initializer | None = None
    kernel_axes: tuple[str | None, ...] | None = field(default=None, converter=to_axes)
    precision: str | None = field(default=None, converter=to_precision)
    preferred_element_type: np.dtype | None = field(default=None, converter=to_accumulation_dtype)
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)
    activation: str | None = field(default=None, converter=to_activation)

    per_dim_fields = ("strides", "dilation")

    def validate(self):
        if not isinstance(self.features, int) or isinstance(self.features, bool) or self.features < 1:
            self.invalid(f"features must be a positive int, got {self.features!r}")
        for what in ("kernel_size", "strides", "dilation"):
            value = getattr(self, what)
            if any(v < 1 for v in ((value,) if isinstance(value, int) else value)):
                self.invalid(f"{what} must be positive, got {getattr(self, what)}")
        if not isinstance(self.groups, int) or self.groups < 1 or self.features % self.groups:
            self.invalid(f"groups must be a positive int dividing features={self.features}, "
                         f"got {self.groups!r}")

    def xla_cost_caveat(self, inference_mode):
        return activation_caveat(self.activation)

    @property
    def channels_last(self) -> bool:
        return self.data_format.endswith("C")

    def _channel_axis(self) -> int:
        return -1 if self.channels_last else 1

    def _check(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        n = len(self.kernel_size)
        if x.rank != n + 2:
            raise ShapeError(f"a {n}D convolution takes rank-{n + 2} input ({self.data_format})",
                             expected=f"{self.data_format} input of rank {n + 2}")
        channels = x.shape[self._channel_axis()]
        if is_symbolic(channels):
            raise ShapeError("the channel dim must be a known int", expected=self.data_format)
        if channels % self.groups:
            raise ShapeError(f"{channels} input channels are not divisible by groups={self.groups}",
                             expected=f"channels divisible by {self.groups}")
        return x, channels

    def infer(self, inputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).infer(inputs)
        x, _ = self._check(inputs)
        spatial = x.shape[1:-1] if self.channels_last else x.shape[2:]
        pads = self.padding if not isinstance(self.padding, str) else (self.padding,) * len(spatial)
        out = []
        for extent, k, s, d, p in zip(spatial, self.kernel_size, self.strides, self.dilation, pads):
            o = window_output_size(extent, k, s, p, d)
            if o is None or (not is_symbolic(o) and o < 1):
                raise ShapeError(
                    f"the kernel {self.kernel_size} (dilation {self.dilation}) is larger than the "
                    f"padded input {shape_str(spatial)} with padding {self.padding!r}",
                    expected="spatial dims >= "
                             f"{tuple((k - 1) * d + 1 for k, d in zip(self.kernel_size, self.dilation))}")
            out.append(o)
        if self.channels_last:
            shape = (x.shape[0], *out, self.features)
        else:
            shape = (x.shape[0], self.features, *out)
        return (x.with_shape(shape),)

    def param_specs(self, inputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).param_specs(inputs)
        _, channels = self._check(inputs)
        per_group = channels // self.groups
        if self.channels_last:
            shape = (self.features, *self.kernel_size, per_group)
            init = initializers.lecun_normal_conv_channels_last
            axes = ("mlp",) + (None,) * len(self.kernel_size) + ("embed",)
        else:
            shape = (self.features, per_group, *self.kernel_size)
            init = initializers.lecun_normal_conv_channels_first
            axes = ("mlp", "embed") + (None,) * len(self.kernel_size)
        specs = {"kernel": ParamSpec(shape, self.kernel_init or init, self.kernel_axes or axes)}
        if self.use_bias:
            specs["bias"] = ParamSpec((self.features,), self.bias_init or initializers.zeros,
                                      ((self.kernel_axes or axes)[0],))
        return specs

    def output_axes(self, input_axes, inputs, outputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).output_axes(input_axes, inputs, outputs)
        kernel = weight_axes(self, inputs)[0]["kernel"][1]
        x, out, channel = inputs[0], outputs[0], self._channel_axis() % inputs[0].rank
        axes = [a if same_dim(x.shape[i], out.shape[i]) else UNKNOWN
                for i, a in enumerate(input_axes[0])]
        axes[channel] = kernel[0]
        return (tuple(axes),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).apply(params, state, inputs, rng=rng,
                                               inference_mode=inference_mode)
        (x,) = inputs
        p = cast_params(params, x.dtype)
        n = len(self.kernel_size)
        if self.channels_last:
            specs = (self.data_format, "O" + self.data_format[1:-1] + "I", self.data_format)
        else:
            specs = (self.data_format, "OI" + self.data_format[2:], self.data_format)
        y = lax.conv_general_dilated(
            x, p["kernel"], window_strides=self.strides, padding=self.padding,
            rhs_dilation=self.dilation, dimension_numbers=specs,
            feature_group_count=self.groups, precision=self.precision,
            preferred_element_type=self.preferred_element_type)
        if self.use_bias:
            bias = p["bias"] if self.channels_last else p["bias"].reshape((-1,) + (1,) * n)
            y = y + bias.astype(y.dtype)
        return (apply_activation(self.activation, y.astype(x.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``2 * in_channels / groups * features`` per kernel tap that lands on the
        input (taps on the padding are not counted, as XLA does), per example; the
        bias add, the activation, and the converts of the weights and of a
        ``preferred_element_type`` result."""
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).flops(inputs, outputs, param_dtype=param_dtype,
                                               inference_mode=inference_mode)
        (x,), (y,) = inputs, outputs
        first = 1 if self.channels_last else 2
        spatial_in = x.shape[first:first + len(self.kernel_size)]
        spatial_out = y.shape[first:first + len(self.kernel_size)]
        channels = x.shape[self._channel_axis()]
        taps = x.shape[0]
        for axis, (n, out) in enumerate(zip(spatial_in, spatial_out)):
            k, s, d = self.kernel_size[axis], self.strides[axis], self.dilation[axis]
            if self.padding == "VALID":
                low = 0
            elif self.padding == "SAME":  # as lax.padtype_to_pads
                low = dim_max((out - 1) * s + (k - 1) * d + 1 - n, 0) // 2
            else:
                low = self.padding[axis][0]
            taps = taps * window_taps(n, out, k, s, low, d)
        count = 2 * taps * (channels // self.groups) * self.features
        count = count + (size(y) if self.use_bias else 0)
        count = count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)
        if self.preferred_element_type is not None and self.preferred_element_type != x.dtype:
            count = count + size(y) + (self.features if self.use_bias else 0)
        return count + activation_flops(self.activation, y)
