"""Quantized attention: a ``MultiHeadAttention`` whose four projection kernels are
stored as a scheme says: with ``int8`` each projection is an int8 x int8 -> int32 dot
of its input quantized per token; the weight-only schemes and float8 dequantize the
kernels inside the layer (``float_weights``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.registry import register
from ..core.specs import ParamSpec
from . import initializers
from .attention import _OUT, MultiHeadAttention
from .flops import size
from .quantize import (
    INT8_MAX,
    absmax_scale,
    dequantized_dot,
    int8_product,
    padded_row_flops,
    quantize_to,
    quantize_weight,
)
from .quantized import _F32, _Scheme

__all__ = ["QuantizedMultiHeadAttention", "PROJECTIONS", "matrix_param_axes"]

#: The projections whose kernels are quantized.
PROJECTIONS = ("query", "key", "value", "out")


@register("quantized_multi_head_attention")
@dataclasses.dataclass(frozen=True)
class QuantizedMultiHeadAttention(_Scheme, MultiHeadAttention):
    """A ``MultiHeadAttention`` whose projection kernels are stored as ``scheme``
    says, each as a matrix ``(inputs, outputs)``: ``query``/``key``/``value``
    ``kernel`` ``(d, heads * head_dim)`` and ``out`` ``kernel`` ``(heads * head_dim,
    out)``, int8 or float8 (int4: the inputs halved, uint8, two values a byte), with
    ``kernel_scale`` one per output column (int4: ``(inputs / group_size, outputs)``).
    Biases stay float. With ``int8`` each projection quantizes its input to int8 per
    token (``absmax / 127`` over the features, computed at each call: the query, key
    and value projections of one input share it, the output projection quantizes the
    heads' concatenated values), multiplies int8 x int8 -> int32 and scales the
    accumulator back by the token's scale times the column's ``kernel_scale``; the
    scores and the softmax stay float. The other schemes dequantize the kernels to the
    input's dtype inside the layer (weight-only; float8's kernels too). Logical axes
    (for sharding):
    kernels ``("embed", None)`` (``out``: ``(None, "embed")``), their scales the
    kernel's last (int4: ``(None, <last>)``); biases as ``MultiHeadAttention``'s.
    ``param_axes`` name the matrices' two dims (``mg.quantize`` converts a float
    layer's three-name kernel overrides: ``matrix_param_axes``).
    """

    scheme: str = "int8_weight_only"
    group_size: int | None = None

    def validate(self):
        super().validate()
        self._check_scheme()

    @property
    def quantizes_inputs(self) -> bool:
        return False

    @property
    def casts_activations(self) -> bool:
        """Whether it casts its projections' inputs to int8 itself (``"int8"``), so
        that no usable gradient reaches its input (``mg.train`` reads it)."""
        return self.scheme == "int8"

    def param_specs(self, inputs):
        specs = {name: dict(group) for name, group in super().param_specs(inputs).items()}
        for name in PROJECTIONS:
            shape = specs[name]["kernel"].shape
            n_in, n_out = (shape[0], shape[1] * shape[2]) if name != "out" else \
                (shape[0] * shape[1], shape[2])
            axes = ("embed", None) if name != "out" else (None, "embed")
            if self.scheme == "int4_weight_only":
                kernel, scale = (n_in // 2, n_out), (self._groups(n_in), n_out)
                scale_axes: tuple = (None, axes[1])
            else:
                kernel, scale, scale_axes = (n_in, n_out), (n_out,), axes[1:]
            specs[name]["kernel"] = ParamSpec(kernel, initializers.zeros, axes,
                                              dtype=self.value_dtype)
            specs[name]["kernel_scale"] = ParamSpec(scale, initializers.ones, scale_axes,
                                                    dtype=_F32)
        return specs

    @property
    def _int8_dots(self) -> bool:
        return self.scheme == "int8"

    def _project(self, spec, x, w):
        if spec == _OUT:  # the heads' values, concatenated
            x = x.reshape(x.shape[:2] + (-1,))
        if self._int8_dots:
            y = _int8_dot(x, w["kernel"], w["kernel_scale"])
        else:  # dequantized inside the product, so the backward keeps the stored kernel
            y = dequantized_dot(x, w["kernel"], w["kernel_scale"], self.scheme, False, None,
                                None)
        return y if spec == _OUT else y.reshape(y.shape[:-1] + w["heads"])

    def float_weights(self, params, dtype):
        """The stored kernels and their scales, which ``_project`` multiplies (as int8
        with ``int8``; dequantized to ``dtype`` with the others), and the biases in
        ``dtype``."""
        out: dict[str, Any] = {}
        for name, group in params.items():
            n = group["kernel"].shape[1]
            heads = self.num_heads if name in ("query", "out") else self.kv_heads
            out[name] = {"kernel": group["kernel"], "kernel_scale": group["kernel_scale"],
                         "heads": (heads, n // heads)}
            if "bias" in group:
                out[name]["bias"] = group["bias"].astype(dtype)
        return out

    def _float_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        heads = self.num_heads if name in ("query", "out") else self.kv_heads
        if name == "out":
            return (heads, shape[0] // heads, shape[1])
        return (shape[0], heads, shape[1] // heads)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``MultiHeadAttention``'s, and the dequantization of the four kernels
        (``int8``: per projection the input's quantization, 7 per value, 2 per token
        and the clip's two bounds, as XLA counts them, and the accumulator's convert
        and two multiplies)."""
        count = super().flops(inputs, outputs, param_dtype=param_dtype,
                              inference_mode=inference_mode)
        if self._int8_dots:
            specs = self.param_specs(inputs)
            q_in, kv_in = inputs[0], inputs[1]
            tokens_q = size(q_in) // q_in.shape[-1]
            tokens_kv = size(kv_in) // kv_in.shape[-1]
            columns = {name: spec["kernel"].shape[1] for name, spec in specs.items()}
            width = specs["out"]["kernel"].shape[0]
            quantize = (7 * size(q_in) + 2 * tokens_q + 2 * (7 * size(kv_in) + 2 * tokens_kv)
                        + 7 * tokens_q * width + 2 * tokens_q + 4 * 2)
            scale = 3 * (tokens_q * (columns["query"] + columns["out"])
                         + tokens_kv * (columns["key"] + columns["value"]))
            padded = (padded_row_flops(tokens_q, q_in.shape[-1], columns["query"])
                      + padded_row_flops(tokens_q, width, columns["out"])
                      + padded_row_flops(tokens_kv, kv_in.shape[-1], columns["key"])
                      + padded_row_flops(tokens_kv, kv_in.shape[-1], columns["value"]))
            return count + quantize + scale + padded
        weights = sum(int(np.prod(spec["kernel"].shape)) for name, spec in
                      self.param_specs(inputs).items())
        if self.scheme == "int4_weight_only":  # per byte as QuantizedLinear's: 5 to unpack,
            return count + 9 * weights        # and per value a convert and a multiply
        return count + 2 * weights

    def quantized_params(self, params: dict) -> dict:
        """The stored weights from the float layer's params."""
        out: dict[str, Any] = {}
        for name in PROJECTIONS:
            group = dict(params[name])
            w = jnp.asarray(group["kernel"])
            matrix = w.reshape((w.shape[0], -1)) if name != "out" else w.reshape((-1, w.shape[-1]))
            values, scale = quantize_weight(matrix, self.scheme, reduce=(0,), axis=0,
                                            group=self.group_size)
            group.update(kernel=values, kernel_scale=scale)
            out[name] = group
        return out


def matrix_param_axes(param_axes: Any, scheme: str) -> Any:
    """A float attention's ``param_axes`` (pairs of weight path and logical axes) for
    the quantized layer, whose kernels are matrices: a projection kernel's three names
    (``(d, heads, head_dim)``; ``out``: ``(heads, head_dim, out)``) become two, the
    merged ``heads * head_dim`` dim taking the heads' name (the head_dim's where the
    heads have none), and its ``kernel_scale`` the names of the kernel's columns (an
    override the scale has is kept). Other overrides (biases, which keep their float
    shapes) are as given."""
    if not param_axes:
        return param_axes
    given = dict(param_axes)
    out = dict(given)
    for name in PROJECTIONS:
        axes = given.get(f"{name}/kernel")
        if axes is None or len(axes) != 3:
            continue
        if name == "out":
            matrix = (axes[0] if axes[0] is not None else axes[1], axes[2])
        else:
            matrix = (axes[0], axes[1] if axes[1] is not None else axes[2])
        out[f"{name}/kernel"] = matrix
        scale = (None, matrix[1]) if scheme == "int4_weight_only" else (matrix[1],)
        out.setdefault(f"{name}/kernel_scale", scale)
    return tuple(sorted(out.items()))


def _int8_dot(x, kernel, kernel_scale):
    """``x`` (float, ``(..., in)``) quantized to int8 per token, times int8 ``kernel``
    ``(in, out)`` accumulated in int32, scaled back to ``x``'s dtype."""
    scale = absmax_scale(x, (-1,), float(INT8_MAX))
    q = quantize_to(x, scale, jnp.int8)
    acc = int8_product(q, kernel)
    return (acc.astype(jnp.float32) * scale * kernel_scale).astype(x.dtype)
