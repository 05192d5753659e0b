"""Quantized layers: Linear and Conv (Embedding: ``quantized_embedding.py``) whose
weights are stored as a scheme says (``mlaxgraph/ops/quantize.py``): int8, packed int4
or float8 values with float32 scales. Each is its float layer's class with more
fields, ``scheme``, ``group_size`` and ``dequantize``, so it keeps every hyperparameter
(and is adapted by LoRA as its float layer is); ``mg.quantize`` makes them,
``mg.quantize_weights`` fills their weights.

Weights: ``kernel`` (``embedding``) holds the values, ``kernel_scale``
(``embedding_scale``) the scales: one per output channel (per row of an embedding
table), or for int4 one per group of ``group_size`` inputs (features of a table row)
and output channel. Biases stay float, in the policy's ``param_dtype``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec, is_symbolic
from . import initializers
from .activation import activation_flops, apply_activation
from .conv import Conv
from .flops import size
from .linear import Linear
from .patches import patch_conv
from .quantize import FLOAT8, SCHEMES, dequantize_groups, dequantized_dot, int8_product, padded_row_flops, unpack_int4

__all__ = ["QuantizedLinear", "QuantizedConv"]

_INT8 = np.dtype(jnp.int8)
_F32 = np.dtype(jnp.float32)


class _Scheme:
    """What the three quantized layers share: the scheme's checks and dtypes."""

    scheme: str
    group_size: int | None

    def _check_scheme(self) -> None:
        layer: Any = self
        if self.scheme not in SCHEMES:
            layer.invalid(f"scheme must be one of {', '.join(map(repr, SCHEMES))}, got "
                          f"{self.scheme!r}")
        if self.scheme == "int4_weight_only":
            g = self.group_size
            if not isinstance(g, int) or isinstance(g, bool) or g < 2 or g % 2:
                layer.invalid(f"int4_weight_only needs an even group_size >= 2 (32 or 128), "
                              f"got {g!r}")
        elif self.group_size is not None:
            layer.invalid(f"group_size is for int4_weight_only, not {self.scheme!r}")

    @property
    def separate(self) -> bool:
        """Whether a ``Dequantize`` node rescales this layer's product (``dequantize=
        False``, reading a quantized input): the layer outputs ``(acc, kernel_scale[,
        bias])``."""
        return self.quantizes_inputs and not getattr(self, "dequantize", True)

    def _check_separate(self) -> None:
        layer: Any = self
        if not isinstance(getattr(self, "dequantize", True), bool):
            layer.invalid(f"dequantize must be a bool, got {layer.dequantize!r}")
        if self.separate and getattr(self, "activation", None) is not None:
            layer.invalid("with dequantize=False the Dequantize node after the layer applies "
                          "the activation; give it there")

    def _separate_outputs(self, acc, features: int, bias: bool) -> tuple:
        """The specs of ``(acc, kernel_scale[, bias])`` (the scales and bias float32) of
        a layer rescaled by a ``Dequantize`` node."""
        acc_dtype = np.dtype(jnp.int32) if self.scheme == "int8" else _F32
        channel = acc.with_shape((features,)).with_dtype(_F32)
        return (acc.with_dtype(acc_dtype), channel) + ((channel,) if bias else ())

    def _separate_axes(self, axes: tuple, channel: int, count: int) -> tuple:
        """The logical axis names of ``(acc, kernel_scale[, bias])`` (``count``
        outputs): the accumulator's ``axes`` (the float layer's output's), the
        per-channel vectors those of its dim ``channel``."""
        return (tuple(axes),) + ((axes[channel],),) * (count - 1)

    def _kernel_override(self, weight: str) -> tuple | None:
        """The logical axes ``param_axes`` gives the stored ``weight`` (which its scales
        follow), or None."""
        return dict(getattr(self, "param_axes", None) or ()).get(weight)

    @property
    def quantizes_inputs(self) -> bool:
        """Whether the layer reads its input quantized (``(q, scale)`` from a
        ``Quantize`` node): the int8 and float8 schemes."""
        return self.scheme in ("int8", "float8")

    @property
    def input_dtype(self) -> np.dtype:
        """The dtype of ``q`` a layer quantizing its input reads."""
        return FLOAT8 if self.scheme == "float8" else _INT8

    @property
    def value_dtype(self) -> np.dtype:
        """The dtype the weight's values are stored in."""
        return {"float8": FLOAT8, "int4_weight_only": np.dtype(jnp.uint8)}.get(self.scheme, _INT8)

    def _quantized_inputs(self, inputs, zero: bool = False) -> tuple[Any, Any]:
        """``(q, scale)`` of the inputs; ``zero``: a Linear, which also reads the
        ``zero`` of a ``Quantize(zero_point=True)`` (int8)."""
        counts = (2, 3) if zero and self.scheme == "int8" else (2,)
        if len(inputs) not in counts:
            raise ShapeError(f"scheme {self.scheme!r} reads (q, scale) from a Quantize node, "
                             f"got {len(inputs)} input(s)", expected="2 tensors")
        q, s = inputs[:2]
        if q.dtype != self.input_dtype or not s.is_float:
            raise DTypeError(f"scheme {self.scheme!r} reads {self.input_dtype} values and a "
                             f"float scale, got {q.dtype} and {s.dtype}",
                             expected=f"{self.input_dtype}, float32")
        if len(inputs) == 3 and (inputs[2].dtype != np.dtype(jnp.int32)
                                 or inputs[2].shape != s.shape):
            raise DTypeError(f"the zero point must be int32 of the scale's shape {s.shape}, got "
                             f"{inputs[2].dtype}{list(inputs[2].shape)}",
                             expected=f"int32{list(s.shape)}")
        return q, s

    def _groups(self, n: int) -> int:
        g = self.group_size or 1
        if is_symbolic(n) or n % g:
            raise ShapeError(f"int4_weight_only groups the {n} inputs by {g}, which does not "
                             f"divide them", expected=f"an input size divisible by {g}")
        return n // g

    def _dequantize_flops(self, weights: int, outputs: int) -> int:
        """The converts and multiplies turning stored weights (or a quantized product)
        into floats."""
        if self.scheme == "int4_weight_only":
            # unpacking a byte: shift, convert, shift (low nibble), convert, shift (high);
            # per value the convert to float and the multiply by the group's scale
            return 5 * (weights // 2) + 2 * weights
        if self.scheme == "int8_weight_only":
            return weights + outputs  # the kernel's convert, the scale's multiply per output
        if self.scheme == "float8":
            return 2 * outputs  # two multiplies (the product is float32 already)
        return 3 * outputs  # the accumulator's convert, two multiplies


@register("quantized_linear")
@dataclasses.dataclass(frozen=True)
class QuantizedLinear(_Scheme, Linear):
    """A ``Linear`` whose ``kernel`` is stored as ``scheme`` says, with its
    ``kernel_scale``. Params: ``kernel`` ``(in, features)`` int8 or float8 (int4:
    ``(in / 2, features)`` uint8, two values a byte along the input), ``kernel_scale``
    ``(features,)`` float32 (int4: ``(in / group_size, features)``), ``bias`` as
    ``Linear``'s. Logical axes (for sharding): as ``Linear``'s; ``kernel_scale`` the
    kernel's last (int4: ``(None, <last>)``). With ``int8`` / ``float8`` it reads
    ``(q, scale)`` from a ``Quantize`` node and multiplies int8 x int8 -> int32
    (float8 x float8 -> float32), then scales back: ``acc * scale * kernel_scale +
    bias``; from a ``Quantize(zero_point=True)`` it reads ``(q, scale, zero)`` and
    subtracts ``zero`` times the kernel's column sums from ``acc`` first: they are the
    param ``kernel_sum`` ``(features,)`` int32, made with the kernel by
    ``mg.quantize_weights`` (summing them at each call costs more than the dot). Weight-only
    schemes read the float input: ``x @ dequantized + bias``.
    The output has the scale's (the float input's) dtype. With ``dequantize=False``
    (what ``mg.quantize`` makes) a layer reading a quantized input outputs ``(acc,
    kernel_scale[, bias])`` instead (``acc`` int32, float32 for float8; the scales and
    bias float32) and a ``Dequantize`` node after it rescales, adds the bias and
    applies the activation; the same holds for ``QuantizedConv`` and a quantized tied
    head (``QuantizedEmbedding.attend``: ``(acc, embedding_scale)``).
    """

    scheme: str = "int8"
    group_size: int | None = None
    dequantize: bool = True

    def validate(self):
        super().validate()
        self._check_scheme()
        self._check_separate()

    def _in_features(self, inputs):
        if not self.quantizes_inputs:
            n = super()._in_features(inputs)
        else:
            q, _ = self._quantized_inputs(inputs, zero=True)
            if q.rank < 1 or is_symbolic(q.shape[-1]):
                raise ShapeError("the last (contracted) dim must be a known int",
                                 expected=f"{q.dtype}[..., in]")
            n = q.shape[-1]
        if self.scheme == "int4_weight_only":
            self._groups(n)
        return n

    def infer(self, inputs):
        self._in_features(inputs)
        x = inputs[0]
        dtype = inputs[1].dtype if self.quantizes_inputs else x.dtype
        y = x.with_shape(x.shape[:-1] + (self.features,)).with_dtype(dtype)
        if self.separate:
            return self._separate_outputs(y, self.features, self.use_bias)
        return (y,)

    def output_axes(self, input_axes, inputs, outputs):
        (axes,) = super().output_axes(input_axes, inputs, outputs)
        return self._separate_axes(axes, -1, len(outputs))

    def param_specs(self, inputs):
        n_in = self._in_features(inputs)
        # the scales and sums follow the kernel's columns, as param_axes names them too
        axes = self._kernel_override("kernel") or self.kernel_axes or ("embed", "mlp")
        if self.scheme == "int4_weight_only":
            kernel = (n_in // 2, self.features)
            scale, scale_axes = (self._groups(n_in), self.features), (None, axes[-1])
        else:
            kernel, scale, scale_axes = (n_in, self.features), (self.features,), axes[-1:]
        specs = {"kernel": ParamSpec(kernel, initializers.zeros, axes, dtype=self.value_dtype),
                 "kernel_scale": ParamSpec(scale, initializers.ones, scale_axes, dtype=_F32)}
        if len(inputs) == 3:  # a zero point: the kernel's column sums, made with the kernel
            specs["kernel_sum"] = ParamSpec((self.features,), initializers.zeros, axes[-1:],
                                            dtype=np.dtype(jnp.int32))
        if self.use_bias:
            specs["bias"] = ParamSpec((self.features,), self.bias_init or initializers.zeros,
                                      axes[-1:])
        return specs

    def apply(self, params, state, inputs, *, rng, inference_mode):
        kernel, scale = params["kernel"], params["kernel_scale"]
        if self.quantizes_inputs:
            q, s = inputs[:2]
            if self.scheme == "int8":
                acc = int8_product(q, kernel)
            else:  # float8 x float8, accumulated in float32
                acc = lax.dot_general(q, kernel, (((q.ndim - 1,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)
            if len(inputs) == 3:  # (q - zero) @ kernel = q @ kernel - zero * column sums
                acc = acc - inputs[2] * params["kernel_sum"]
            if self.separate:
                passed = (params["bias"].astype(jnp.float32),) if self.use_bias else ()
                return (acc, scale) + passed, state
            y = acc.astype(jnp.float32) * s.astype(jnp.float32) * scale
            out_dtype = s.dtype
        else:
            (x,) = inputs
            y = dequantized_dot(x, kernel, scale, self.scheme, True, self.precision,
                                self.preferred_element_type)
            out_dtype = x.dtype
        if self.use_bias:
            y = y + params["bias"].astype(y.dtype)
        return (apply_activation(self.activation, y.astype(out_dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The dot (``2 * in * out`` per row), the dequantization (``_dequantize_flops``),
        the zero point's correction, the bias add, the activation."""
        y = outputs[0]
        n_in = self._in_features(inputs)
        count = 2 * size(y) * n_in
        if self.quantizes_inputs and self.scheme == "int8":
            count = count + padded_row_flops(size(y) // self.features, n_in, self.features)
        if len(inputs) == 3:  # zero * the kernel's column sums, the subtract
            count = count + 2 * size(y)
        if self.separate:  # the Dequantize node rescales (and its bias is passed on)
            return count + (self.features if self.use_bias and np.dtype(param_dtype) != _F32
                            else 0)
        count = count + self._dequantize_flops(n_in * self.features, size(y))
        if self.use_bias:
            count = count + size(y) + (self.features if np.dtype(param_dtype) != y.dtype else 0)
        return count + activation_flops(self.activation, y)


@register("quantized_conv")
@dataclasses.dataclass(frozen=True)
class QuantizedConv(_Scheme, Conv):
    """A ``Conv`` whose ``kernel`` is stored as ``scheme`` says, with its
    ``kernel_scale``: one per output channel ``(features,)`` (int4: the kernel's shape
    with its input-channel axis divided by ``group_size``; the kernel packed two values
    a byte along that axis). Logical axes (for sharding): as ``Conv``'s;
    ``kernel_scale`` the kernel's first (int4: the kernel's, the input axis None).
    With ``int8`` it reads ``(q, scale)`` from a ``Quantize`` node with one scale per
    example, convolves int8 x int8 -> int32 and scales back; the convolution is one
    int8 dot over the input's patches (``ops/patches.py``: the same sums, run by the
    int8 matrix product of XLA's CPU backend, which runs an int8 convolution on int32
    operands). ``float8`` is for Linear layers only. The kernel size must be given per
    spatial dim.
    """

    scheme: str = "int8"
    group_size: int | None = None
    dequantize: bool = True

    def validate(self):
        super().validate()
        self._check_scheme()
        self._check_separate()
        if isinstance(self.kernel_size, int):
            self.invalid("a quantized Conv needs its kernel size per spatial dim")
        if self.scheme == "float8":
            self.invalid("float8 quantizes Linear layers (as Keras's float8), not Conv")

    def _in_axis(self) -> int:
        return -1 if self.channels_last else 1

    def _checked(self, inputs):
        """``(x, channels)`` as ``Conv._check`` gives them, ``x`` the values read."""
        if not self.quantizes_inputs:
            x, channels = Conv._check(self, inputs)
        else:
            q, _ = self._quantized_inputs(inputs)
            x, channels = Conv._check(self, [q.with_dtype(_F32)])
            x = q
        if self.scheme == "int4_weight_only":
            self._groups(channels // self.groups)
        return x, channels

    def infer(self, inputs):
        x, _ = self._checked(inputs)
        (y,) = super().infer([x.with_dtype(_F32)])
        if self.separate:
            return self._separate_outputs(y, self.features, self.use_bias)
        return (y.with_dtype(inputs[1].dtype if self.quantizes_inputs else x.dtype),)

    def output_axes(self, input_axes, inputs, outputs):
        (axes,) = super().output_axes(input_axes, inputs, outputs)
        return self._separate_axes(axes, self._channel_axis() % len(axes), len(outputs))

    def param_specs(self, inputs):
        x, _ = self._checked(inputs)
        specs = dict(super().param_specs([x.with_dtype(_F32)]))
        kernel = specs["kernel"]
        shape = tuple(kernel.shape)
        axes = self._kernel_override("kernel") or kernel.axes or ()
        if self.scheme == "int4_weight_only":
            axis = self._in_axis() % len(shape)
            packed = shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:]
            scale = shape[:axis] + (self._groups(shape[axis]),) + shape[axis + 1:]
            scale_axes = tuple(None if i == axis else a for i, a in enumerate(axes)) or None
            specs["kernel"] = ParamSpec(packed, initializers.zeros, axes, dtype=self.value_dtype)
            specs["kernel_scale"] = ParamSpec(scale, initializers.ones, scale_axes, dtype=_F32)
        else:
            specs["kernel"] = ParamSpec(shape, initializers.zeros, axes, dtype=self.value_dtype)
            specs["kernel_scale"] = ParamSpec((self.features,), initializers.ones, axes[:1],
                                              dtype=_F32)
        return specs

    def _channels(self, v, n: int):
        """A per-channel vector shaped to broadcast against the output."""
        return v if self.channels_last else v.reshape((-1,) + (1,) * n)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        n = len(self.kernel_size)
        if self.channels_last:
            dims = (self.data_format, "O" + self.data_format[1:-1] + "I", self.data_format)
        else:
            dims = (self.data_format, "OI" + self.data_format[2:], self.data_format)
        kernel, scale = params["kernel"], params["kernel_scale"]

        def conv(x, w, **kwargs):
            return lax.conv_general_dilated(
                x, w, window_strides=self.strides, padding=self.padding,
                rhs_dilation=self.dilation, dimension_numbers=dims,
                feature_group_count=self.groups, **kwargs)

        if self.quantizes_inputs:
            q, s = inputs
            # one s8 x s8 -> s32 dot over the patches: XLA CPU runs an s8 convolution
            # on s32 operands, many times slower (ops/patches.py)
            acc = patch_conv(q, kernel, strides=self.strides, padding=self.padding,
                             dilation=self.dilation, groups=self.groups,
                             channels_last=self.channels_last, preferred_element_type=jnp.int32)
            if self.separate:
                passed = (params["bias"].astype(jnp.float32),) if self.use_bias else ()
                return (acc, scale) + passed, state
            y = acc.astype(jnp.float32) * s.astype(jnp.float32) * self._channels(scale, n)
            out_dtype = s.dtype
        else:
            (x,) = inputs
            out_dtype = x.dtype
            if self.scheme == "int4_weight_only":
                axis = self._in_axis()
                w = dequantize_groups(unpack_int4(kernel, axis), scale, axis, x.dtype)
                y = conv(x, w, precision=self.precision,
                         preferred_element_type=self.preferred_element_type)
            else:
                y = conv(x, kernel.astype(x.dtype), precision=self.precision,
                         preferred_element_type=self.preferred_element_type)
                y = y * self._channels(scale.astype(y.dtype), n)
        if self.use_bias:
            y = y + self._channels(params["bias"].astype(y.dtype), n)
        return (apply_activation(self.activation, y.astype(out_dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The convolution's count: as ``Conv``'s (its taps on the input) for a
        weight-only scheme, every tap (those on the padding too) for int8's dot over
        patches; the dequantization, the bias add, the activation."""
        x, _ = self._checked(inputs)
        kernel = self.features * (x.shape[self._channel_axis()] // self.groups)
        for k in self.kernel_size:
            kernel *= k
        if self.quantizes_inputs:  # the patches' dot: every tap of every output
            count = 2 * size(outputs[0]) * (kernel // self.features)
            if self.use_bias and not self.separate:
                count = count + size(outputs[0])
            if not self.separate:
                count = count + activation_flops(self.activation, outputs[0])
        else:
            plain = Conv(self.features, self.kernel_size, strides=self.strides,
                         padding=self.padding, dilation=self.dilation, groups=self.groups,
                         use_bias=self.use_bias, data_format=self.data_format,
                         activation=self.activation)
            count = plain.flops([x.with_dtype(_F32)], outputs[:1], param_dtype=_F32,
                                inference_mode=inference_mode)
        if self.separate:  # the Dequantize node rescales (and its bias is passed on)
            return count + (self.features if self.use_bias and np.dtype(param_dtype) != _F32
                            else 0)
        count = count + self._dequantize_flops(kernel, size(outputs[0]))
        if self.use_bias and np.dtype(param_dtype) != outputs[0].dtype:
            count = count + self.features
        return count
