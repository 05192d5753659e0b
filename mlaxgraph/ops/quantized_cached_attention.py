"""QuantizedCachedAttention: the decoder's cached attention (``CachedAttention``) of a
quantized model, whose weights are ``QuantizedMultiHeadAttention``'s, at the same
paths: the decoder rewrite (``mg.decoder``) puts it in place of each causal attention
``mg.quantize`` made."""

from __future__ import annotations

import dataclasses

from ..core.registry import register
from .attention import _OUT, _QKV
from .cached_attention import CACHE_AXES, CachedAttention
from .quantized import _Scheme
from .quantized_attention import QuantizedMultiHeadAttention

__all__ = ["QuantizedCachedAttention"]


@register("quantized_cached_attention")
@dataclasses.dataclass(frozen=True)
class QuantizedCachedAttention(_Scheme, CachedAttention):
    """A ``CachedAttention`` whose projections are ``QuantizedMultiHeadAttention``'s
    for ``scheme`` (and int4's ``group_size``): with ``int8`` each projection quantizes
    its input per token and multiplies int8 x int8 -> int32; the other schemes
    dequantize the stored kernels inside the product. Params: ``attention()``'s, the
    stored kernels with their ``kernel_scale`` (the paths and layout of the quantized
    model); state: the cache, as ``CachedAttention``'s, in float. Logical axes (for
    sharding): the weights' as ``QuantizedMultiHeadAttention``'s, the cache's
    ``("batch", "cache_length", "heads", "kv")``.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input((2, "seq", 64))
      >>> pos = mg.Input((2, "seq"), "int32")
      >>> index, mask = mg.Input((), "int32"), mg.Input((2, 128), "bool")
      >>> ops.QuantizedCachedAttention(4, 16, 64, max_length=128, batch=2, scheme="int8")(
      ...     x, pos, index, mask)
      SymbolicTensor(f32[2,seq,64], from 'quantized_cached_attention')
    """

    scheme: str = dataclasses.field(default="int8_weight_only", kw_only=True)
    group_size: int | None = dataclasses.field(default=None, kw_only=True)

    def validate(self):
        super().validate()
        self._check_scheme()

    def attention(self) -> QuantizedMultiHeadAttention:
        """The ``QuantizedMultiHeadAttention`` whose weights this layer uses."""
        return QuantizedMultiHeadAttention(
            self.num_heads, self.head_dim, self.out_features, use_bias=self.use_bias,
            param_axes=self.param_axes, causal=True, num_kv_heads=self.num_kv_heads,
            rope=self.rope, rope_scaling=self.rope_scaling, sliding_window=self.sliding_window,
            out_bias=self.out_bias, scheme=self.scheme, group_size=self.group_size)

    def state_specs(self, inputs):
        """``CachedAttention``'s cache, its heads dim named as the key kernel's merged
        ``kv_heads * head_dim`` columns where ``param_axes`` names them (a float
        override of ``(d, kv_heads, head_dim)``, which ``mg.quantize`` makes two
        names)."""
        specs = super().state_specs(inputs)
        kernel = dict(self.param_axes or ()).get("key/kernel")
        if kernel is None or len(kernel) != 2:
            return specs
        heads = kernel[1] if kernel[1] != CACHE_AXES[3] else None
        axes = CACHE_AXES[:2] + (heads, CACHE_AXES[3])
        return {key: dataclasses.replace(spec, axes=axes) for key, spec in specs.items()}

    def _weights(self, params, dtype):
        return self.attention().float_weights(params, dtype)

    def _product(self, x, w, out: bool = False):
        return self.attention()._project(_OUT if out else _QKV, x, w)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """``CachedAttention``'s, with the four projections' quantization counted as
        ``QuantizedMultiHeadAttention`` counts it (its count less the float attention's,
        over the same tokens)."""
        count = super().flops(inputs, outputs, param_dtype=param_dtype,
                              inference_mode=inference_mode)
        x = inputs[0]
        quantized = self.attention()
        plain = CachedAttention.attention(self)  # the float attention of the same settings
        extra = (quantized.flops([x, x], outputs, param_dtype=param_dtype, inference_mode=True)
                 - plain.flops([x, x], outputs, param_dtype=param_dtype, inference_mode=True))
        return count + extra
