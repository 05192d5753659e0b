"""Embedding: integer ids to vectors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core.axes import weight_axes
from ..core.errors import DTypeError, GraphError, ShapeError, capture_source, node_message
from ..core.registry import register
from .base import Initializer, Layer, ParamSpec, expect_count, field, to_dtype, to_param_axes
from .flops import size

__all__ = ["Embedding"]


def normal(key, shape, dtype):
    """Standard normal, as PyTorch's ``nn.Embedding``."""
    return jax.random.normal(key, shape, dtype)


@register("embedding")
@dataclasses.dataclass(frozen=True)
class Embedding(Layer):
    """Looks up rows of ``embedding (num_embeddings, features)`` for integer ids of any
    shape: ``(...)`` -> ``(..., features)``.

    Its input has no float dtype to follow, so it returns ``dtype`` (float32 by
    default; a policy casts it for the next layer). Ids outside ``[0,
    num_embeddings)`` give NaN rows rather than another row's values. Default
    initializer: standard normal (as PyTorch). Logical axes (for sharding):
    ``embedding`` ``("vocab", "embed")`` (``param_axes`` overrides them); the output's
    last dim takes the table's last name.

    ``embedding.attend(h)`` is ``h @ embedding.T`` with the same weights (a tied output
    head, as Flax's ``Embed.attend``): ``(..., features) -> (..., num_embeddings)`` in
    ``h``'s dtype. It is another call of the same layer (a node reading float input),
    so the embedding must have been called on ids first.
    """

    num_embeddings: int
    features: int
    dtype: np.dtype = field(default="float32", converter=to_dtype)
    embedding_init: Initializer | None = None
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    def validate(self):
        for name in ("num_embeddings", "features"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                self.invalid(f"{name} must be a positive int, got {value!r}")
        if not jnp.issubdtype(self.dtype, jnp.floating):
            self.invalid(f"dtype must be a float dtype, got {self.dtype}", DTypeError)

    def call_inputs(self, *args, attend: bool = False, **kwargs):
        inputs = super().call_inputs(*args, **kwargs)
        if not attend and len(inputs) == 1 and jnp.issubdtype(inputs[0].dtype, jnp.floating):
            raise DTypeError(f"takes integer ids, got {inputs[0].dtype}; for the tied output "
                             f"head h @ embedding.T call embedding.attend(h)")
        return inputs

    def attend(self, h):
        """``h @ embedding.T``: logits over the vocabulary with this layer's weights."""
        if self.__dict__.get("_first_call") is None:
            raise GraphError(node_message(
                self.name or self.default_name, self.op_name,
                "attend() shares the embedding's weights, but the embedding was never called; "
                "call it on the ids first (h = embedding(ids)), then embedding.attend(h)",
                source=capture_source()))
        return self(h, attend=True)

    def _attends(self, inputs) -> bool:
        return bool(inputs) and jnp.issubdtype(inputs[0].dtype, jnp.floating)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (ids,) = inputs
        if self._attends(inputs):
            if ids.shape[-1:] != (self.features,):
                raise ShapeError(f"attend() takes (..., {self.features}) features, got "
                                 f"{ids.shape[-1] if ids.rank else 'a scalar'}",
                                 expected=f"{ids.dtype}[...,{self.features}]")
            return (ids.with_shape(ids.shape[:-1] + (self.num_embeddings,)),)
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise DTypeError(f"takes integer ids, got {ids.dtype}",
                             expected=f"int32{list(ids.shape)}".replace(" ", ""))
        return (ids.with_shape(ids.shape + (self.features,)).with_dtype(self.dtype),)

    def param_specs(self, inputs):
        return {"embedding": ParamSpec((self.num_embeddings, self.features),
                                       self.embedding_init or normal, ("vocab", "embed"))}

    def output_axes(self, input_axes, inputs, outputs):
        table = weight_axes(self, inputs)[0]["embedding"][1]
        if self._attends(inputs):
            return (tuple(input_axes[0][:-1]) + table[:1],)
        return (tuple(input_axes[0]) + table[-1:],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (ids,) = inputs
        if self._attends(inputs):
            table = params["embedding"].astype(ids.dtype)
            return (jnp.einsum("...d,vd->...v", ids, table),), state
        table = params["embedding"].astype(self.dtype)
        # take() would wrap negative ids to rows from the end: send them out of range too.
        ids = jnp.where(ids < 0, self.num_embeddings, ids)
        return (jnp.take(table, ids, axis=0, mode="fill", fill_value=np.nan),), state

    def runtime_checks(self, inputs):
        (ids,) = inputs
        return ((jnp.all((ids >= 0) & (ids < self.num_embeddings)),
                 f"an id is out of range: ids must be in [0, {self.num_embeddings})"),)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The lookup moves data; per id, redirecting negative ids (compare, select)
        and the bounds check of the fill mode (six ops); per output element, the select
        of the fill value; the converts of the table when its dtype is not ``dtype``.
        ``attend``: ``2 * features`` per logit and the converts of the table."""
        if self._attends(inputs):
            count = 2 * size(outputs[0]) * self.features
            if np.dtype(param_dtype) != inputs[0].dtype:
                count = count + self.num_embeddings * self.features
            return count
        count = 8 * size(inputs[0]) + size(outputs[0])
        if np.dtype(param_dtype) != self.dtype:
            count = count + self.num_embeddings * self.features
        return count
