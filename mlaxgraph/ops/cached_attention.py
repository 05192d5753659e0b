"""CachedAttention: causal self-attention over a preallocated key/value cache, the op
the decoder rewrite (``mg.decoder``) puts in place of each causal
``MultiHeadAttention``. Its weights are ``MultiHeadAttention``'s, at the same paths;
the cache is its state."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.axes import same_dim
from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec, as_dim, is_symbolic, shape_str
from . import initializers
from .attention import MultiHeadAttention, adapters_problem, with_qkv_delta
from .base import Layer, cast_params, expect_float, field, to_param_axes
from .flops import dim_max, size, weight_converts
from .rotary import rotary_flops, rotary_tables, rotate, to_rope_base, to_rope_scaling

__all__ = ["CachedAttention", "CACHE_AXES"]

#: The logical axes of a cache (``key`` and ``value``: batch, slot, kv head, feature) by
#: default; its last two are those of the key kernel (``param_axes`` overrides
#: included, e.g. the zoo Llama's ``"kv_heads"``), so a rule sharding the key/value
#: heads shards the cache with them.
CACHE_AXES = ("batch", "cache_length", "heads", "kv")

#: A step's attention (one token) is products and sums over the cache when each
#: key/value head serves at most this many query heads (one pass over the cache each),
#: dot products otherwise: on XLA's CPU backend, at batch 8 and 256 slots, 12 layers,
#: the sums took 0.16x the dots' CPU time with 12 heads of their own, 0.53x with 4 query
#: heads per key/value head, 1.06x with 8 (benchmarks/RESULTS.md, section 12). A step
#: of one row keeps the dots: on a quiet machine the sums took 1.43x their time at batch
#: 1 (128 slots; 0.97x to 0.99x at batch 2 to 8).
MAX_GROUP_SUMMED = 4


def _batch(value, layer) -> int | str:
    if isinstance(value, str) and value:
        return value  # a symbolic dim (an exported decoder's batch)
    return _positive(value, layer)


def _float_name(value, layer) -> str | None:
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        layer.invalid(f"cache_dtype must be a float dtype such as 'bfloat16', or None (the "
                      f"input's), got {value!r}")
    return dtype.name


def _positive(value, layer) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        layer.invalid(f"must be a positive int, got {value!r}")
    return int(value)


@register("cached_attention")
@dataclasses.dataclass(frozen=True)
class CachedAttention(Layer):
    """Causal multi-head self-attention of new tokens over a key/value cache.

    Inputs: ``x (batch, seq, d)``, the tokens' ``positions (batch, seq)`` (int32, for
    the rotary embedding), the cache slot of the first token ``index ()`` (int32: the
    ``seq`` tokens are written at slots ``index .. index + seq - 1``) and
    ``cache_mask (batch, max_length)`` (bool: the slots holding a token, padding
    excluded). The token at slot ``i`` attends to the slots ``j <= i`` that the mask
    keeps: the causal mask by position (with ``sliding_window=w``, the slots ``i - w <
    j <= i``). Output ``(batch, seq, out_features)``.

    ``batch`` is the cache's rows: an int, or a symbolic dim's name (the decoder
    exported for any batch, ``mlaxgraph.decode.export``).

    State: ``key`` and ``value``, each ``(batch, max_length, kv_heads, head_dim)`` in
    ``cache_dtype`` (None: the input's dtype, the compute dtype, whatever the policy's
    ``param_dtype``),
    logical axes ``("batch", "cache_length")`` and the key kernel's head and feature
    axes (``("heads", "kv")`` unless ``param_axes`` names others); the new keys and values
    are written with ``lax.dynamic_update_slice`` in the state's dtype (the cache's),
    read back in the input's. Params as ``MultiHeadAttention`` (the same layout and
    paths), whose projections, grouped-query heads, rotary base and ``rope_scaling``,
    output bias (``out_bias``) and scaling it computes.

    ``adapters`` are ``MultiHeadAttention``'s (``mg.lora``'s adapters, unmerged): the
    outputs of the adapters of ``"query"``, ``"key"``, ``"value"`` or ``"qkv"`` come in
    after the four inputs, ``(batch, seq, width)`` each, and are added to their
    projections before the new keys and values are cached; with ``"out"``, a second
    output is the heads' values ``(batch, seq, heads * head_dim)``, which the out
    projection's adapter reads.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input((2, "seq", 64))
      >>> pos = mg.Input((2, "seq"), "int32")
      >>> index, mask = mg.Input((), "int32"), mg.Input((2, 128), "bool")
      >>> ops.CachedAttention(4, 16, 64, max_length=128, batch=2)(x, pos, index, mask)
      SymbolicTensor(f32[2,seq,64], from 'cached_attention')
    """

    num_heads: int = field(converter=_positive)
    head_dim: int = field(converter=_positive)
    out_features: int = field(converter=_positive)
    max_length: int = field(kw_only=True, converter=_positive)
    batch: int | str = field(kw_only=True, converter=_batch)
    num_kv_heads: int | None = field(default=None, kw_only=True,
                                     converter=lambda v, layer: None if v is None else _positive(v, layer))
    use_bias: bool = dataclasses.field(default=True, kw_only=True)
    rope: float | None = field(default=None, kw_only=True, converter=to_rope_base)
    rope_scaling: tuple[tuple[str, object], ...] | None = field(default=None, kw_only=True,
                                                              converter=to_rope_scaling)
    sliding_window: int | None = field(default=None, kw_only=True,
                                       converter=lambda v, layer: None if v is None else _positive(v, layer))
    out_bias: bool | None = dataclasses.field(default=None, kw_only=True)
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, kw_only=True, converter=to_param_axes)
    adapters: tuple[str, ...] = field(default=(), kw_only=True, converter=lambda v, layer: tuple(v))
    cache_dtype: str | None = field(default=None, kw_only=True, converter=lambda v, layer: _float_name(v, layer))

    def validate(self):
        problem = adapters_problem(self.adapters)  # as MultiHeadAttention's
        if problem:
            self.invalid(problem)
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            self.invalid(f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.rope is not None and self.head_dim % 2:
            self.invalid(f"rope rotates pairs of features: head_dim {self.head_dim} is odd")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def attention(self) -> MultiHeadAttention:
        """The ``MultiHeadAttention`` whose weights this layer uses."""
        return MultiHeadAttention(self.num_heads, self.head_dim, self.out_features,
                                  use_bias=self.use_bias, param_axes=self.param_axes, causal=True,
                                  num_kv_heads=self.num_kv_heads, rope=self.rope,
                                  rope_scaling=self.rope_scaling, sliding_window=self.sliding_window,
                                  out_bias=self.out_bias)

    @property
    def delta_inputs(self) -> tuple[str, ...]:
        """The projections whose adapters' outputs come in after the four inputs."""
        return tuple(p for p in self.adapters if p != "out")

    def infer(self, inputs):
        count = 4 + len(self.delta_inputs)
        if len(inputs) != count:
            adapted = f" and the adapter outputs of {', '.join(self.delta_inputs)}" if count > 4 else ""
            raise ShapeError(f"takes x, positions, index and cache_mask{adapted}, got "
                             f"{len(inputs)} inputs", expected=f"{count} tensors")
        x, positions, index, mask = inputs[:4]
        expect_float(x)
        if x.rank != 3 or is_symbolic(x.shape[-1]):
            raise ShapeError("x is (batch, seq, features) with known features",
                             expected=f"{x.dtype}[batch,seq,features]")
        if not is_symbolic(x.shape[0]) and not is_symbolic(self.batch) and x.shape[0] != self.batch:
            raise ShapeError(f"the cache holds a batch of {self.batch}, x has {x.shape[0]}",
                             expected=f"{x.dtype}[{self.batch},seq,{x.shape[-1]}]")
        want = f"int32{shape_str(x.shape[:2])}"
        if positions.dtype != np.dtype("int32") or index.dtype != np.dtype("int32"):
            raise DTypeError("positions and index are int32", expected=f"{want}, int32[]")
        if positions.shape != x.shape[:2] or index.shape != ():
            raise ShapeError("positions are (batch, seq) and index a scalar", expected=f"{want}, int32[]")
        if mask.dtype != np.dtype(bool) or mask.rank != 2 or mask.shape[1] != self.max_length:
            raise ShapeError("cache_mask is (batch, max_length) bool",
                             expected=f"bool[{x.shape[0]},{self.max_length}]")
        attention = self.attention()
        for projection, delta in zip(self.delta_inputs, inputs[4:]):
            want = x.with_shape(x.shape[:2] + (attention.delta_width(projection, self.head_dim),))
            if delta.dtype != x.dtype or delta.rank != 3 or not all(
                    same_dim(a, b) for a, b in zip(delta.shape, want.shape)):
                raise ShapeError(f"the adapter input of the {projection} projection is {delta}",
                                 expected=str(want))
        context = ((x.with_shape(x.shape[:2] + (self.num_heads * self.head_dim,)),)
                   if "out" in self.adapters else ())
        return (x.with_shape(x.shape[:2] + (self.out_features,)), *context)

    def param_specs(self, inputs):
        x = inputs[0]
        return self.attention().param_specs([x, x])

    def state_specs(self, inputs):
        shape = (as_dim(self.batch), self.max_length, self.kv_heads, self.head_dim)
        kernel = dict(self.param_axes or ()).get("key/kernel")
        axes = CACHE_AXES if kernel is None or len(kernel) != 3 else CACHE_AXES[:2] + tuple(kernel[1:])
        spec = ParamSpec(shape, initializers.zeros, axes, dtype=self._cache_dtype(inputs[0]))
        return {"key": spec, "value": spec}

    def _cache_dtype(self, x) -> np.dtype:
        """The cache's dtype: ``cache_dtype``, else the input's (the compute dtype)."""
        return jnp.dtype(self.cache_dtype) if self.cache_dtype is not None else np.dtype(x.dtype)

    def output_axes(self, input_axes, inputs, outputs):
        x = inputs[0]
        axes = self.attention().output_axes(input_axes[:1] * 2, [x, x], outputs[:1])
        context = ((tuple(input_axes[0][:2]) + (None,)),) if "out" in self.adapters else ()
        return (*axes, *context)

    def _weights(self, params, dtype):
        """The weights as ``_product`` reads them."""
        return cast_params(params, dtype)

    def _product(self, x, w, out: bool = False):
        """A projection's product, bias aside: ``x (batch, seq, d)`` to ``(batch, seq,
        heads, head_dim)``, or with ``out`` the heads' values to ``(batch, seq, out)``."""
        if out:
            return jnp.einsum("bqhk,hko->bqo", x, w["kernel"])
        return jnp.einsum("bld,dhk->blhk", x, w["kernel"])

    def apply(self, params, state, inputs, *, rng, inference_mode):
        x, positions, index, cache_mask = inputs[:4]
        deltas = dict(zip(self.delta_inputs, inputs[4:]))
        p = self._weights(params, x.dtype)

        def project(name):
            y = self._product(x, p[name])
            y = y + p[name]["bias"] if self.use_bias else y
            return y + deltas[name].reshape(y.shape) if name in deltas else y

        q, k, v = project("query"), project("key"), project("value")
        if "qkv" in deltas:  # one adapter for the three
            q, k, v = with_qkv_delta(q, k, v, deltas["qkv"])
        if self.rope is not None:
            cos, sin = rotary_tables(positions, self.head_dim, self.rope, x.dtype, self.rope_scaling)
            q = rotate(q, cos[:, :, None], sin[:, :, None])
            k = rotate(k, cos[:, :, None], sin[:, :, None])
        at = (0, index, 0, 0)
        keys = lax.dynamic_update_slice(state["key"], k.astype(state["key"].dtype), at)
        values = lax.dynamic_update_slice(state["value"], v.astype(state["value"].dtype), at)
        q = q * jnp.asarray(1.0 / math.sqrt(self.head_dim), q.dtype)
        softmax_dtype = q.dtype if jnp.finfo(q.dtype).bits > 32 else jnp.float32
        slots = jnp.arange(self.max_length, dtype=jnp.int32)
        at = index + jnp.arange(q.shape[1], dtype=jnp.int32)[:, None]  # each token's slot
        causal = slots[None, :] <= at
        if self.sliding_window is not None:  # slots are positions apart (padding is on the left)
            causal = causal & (at - slots[None, :] < self.sliding_window)
        allowed = jnp.logical_and(cache_mask[:, None, :], causal[None])  # (batch, seq, slots)
        batch, seq = q.shape[:2]
        if is_symbolic(batch) and not is_symbolic(seq):
            batch = 2  # an exported step of any batch sums, as for several rows
        summed = not is_symbolic(seq) and bool(self._summed_step(batch, seq))
        attend = self._attend_one if summed else self._attend_many
        attended = attend(q, keys.astype(x.dtype), values.astype(x.dtype), allowed, softmax_dtype)
        out = self._product(attended, p["out"], out=True)
        if self.attention().has_out_bias:
            out = out + p["out"]["bias"]
        context = (attended.reshape(attended.shape[:2] + (-1,)),) if "out" in self.adapters else ()
        return (out, *context), {"key": keys, "value": values}

    def _summed_step(self, batch, seq):
        """1 where the attention is products and sums over the cache (a step: one
        token, more than one row, at most ``MAX_GROUP_SUMMED`` query heads per key/value
        head), else 0 (dot products); symbolic in a symbolic ``batch`` or ``seq``."""
        if self.num_heads // self.kv_heads > MAX_GROUP_SUMMED:
            return 0
        return dim_max(0, 2 - seq) * (1 - dim_max(0, 2 - batch))

    def _attend_many(self, q, keys, values, allowed, softmax_dtype):
        """Attention of ``seq`` tokens (a prefill): dot products over the whole cache,
        heads grouped by key/value head as ``MultiHeadAttention``'s."""
        batch, seq = q.shape[:2]
        group = self.num_heads // self.kv_heads
        grouped = q.reshape((batch, seq, self.kv_heads, group, self.head_dim))
        scores = jnp.einsum("bqngk,bsnk->bngqs", grouped, keys)
        scores = scores.reshape((batch, self.num_heads, seq, self.max_length)).astype(softmax_dtype)
        scores = jnp.where(allowed[:, None], scores, jnp.finfo(softmax_dtype).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        weights = weights.reshape((batch, self.kv_heads, group, seq, self.max_length))
        attended = jnp.einsum("bngqs,bsnk->bqngk", weights, values)
        return attended.reshape((batch, seq, self.num_heads, self.head_dim))

    def _attend_one(self, q, keys, values, allowed, softmax_dtype):
        """Attention of one token (a decoding step) as products and sums over the cache
        in its own layout, ``(batch, slots, kv_heads, head_dim)``: ``scores = sum_k q *
        key`` and ``out = sum_s p * value`` each read the cache once (per query head of
        a key/value head), where dot products over it have XLA's CPU backend transpose
        each layer's cache at every step. Sums accumulate in the softmax's dtype."""
        batch = q.shape[0]
        group = self.num_heads // self.kv_heads
        grouped = q.reshape((batch, self.kv_heads, group, self.head_dim))
        allowed = allowed[:, 0, :, None]  # (batch, slots, 1)
        low = jnp.finfo(softmax_dtype).min
        heads = []
        for g in range(group):  # a broadcast group axis runs several times slower on CPU
            scores = jnp.sum(grouped[:, None, :, g] * keys, axis=-1, dtype=softmax_dtype)  # b s n
            weights = jax.nn.softmax(jnp.where(allowed, scores, low), axis=1).astype(q.dtype)
            attended = jnp.sum(weights[..., None] * values, axis=1, dtype=softmax_dtype)  # b n k
            heads.append(attended.astype(q.dtype))
        attended = jnp.stack(heads, axis=2)  # (batch, kv_heads, group, head_dim)
        return attended.reshape((batch, 1, self.num_heads, self.head_dim))

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The projections, the rotary embedding (one table for q and k), the scaling of
        q, the two attention products over the whole cache (dots for a prefill; for a
        step, products and sums in the softmax's dtype unless ``MAX_GROUP_SUMMED`` is
        passed), the mask by slot (a compare per
        token and slot, an and per row, token and slot, the select), the softmax (and
        its converts in another dtype), the output projection, and the clamps of the
        cache index by the two ``dynamic_update_slice``. The cache is in its state's
        dtype (``cache_dtype``, else the input's): in another dtype than the input's, the
        new keys and values and the cache read back are converted. XLA
        folds the add of the index to the token offsets when ``seq`` is 1; the rule
        leaves it out (exact for a step, ``seq`` fewer than XLA's count for a prefill)."""
        x = inputs[0]
        y = outputs[0]
        batch, seq, d = x.shape
        length, heads = self.max_length, self.num_heads
        per_query = batch * seq * heads * self.head_dim
        per_key = batch * seq * self.kv_heads * self.head_dim
        scores = batch * heads * seq * length
        bias = 1 if self.use_bias else 0
        count = (2 * d + bias) * per_query + 2 * (2 * d + bias) * per_key + per_query
        count = count + 2 * 2 * scores * self.head_dim + 4 * scores - batch * heads * seq
        one = self._summed_step(batch, seq)  # 1 for a step summed, else 0
        # a step's products and sums: a sum of n terms is n - 1 adds
        count = count - one * batch * heads * (length + self.head_dim)
        if np.dtype(x.dtype).itemsize < 4:  # the scores widened and weights narrowed; a
            # step's products widened for the sums and its outputs narrowed instead
            count = count + 2 * scores + one * (2 * scores * self.head_dim - scores + per_query)
        count = count + scores + seq * length + batch * seq * length + 6  # mask, clamps
        if self._cache_dtype(x) != x.dtype:  # the cache converted both ways
            count = count + 2 * per_key + 2 * batch * length * self.kv_heads * self.head_dim
        if self.rope is not None:
            count = count + rotary_flops(per_query, batch * seq, self.head_dim, x.dtype, self.rope_scaling)
            count = count + 3 * per_key + per_key // 2
        if self.sliding_window is not None:
            count = count + 2 * seq * length  # the window's subtract and compare
        count = count + 2 * per_query * y.shape[-1] + int(self.attention().has_out_bias) * size(y)
        count = count + sum(size(delta) for delta in inputs[4:])  # the adapters' adds
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)

