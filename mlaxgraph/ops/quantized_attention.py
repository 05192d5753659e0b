"""Quantized attention: a ``MultiHeadAttention`` whose four projection kernels are
stored as a scheme says, dequantized inside the layer (``float_weights``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.registry import register
from ..core.specs import ParamSpec
from . import initializers
from .attention import MultiHeadAttention
from .quantize import dequantize_groups, quantize_weight, unpack_int4
from .quantized import _F32, _Scheme

__all__ = ["QuantizedMultiHeadAttention", "PROJECTIONS"]

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
    Biases stay float. The kernels are dequantized to the input's dtype inside the
    layer: for attention every scheme is weight-only (its input is read by three
    projections and its scores are not quantized). Logical axes (for sharding):
    kernels ``("embed", None)`` (``out``: ``(None, "embed")``), their scales the
    kernel's last (int4: ``(None, <last>)``); biases as ``MultiHeadAttention``'s.
    """

    scheme: str = "int8_weight_only"
    group_size: int | None = None

    def validate(self):
        super().validate()
        self._check_scheme()

    @property
    def quantizes_inputs(self) -> bool:
        return False

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

    def float_weights(self, params, dtype):
        out: dict[str, Any] = {}
        for name, group in params.items():
            kernel, scale = group["kernel"], group["kernel_scale"]
            if self.scheme == "int4_weight_only":
                w = dequantize_groups(unpack_int4(kernel, 0), scale, 0, dtype)
            else:
                w = kernel.astype(dtype) * scale.astype(dtype)
            out[name] = {"kernel": w.reshape(self._float_shape(name, w.shape))}
            if "bias" in group:
                out[name]["bias"] = group["bias"].astype(dtype)
        return out

    def _float_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        heads = self.num_heads if name in ("query", "out") else self.kv_heads
        if name == "out":
            return (heads, shape[0] // heads, shape[1])
        return (shape[0], heads, shape[1] // heads)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``MultiHeadAttention``'s, and the dequantization of the four kernels."""
        count = super().flops(inputs, outputs, param_dtype=param_dtype,
                              inference_mode=inference_mode)
        weights = sum(int(np.prod(spec["kernel"].shape)) for name, spec in
                      self.param_specs(inputs).items())
        per_value = 5 if self.scheme == "int4_weight_only" else 2
        return count + per_value * weights * (2 if self.scheme == "int4_weight_only" else 1)

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
