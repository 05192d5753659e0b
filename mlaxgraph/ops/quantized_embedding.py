"""A quantized Embedding: its table stored as a scheme says (``quantized.py`` has the
Linear and Conv), looked up dequantized, or multiplied int8 x int8 as a tied head."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec
from . import initializers
from .embedding import Embedding
from .flops import size
from .quantize import dequantize_groups, int8_product, padded_row_flops, unpack_int4
from .quantized import _F32, _Scheme

__all__ = ["QuantizedEmbedding"]


@register("quantized_embedding")
@dataclasses.dataclass(frozen=True)
class QuantizedEmbedding(_Scheme, Embedding):
    """An ``Embedding`` whose table is stored as ``scheme`` says: ``embedding``
    ``(num_embeddings, features)`` int8 (int4: ``(num_embeddings, features / 2)``
    uint8) and ``embedding_scale`` ``(num_embeddings,)`` float32, one per row (int4:
    ``(num_embeddings, features / group_size)``). Logical axes (for sharding): as
    ``Embedding``'s; ``embedding_scale`` ``("vocab",)`` (int4: ``("vocab", None)``).
    A lookup returns the rows dequantized to ``dtype`` (an id out of range: NaN).
    ``attend`` (the tied head) with ``int8`` reads ``(q, scale)`` from a ``Quantize``
    node and multiplies int8 x int8 -> int32, the row scales being the output
    channels' scales; weight-only schemes multiply by the dequantized table. float8
    does not apply to embeddings.
    """

    scheme: str = "int8"
    group_size: int | None = None
    dequantize: bool = True

    def validate(self):
        super().validate()
        self._check_scheme()
        self._check_separate()
        if self.scheme == "float8":
            self.invalid("float8 quantizes Linear layers (as Keras's float8), not Embedding")
        if self.scheme == "int4_weight_only":
            self._groups(self.features)

    def _attends(self, inputs) -> bool:
        return len(inputs) == 2 or super()._attends(inputs)

    def infer(self, inputs):
        if len(inputs) == 2:
            q, s = self._quantized_inputs(inputs)
            if q.shape[-1:] != (self.features,):
                raise ShapeError(f"attend() takes (..., {self.features}) features",
                                 expected=f"{q.dtype}[...,{self.features}]")
            y = s.with_shape(q.shape[:-1] + (self.num_embeddings,))
            if self.separate:
                return self._separate_outputs(y, self.num_embeddings, False)
            return (y,)
        return super().infer(inputs)

    def output_axes(self, input_axes, inputs, outputs):
        (axes,) = super().output_axes(input_axes, inputs, outputs)
        return self._separate_axes(axes, -1, len(outputs))

    def param_specs(self, inputs):
        v, d = self.num_embeddings, self.features
        axes = self._kernel_override("embedding") or ("vocab", "embed")  # the rows' scales follow
        if self.scheme == "int4_weight_only":
            table, scale, scale_axes = (v, d // 2), (v, self._groups(d)), (axes[0], None)
        else:
            table, scale, scale_axes = (v, d), (v,), (axes[0],)
        return {"embedding": ParamSpec(table, initializers.zeros, ("vocab", "embed"),
                                       dtype=self.value_dtype),
                "embedding_scale": ParamSpec(scale, initializers.ones, scale_axes, dtype=_F32)}

    def _table(self, params, dtype):
        table, scale = params["embedding"], params["embedding_scale"]
        if self.scheme == "int4_weight_only":
            return dequantize_groups(unpack_int4(table, 1), scale, 1, dtype)
        return table.astype(dtype) * scale.astype(dtype)[:, None]

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if len(inputs) == 2:
            q, s = inputs
            acc = int8_product(q, params["embedding"], axis=1)
            if self.separate:
                return (acc, params["embedding_scale"]), state
            y = acc.astype(jnp.float32) * s.astype(jnp.float32) * params["embedding_scale"]
            return (y.astype(s.dtype),), state
        (ids,) = inputs
        if self._attends(inputs):
            return (jnp.einsum("...d,vd->...v", ids, self._table(params, ids.dtype)),), state
        ids = jnp.where(ids < 0, self.num_embeddings, ids)
        if self.scheme == "int4_weight_only":
            table = params["embedding"]
            rows = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
            scale = jnp.take(params["embedding_scale"], ids, axis=0, mode="fill",
                             fill_value=np.nan)
            out = dequantize_groups(unpack_int4(rows, -1), scale, -1, self.dtype)
            return (out,), state
        rows = jnp.take(params["embedding"], ids, axis=0, mode="fill", fill_value=0)
        scale = jnp.take(params["embedding_scale"], ids, axis=0, mode="fill", fill_value=np.nan)
        return (rows.astype(self.dtype) * scale.astype(self.dtype)[..., None],), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """A lookup: as ``Embedding``'s for the rows and their scales, and the
        dequantization of each looked-up value; ``attend``: the product, the table's
        dequantization (weight-only) or the accumulator's scaling (int8)."""
        y = outputs[0]
        table = self.num_embeddings * self.features
        if self._attends(inputs):
            count = 2 * size(y) * self.features
            if len(inputs) == 2:
                padded = padded_row_flops(size(y) // self.num_embeddings, self.features,
                                          self.num_embeddings)
                return count + padded + (0 if self.separate else 3 * size(y))
            if self.scheme == "int8_weight_only":
                return count + 2 * table  # the table's convert and multiply
            return count + self._dequantize_flops(table, 0)
        ids = size(inputs[0])
        if self.scheme == "int4_weight_only":
            # per id the redirect and bounds checks of two takes; the fill's select per
            # byte and per scale; unpacking and dequantizing the rows
            return 14 * ids + size(y) // 2 + size(y) // (self.group_size or 1) \
                + self._dequantize_flops(size(y), 0)
        # per id the redirect and bounds checks of the rows' and the scales' takes; per
        # value the fill's select, the convert and the multiply by the row's scale
        return 15 * ids + 3 * size(y)

