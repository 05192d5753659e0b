"""ConvTranspose: the transposed (fractionally strided) convolution, 1D, 2D or 3D, as
Keras's Conv2DTranspose and PyTorch's ConvTranspose2d."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from ..core.axes import UNKNOWN, same_dim, weight_axes
from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from . import initializers
from .base import (
    Initializer,
    ParamSpec,
    cast_params,
    expect_count,
    expect_float,
    field,
    to_axes,
    to_param_axes,
)
from .flops import dim_max, dim_min, size, weight_converts
from .spatial import SpatialLayer, any_rank_padding, any_rank_per_dim, any_rank_size, data_format

__all__ = ["ConvTranspose", "transpose_crops", "transpose_taps"]


def transpose_crops(kernel: int, stride: int, padding, dilation: int = 1) -> tuple[int, int]:
    """The ``(low, high)`` crop of one spatial axis of the full transposed convolution
    (``(in - 1) * stride + effective kernel`` long); a negative crop extends it.
    ``"VALID"`` and ``"SAME"`` give Keras's output sizes: ``in * stride + max(kernel -
    stride, 0)`` and ``in * stride``."""
    effective = (kernel - 1) * dilation + 1
    if padding == "VALID":
        return 0, min(effective - stride, 0)
    if padding == "SAME":
        total = effective - stride
        return (total // 2, total - total // 2) if total >= 0 else (0, total)
    return padding


def transpose_taps(size_in, size_out, kernel: int, stride: int, crop_low: int, dilation: int = 1):
    """The (input position, kernel tap) pairs of one axis that land on the output:
    input ``p`` and tap ``k`` write output ``p * stride + k * dilation - crop_low``."""
    taps = 0
    for k in range(kernel):
        offset = crop_low - k * dilation  # output o = p * stride - offset
        first = dim_max(0, -((-offset) // stride))
        upto = dim_min(size_in - 1, (size_out - 1 + offset) // stride)
        taps = taps + dim_max(0, upto - first + 1)
    return taps


@register("conv_transpose")
@dataclasses.dataclass(frozen=True)
class ConvTranspose(SpatialLayer):
    """A transposed convolution: each input position scatters ``kernel * x`` into the
    output, ``stride`` apart (upsampling by ``strides``).

    Output sizes per spatial dim, as Keras: ``"VALID"`` gives ``in * stride +
    max(kernel - stride, 0)``, ``"SAME"`` ``in * stride`` (kernel = ``(k - 1) *
    dilation + 1``); explicit ``(low, high)`` pairs crop the full ``(in - 1) * stride +
    kernel`` output, as PyTorch's ``padding=p, output_padding=q`` is ``(p, p - q)``.

    Params: ``kernel`` in OHWI layout for channel-last data (``features, *kernel_size,
    in``) or OIHW for channel-first (``features, in, *kernel_size``), O the output
    features as for ``Conv``, not flipped: PyTorch's weight ``(in, out, *window)`` is
    the channel-first kernel with its first two axes swapped. ``bias (features,)``.
    Defaults: kernel LeCun normal, bias zeros. Logical axes as ``Conv``'s.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.ConvTranspose(8, (2, 2), strides=2)(mg.Input(("batch", 14, 14, 16)))
      SymbolicTensor(f32[batch,28,28,8], from 'conv_transpose')
    """

    features: int
    kernel_size: int | tuple[int, ...] = field(converter=any_rank_size("kernel_size"))
    strides: int | tuple[int, ...] = field(default=1, converter=any_rank_per_dim("strides", "kernel_size"))
    padding: str | tuple[tuple[int, int], ...] = field(default="VALID",
                                                       converter=any_rank_padding("kernel_size"))
    dilation: int | tuple[int, ...] = field(default=1, converter=any_rank_per_dim("dilation", "kernel_size"))
    use_bias: bool = True
    data_format: str = field(default="NHWC", converter=data_format)
    kernel_init: Initializer | None = None
    bias_init: Initializer | None = None
    kernel_axes: tuple[str | None, ...] | None = field(default=None, converter=to_axes)
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    per_dim_fields = ("strides", "dilation")

    def validate(self):
        if not isinstance(self.features, int) or isinstance(self.features, bool) or self.features < 1:
            self.invalid(f"features must be a positive int, got {self.features!r}")
        for what in ("kernel_size", "strides", "dilation"):
            value = getattr(self, what)
            if any(v < 1 for v in ((value,) if isinstance(value, int) else value)):
                self.invalid(f"{what} must be positive, got {value}")

    @property
    def channels_last(self) -> bool:
        return self.data_format.endswith("C")

    def _crops(self):
        pads = self.padding if not isinstance(self.padding, str) else (self.padding,) * len(self.kernel_size)
        return [transpose_crops(k, s, p, d)
                for k, s, p, d in zip(self.kernel_size, self.strides, pads, self.dilation)]

    def _check(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        n = len(self.kernel_size)
        if x.rank != n + 2:
            raise ShapeError(f"a {n}D transposed convolution takes rank-{n + 2} input "
                             f"({self.data_format})", expected=f"{self.data_format} input of rank {n + 2}")
        channels = x.shape[-1 if self.channels_last else 1]
        if is_symbolic(channels):
            raise ShapeError("the channel dim must be a known int", expected=self.data_format)
        return x, channels

    def _spatial(self, x):
        return x.shape[1:-1] if self.channels_last else x.shape[2:]

    def infer(self, inputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).infer(inputs)
        x, _ = self._check(inputs)
        out = []
        for extent, k, s, d, (lo, hi) in zip(self._spatial(x), self.kernel_size, self.strides,
                                             self.dilation, self._crops()):
            o = (extent - 1) * s + (k - 1) * d + 1 - lo - hi
            if not is_symbolic(o) and o < 1:
                raise ShapeError(f"the padding {self.padding!r} crops the whole output of "
                                 f"{shape_str(self._spatial(x))}", expected="smaller (low, high) pairs")
            out.append(o)
        shape = (x.shape[0], *out, self.features) if self.channels_last else (x.shape[0], self.features, *out)
        return (x.with_shape(shape),)

    def param_specs(self, inputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).param_specs(inputs)
        _, channels = self._check(inputs)
        n = len(self.kernel_size)
        if self.channels_last:
            shape = (self.features, *self.kernel_size, channels)
            init = initializers.lecun_normal_conv_channels_last
            axes = ("mlp",) + (None,) * n + ("embed",)
        else:
            shape = (self.features, channels, *self.kernel_size)
            init = initializers.lecun_normal_conv_channels_first
            axes = ("mlp", "embed") + (None,) * n
        axes = self.kernel_axes or axes
        specs = {"kernel": ParamSpec(shape, self.kernel_init or init, axes)}
        if self.use_bias:
            specs["bias"] = ParamSpec((self.features,), self.bias_init or initializers.zeros, axes[:1])
        return specs

    def output_axes(self, input_axes, inputs, outputs):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).output_axes(input_axes, inputs, outputs)
        kernel = weight_axes(self, inputs)[0]["kernel"][1]
        x, out = inputs[0], outputs[0]
        channel = (-1 if self.channels_last else 1) % x.rank
        axes = [a if same_dim(x.shape[i], out.shape[i]) else UNKNOWN for i, a in enumerate(input_axes[0])]
        axes[channel] = kernel[0]
        return (tuple(axes),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).apply(params, state, inputs, rng=rng, inference_mode=inference_mode)
        (x,) = inputs
        p = cast_params(params, x.dtype)
        n = len(self.kernel_size)
        if self.channels_last:
            specs = (self.data_format, "O" + self.data_format[1:-1] + "I", self.data_format)
            spatial_axes = tuple(range(1, n + 1))
        else:
            specs = (self.data_format, "OI" + self.data_format[2:], self.data_format)
            spatial_axes = tuple(range(2, n + 2))
        # The scatter of each input position is a convolution of the input, dilated by
        # the strides, with the spatially flipped kernel over the padded extent.
        padding = [((k - 1) * d - lo, (k - 1) * d - hi)
                   for k, d, (lo, hi) in zip(self.kernel_size, self.dilation, self._crops())]
        y = lax.conv_general_dilated(
            x, jnp.flip(p["kernel"], spatial_axes), window_strides=(1,) * n, padding=padding,
            lhs_dilation=self.strides, rhs_dilation=self.dilation, dimension_numbers=specs)
        if self.use_bias:
            y = y + (p["bias"] if self.channels_last else p["bias"].reshape((-1,) + (1,) * n))
        return (y.astype(x.dtype),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``2 * in_channels * features`` per (input position, kernel tap) pair that
        lands on the output, the bias add and the converts of the weights."""
        if isinstance(self.kernel_size, int):
            return self.resolved(inputs).flops(inputs, outputs, param_dtype=param_dtype,
                                               inference_mode=inference_mode)
        (x,), (y,) = inputs, outputs
        _, channels = self._check(inputs)
        taps = x.shape[0]
        for n_in, n_out, k, s, d, (lo, _) in zip(self._spatial(x), self._spatial(y), self.kernel_size,
                                                 self.strides, self.dilation, self._crops()):
            taps = taps * transpose_taps(n_in, n_out, k, s, lo, d)
        count = 2 * taps * channels * self.features + (size(y) if self.use_bias else 0)
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)


