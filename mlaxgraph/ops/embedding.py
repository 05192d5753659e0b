"""Embedding: integer ids to vectors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core.axes import weight_axes
from ..core.errors import DTypeError
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

    def infer(self, inputs):
        expect_count(inputs, 1)
        (ids,) = inputs
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise DTypeError(f"takes integer ids, got {ids.dtype}",
                             expected=f"int32{list(ids.shape)}".replace(" ", ""))
        return (ids.with_shape(ids.shape + (self.features,)).with_dtype(self.dtype),)

    def param_specs(self, inputs):
        return {"embedding": ParamSpec((self.num_embeddings, self.features),
                                       self.embedding_init or normal, ("vocab", "embed"))}

    def output_axes(self, input_axes, inputs, outputs):
        table = weight_axes(self, inputs)[0]["embedding"][1]
        return (tuple(input_axes[0]) + table[-1:],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (ids,) = inputs
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
        of the fill value; the converts of the table when its dtype is not ``dtype``."""
        count = 8 * size(inputs[0]) + size(outputs[0])
        if np.dtype(param_dtype) != self.dtype:
            count = count + self.num_embeddings * self.features
        return count
