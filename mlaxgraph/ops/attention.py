"""MultiHeadAttention. Softmax runs in float32 whatever the compute dtype."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..core.axes import same_dim, weight_axes
from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from ..ir.builder import SymbolicTensor
from . import initializers
from .base import Initializer, Layer, ParamSpec, cast_params, expect_float, field, to_param_axes
from .elementwise import NotEqual, broadcast_shapes
from .flops import size, weight_converts
from .rotary import rotary_flops, rotary_tables, rotate, to_rope_base, to_rope_scaling
from .tensor import ExpandDims

__all__ = ["MultiHeadAttention", "ADAPTABLE"]

#: The projections of ``MultiHeadAttention`` an adapter can change (``adapters``).
ADAPTABLE = ("query", "key", "value", "qkv", "out")
_QKV, _OUT = "bld,dhk->blhk", "bqhk,hko->bqo"  # the projections' products (_project)


def adapters_problem(adapters: tuple[str, ...]) -> str | None:
    """What is wrong with an attention's ``adapters``, or None."""
    if list(adapters) != [p for p in ADAPTABLE if p in adapters]:
        return (f"adapters must be distinct names among {', '.join(ADAPTABLE)}, in that "
                f"order, got {adapters!r}")
    if "qkv" in adapters and set(adapters) & {"query", "key", "value"}:
        return ("adapters: 'qkv' adapts query, key and value together; it does not go with "
                "'query', 'key' or 'value'")
    return None


def with_qkv_delta(q, k, v, delta):
    """``q``, ``k``, ``v`` (``(batch, seq, heads, head_dim)`` each) plus a fused ``qkv``
    adapter's output, ``[q | k | v]`` along its features."""
    widths = np.cumsum([q.shape[2] * q.shape[3], k.shape[2] * k.shape[3]])
    dq, dk, dv = jnp.split(delta, widths, axis=-1)
    return q + dq.reshape(q.shape), k + dk.reshape(k.shape), v + dv.reshape(v.shape)


def _head_kernel(key, shape, dtype):
    """LeCun normal over the input features of a ``(d, heads, head_dim)`` kernel."""
    return jax.nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))(key, shape, dtype)


def _out_kernel(key, shape, dtype):
    """LeCun normal over the ``heads * head_dim`` inputs of a ``(heads, head_dim, out)`` kernel."""
    return jax.nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)(key, shape, dtype)


@functools.partial(jax.checkpoint, static_argnums=(2,), prevent_cse=False)
def _flat_product(x, kernel, rows):
    """``x``'s last ``rows`` axes contracted with ``kernel``'s first ``rows``, computed as
    one 2-d matrix product (XLA compiles it faster than the dot over the kernel's own
    axes; the same numbers); the output's last axis is the kernel's others, flattened.

    Checkpointed so that what the backward pass keeps of the kernel is the kernel
    itself, its flat view made again there: under a scan over blocks a kept flat copy
    of a frozen kernel would be kept for every block (the base weights restacked;
    LoRA's step on the scanned GPT-2 small: 113 MB more, benchmarks/RESULTS.md section 7)."""
    flat = x.reshape(x.shape[: x.ndim - rows] + (-1,))
    return flat @ kernel.reshape(math.prod(kernel.shape[:rows]), -1)


@register("multi_head_attention")
@dataclasses.dataclass(frozen=True)
class MultiHeadAttention(Layer):
    """Multi-head dot-product attention: ``mha(q)`` (self), ``mha(q, kv)`` (cross) or
    ``mha(q, kv, mask=mask)``.

    Inputs are ``(batch, q_len, d)`` and ``(batch, kv_len, d_kv)``. The optional mask
    is boolean (True = attend) and broadcasts to ``(batch, heads, q_len, kv_len)``
    (``(q_len, kv_len)``, ``(batch, q_len, kv_len)`` or rank 4), or is a key-padding
    mask ``(batch, kv_len)`` as Hugging Face passes ``attention_mask``: integer (1 =
    attend, 0 = padding) or boolean. A rank-2 mask is a key-padding mask when it is
    integer, or when its first dim is the batch dim and not ``q_len``. Scores are
    scaled by ``1/sqrt(head_dim)``; the softmax runs in float32 (float64 for float64
    inputs). ``head_dim`` defaults to ``d // num_heads`` (which must divide).

    ``causal=True`` lets query ``i`` attend to keys ``j <= i`` (with the mask, if any).
    ``dropout`` drops attention weights in training (needs an rng). ``num_kv_heads``
    (dividing ``num_heads``) gives grouped-query attention: query head ``h`` reads
    key/value head ``h // (num_heads // num_kv_heads)``, as Hugging Face's
    ``repeat_kv``. ``rope=True`` (base 10000) or ``rope=base`` rotates queries and keys
    by their positions ``0 .. length - 1`` first (``ops.rotary_embedding``);
    ``rope_scaling={"rope_type": "llama3" | "linear" | "yarn", "factor": ..., ...}`` scales its
    frequencies as Hugging Face's ``rope_scaling`` does. ``sliding_window=w`` (with
    ``causal``) lets query ``i`` attend to keys ``i - w < j <= i`` only (Mistral's).

    Params: ``query``: ``kernel (d, heads, head_dim)``, ``bias (heads, head_dim)``;
    ``key``, ``value``: ``kernel (d_kv, kv_heads, head_dim)``, ``bias (kv_heads,
    head_dim)``; ``out``: ``kernel (heads, head_dim, out)``, ``bias (out,)``.
    ``out_bias`` (None: as ``use_bias``) gives ``out`` a bias or none (Qwen2's
    projections have biases, its output projection none).
    Defaults: kernels LeCun normal (fan in), biases zeros; ``out_features`` = ``d``;
    ``kernel_init`` sets every kernel's initializer, ``out_init`` the ``out`` kernel's.
    Logical axes (for sharding): projection kernels ``("embed", "heads", "kv")``,
    their biases ``("heads", "kv")``, ``out`` kernel ``("heads", "kv", "embed")`` and
    bias ``("embed",)``; ``param_axes={"query/kernel": ...}`` overrides one weight.
    The output is ``(batch, length, <out kernel's last name>)``.

    ``adapters`` (set by ``mg.lora``, not usually by hand) names projections that an
    adapter outside the op changes: for ``"query"``, ``"key"``, ``"value"`` and
    ``"qkv"`` (the three fused, ``[q | k | v]`` along the features, as GPT-2's
    ``c_attn``) the op takes one more input each, after the others and in this order:
    ``(batch, length, heads * head_dim)`` (``kv_heads`` for key and value; their sum
    for ``qkv``) added to that projection's output. With ``"out"`` the op has a second
    output, the attended values ``(batch, q_len, heads * head_dim)`` that the output
    projection reads, for an adapter whose result is added to the output.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 16, 64))
      >>> ops.MultiHeadAttention(4, 16)(x, mask=ops.causal_mask(x))
      SymbolicTensor(f32[batch,16,64], from 'multi_head_attention')
    """

    num_heads: int
    head_dim: int | None = None
    out_features: int | None = None
    use_bias: bool = True
    kernel_init: Initializer | None = None
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)
    causal: bool = False
    dropout: float = 0.0
    num_kv_heads: int | None = None
    rope: float | None = field(default=None, converter=to_rope_base)
    rope_scaling: tuple[tuple[str, object], ...] | None = field(default=None, converter=to_rope_scaling)
    sliding_window: int | None = None
    out_init: Initializer | None = None
    out_bias: bool | None = None
    adapters: tuple[str, ...] = field(default=(), converter=lambda v, layer: tuple(v))

    @property
    def has_out_bias(self) -> bool:
        """Whether ``out`` has a bias: ``out_bias``, or ``use_bias`` when it is None."""
        return self.use_bias if self.out_bias is None else bool(self.out_bias)

    def validate(self):
        if self.rope_scaling is not None and self.rope is None:
            self.invalid("rope_scaling scales the rotary embedding: give rope= too")
        if self.sliding_window is not None and not self.causal:
            self.invalid("sliding_window limits causal attention: give causal=True too")
        for name in ("num_heads", "head_dim", "out_features", "num_kv_heads", "sliding_window"):
            value = getattr(self, name)
            if value is None and name != "num_heads":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                self.invalid(f"{name} must be a positive int, got {value!r}")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            self.invalid(f"num_kv_heads={self.num_kv_heads} does not divide "
                         f"num_heads={self.num_heads}")
        if not 0.0 <= float(self.dropout) < 1.0:
            self.invalid(f"dropout must be in [0, 1), got {self.dropout!r}")
        problem = adapters_problem(self.adapters)
        if problem:
            self.invalid(problem)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def delta_inputs(self) -> tuple[str, ...]:
        """The projections whose adapters' outputs come in as extra inputs."""
        return tuple(p for p in self.adapters if p != "out")

    def _split(self, inputs):
        """The inputs as (query, key_value[, mask]) and {projection: delta}."""
        count = len(self.delta_inputs)
        if not count:
            return tuple(inputs), {}
        base = tuple(inputs[:-count])
        return base, dict(zip(self.delta_inputs, inputs[-count:]))

    def delta_width(self, projection: str, head_dim: int) -> int:
        """The features of ``projection``'s adapter output."""
        heads = {"query": self.num_heads, "key": self.kv_heads, "value": self.kv_heads,
                 "out": self.num_heads, "qkv": self.num_heads + 2 * self.kv_heads}[projection]
        return heads * head_dim

    def uses_rng(self) -> bool:
        return self.dropout > 0

    def xla_cost_caveat(self, inference_mode):
        if self.dropout > 0 and not inference_mode:
            return "XLA counts the integer ops of the random bits (threefry) of the dropout"
        return None

    def call_inputs(self, query, key_value=None, *, mask=None):
        inputs = (query, query if key_value is None else key_value)
        if mask is None:
            return inputs
        return inputs + (_key_padding(mask, query) if isinstance(mask, SymbolicTensor) else mask,)

    def _dims(self, inputs):
        inputs, _ = self._split(inputs)
        if len(inputs) not in (2, 3):
            raise ShapeError(f"takes query, key_value and an optional mask, got {len(inputs)} inputs",
                             expected="2 or 3 tensors")
        q, kv = inputs[:2]
        for spec in (q, kv):
            expect_float(spec)
            if spec.rank != 3 or is_symbolic(spec.shape[-1]):
                raise ShapeError("query and key_value are (batch, length, features) with known features",
                                 expected=f"{spec.dtype}[batch,length,features]")
        if q.dtype != kv.dtype:
            raise DTypeError("query and key_value have different dtypes; cast one with ops.cast",
                             expected=f"{q}, {kv.with_dtype(q.dtype)}")
        if not q.shape[0] == kv.shape[0]:
            raise ShapeError("query and key_value have different batch dims",
                             expected=f"{q}, {kv.with_shape((q.shape[0],) + kv.shape[1:])}")
        head_dim = self.head_dim
        if head_dim is None:
            if q.shape[-1] % self.num_heads:
                raise ShapeError(f"num_heads={self.num_heads} does not divide the {q.shape[-1]} "
                                 f"query features; give head_dim or another num_heads",
                                 expected=f"features divisible by {self.num_heads}")
            head_dim = q.shape[-1] // self.num_heads
        if self.rope is not None and head_dim % 2:
            raise ShapeError(f"rope rotates pairs of features: head_dim {head_dim} is odd",
                             expected="an even head_dim")
        return q, kv, head_dim



    def infer(self, inputs):
        q, kv, head_dim = self._dims(inputs)
        base, deltas = self._split(inputs)
        for projection, delta in deltas.items():
            source = kv if projection in ("key", "value") else q
            want = source.with_shape(source.shape[:2] + (self.delta_width(projection, head_dim),))
            if delta.dtype != q.dtype or delta.rank != 3 or not all(
                    same_dim(a, b) for a, b in zip(delta.shape, want.shape)):
                raise ShapeError(f"the adapter input of the {projection} projection is {delta}",
                                 expected=str(want))
        if "qkv" in deltas and not same_dim(q.shape[1], kv.shape[1]):
            raise ShapeError("a fused qkv adapter reads one sequence: query and key_value "
                             "have different lengths", expected="self-attention")
        y = q.with_shape(q.shape[:2] + (self.out_features or q.shape[-1],))
        context = (q.with_shape(q.shape[:2] + (self.num_heads * head_dim,)),) if "out" in self.adapters else ()
        if len(base) == 3:
            mask = base[2]
            target = (q.shape[0], self.num_heads, q.shape[1], kv.shape[1])
            if mask.dtype != np.dtype(bool):
                raise DTypeError(f"the mask must be boolean (True = attend), got {mask.dtype}",
                                 expected=f"bool{shape_str(target)}")
            # rank 3 is (batch, q_len, kv_len): apply inserts the heads axis.
            shape = mask.shape[:1] + (1,) + mask.shape[1:] if mask.rank == 3 else mask.shape
            if not 2 <= mask.rank <= 4 or broadcast_shapes(shape, target) != target:
                raise ShapeError(f"the mask {mask} does not broadcast to (batch, heads, q_len, kv_len)",
                                 expected=f"bool{shape_str(target)} or bool{shape_str(target[2:])}")
        return (y, *context)

    def param_specs(self, inputs):
        q, kv, head_dim = self._dims(inputs)
        h, out = self.num_heads, self.out_features or q.shape[-1]
        init = self.kernel_init or _head_kernel

        def projection(d, h):
            spec = {"kernel": ParamSpec((d, h, head_dim), init, ("embed", "heads", "kv"))}
            if self.use_bias:
                spec["bias"] = ParamSpec((h, head_dim), initializers.zeros, ("heads", "kv"))
            return spec

        specs = {"query": projection(q.shape[-1], h), "key": projection(kv.shape[-1], self.kv_heads),
                 "value": projection(kv.shape[-1], self.kv_heads),
                 "out": {"kernel": ParamSpec((h, head_dim, out), self.out_init or self.kernel_init or _out_kernel,
                                             ("heads", "kv", "embed"))}}
        if self.has_out_bias:
            specs["out"]["bias"] = ParamSpec((out,), initializers.zeros, ("embed",))
        return specs

    def output_axes(self, input_axes, inputs, outputs):
        out = weight_axes(self, inputs)[0]["out/kernel"][1]
        context = ((tuple(input_axes[0][:2]) + (None,)),) if "out" in self.adapters else ()
        return (tuple(input_axes[0][:2]) + out[-1:], *context)

    def float_weights(self, params, dtype):
        """The weights in ``dtype``, as ``_project`` reads them (``param_specs``'s)."""
        return cast_params(params, dtype)

    def _project(self, spec, x, w):
        """A projection's product, bias aside: a 2-d matmul over the heads' columns (XLA
        compiles it faster than an einsum over the 3-d kernel; the same numbers)."""
        kernel = w["kernel"]
        if spec == _OUT:  # (heads, head_dim, out): the heads' values, concatenated
            return _flat_product(x, kernel, 2)
        return _flat_product(x, kernel, 1).reshape(x.shape[:-1] + kernel.shape[1:])

    def apply(self, params, state, inputs, *, rng, inference_mode):
        base, deltas = self._split(inputs)
        q_in, kv_in = base[:2]
        p = self.float_weights(params, q_in.dtype)

        def project(x, w, name):
            y = self._project(_QKV, x, w)
            y = y + w["bias"] if self.use_bias else y
            return y + deltas[name].reshape(y.shape) if name in deltas else y

        q, k, v = (project(x, p[n], n) for x, n in ((q_in, "query"), (kv_in, "key"), (kv_in, "value")))
        if "qkv" in deltas:
            q, k, v = with_qkv_delta(q, k, v, deltas["qkv"])
        head_dim = q.shape[-1]
        if self.rope is not None:
            q, k = _rope(q, self.rope, self.rope_scaling), _rope(k, self.rope, self.rope_scaling)
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        group = self.num_heads // self.kv_heads  # query head n * group + g reads kv head n
        softmax_dtype = q.dtype if jnp.finfo(q.dtype).bits > 32 else jnp.float32  # >= float32
        if group == 1:  # heads first: a batched matmul over (batch, heads)
            q_heads, k_heads = jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2)
            scores = jnp.einsum("bhqk,bhsk->bhqs", q_heads, k_heads)
        else:
            grouped = q.reshape(q.shape[:2] + (self.kv_heads, group, head_dim))
            scores = jnp.einsum("bqngk,bsnk->bngqs", grouped, k)
            scores = scores.reshape((scores.shape[0], self.num_heads) + scores.shape[3:])
        scores = scores.astype(softmax_dtype)
        mask = self._mask(base, scores.shape)
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.finfo(softmax_dtype).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(q_in.dtype)
        if self.dropout > 0 and not inference_mode:
            keep = jax.random.bernoulli(rng, 1.0 - self.dropout, weights.shape)
            weights = jnp.where(keep, weights / jnp.asarray(1.0 - self.dropout, weights.dtype), 0)
        if group == 1:
            attended = jnp.swapaxes(jnp.einsum("bhqs,bhsk->bhqk", weights, jnp.swapaxes(v, 1, 2)), 1, 2)
        else:
            weights = weights.reshape((weights.shape[0], self.kv_heads, group) + weights.shape[2:])
            attended = jnp.einsum("bngqs,bsnk->bqngk", weights, v)
            attended = attended.reshape(attended.shape[:2] + (self.num_heads, head_dim))
        out = self._project(_OUT, attended, p["out"])
        out = out + p["out"]["bias"] if self.has_out_bias else out
        if "out" in self.adapters:
            return (out, attended.reshape(attended.shape[:2] + (-1,))), state
        return (out,), state

    def _mask(self, base, shape):
        """The boolean mask broadcasting to the scores ``(batch, heads, q_len, kv_len)``:
        the given one and the causal one, combined; None when there is neither. ``base``
        are the inputs without the adapters' (``_split``'s first part)."""
        mask = None
        if len(base) == 3:
            mask = base[2]
            mask = mask[None, None] if mask.ndim == 2 else mask[:, None] if mask.ndim == 3 else mask
        if self.causal:
            q_len, kv_len = shape[-2:]
            causal = jnp.arange(q_len)[:, None] >= jnp.arange(kv_len)[None, :]
            if self.sliding_window is not None:
                causal = causal & (jnp.arange(q_len)[:, None] - jnp.arange(kv_len)[None, :] < self.sliding_window)
            mask = causal if mask is None else jnp.logical_and(mask, causal)
        return mask

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The q, k, v projections (dots and bias adds), the scaling of q, the two
        attention dots, the mask's select, the softmax (and its converts when it runs in
        another dtype) and the output projection."""
        q, kv, head_dim = self._dims(inputs)
        base, deltas = self._split(inputs)
        y = outputs[0]
        batch, q_len, kv_len, heads = q.shape[0], q.shape[1], kv.shape[1], self.num_heads
        per_query = batch * q_len * heads * head_dim  # elements of q after projection
        per_key = batch * kv_len * self.kv_heads * head_dim
        scores = batch * heads * q_len * kv_len
        bias = 1 if self.use_bias else 0
        count = (2 * q.shape[-1] + bias) * per_query + 2 * (2 * kv.shape[-1] + bias) * per_key
        count = count + per_query  # q / sqrt(head_dim)
        count = count + 2 * 2 * scores * head_dim  # q k^T and weights @ v
        count = count + 4 * scores - batch * heads * q_len  # softmax over kv_len
        if np.dtype(q.dtype).itemsize < 4:
            count = count + 2 * scores  # to float32 for the softmax and back
        if len(base) == 3 or self.causal:
            count = count + scores  # the mask's select
        if len(base) == 3 and self.causal:  # the and of the two masks
            mask = base[2].shape
            mask = (1, 1) + mask if len(mask) == 2 else mask[:1] + (1,) + mask[1:] if len(mask) == 3 else mask
            count = count + size(broadcast_shapes(mask, (1, 1, q_len, kv_len)))
        if self.causal:
            count = count + q_len * kv_len  # compare of two iotas
        if self.dropout > 0 and not inference_mode:
            count = count + 3 * scores  # compare, divide, select
        if self.rope is not None:
            count = count + rotary_flops(per_query, q_len, head_dim, q.dtype, self.rope_scaling)
            count = count + rotary_flops(per_key, kv_len, head_dim, q.dtype, self.rope_scaling)
        if self.sliding_window is not None:
            count = count + 2 * q_len * kv_len  # the window's subtract and compare
        count = count + 2 * per_query * y.shape[-1] + int(self.has_out_bias) * size(y)
        count = count + sum(size(delta.shape) for delta in deltas.values())  # the adds
        return count + weight_converts(self.param_specs(inputs), param_dtype, q.dtype)


def _key_padding(mask, query):
    """A key-padding mask ``(batch, kv_len)`` (integer, or boolean with the batch dim
    first and not ``q_len``), as the ``(batch, 1, 1, kv_len)`` boolean mask it means:
    nodes recorded at the user's call. Other masks are returned as they are."""
    if mask.ndim != 2:
        return mask
    integer = jnp.issubdtype(mask.dtype, jnp.integer)
    batch_first = same_dim(mask.shape[0], query.shape[0]) and not same_dim(mask.shape[0], query.shape[1])
    if not integer and not (mask.dtype == np.dtype(bool) and batch_first):
        return mask
    attend = NotEqual(constant=0)(mask) if integer else mask
    return ExpandDims((1, 2))(attend)


def _rope(x, base: float, scaling=None):
    """Rotates ``(batch, length, heads, head_dim)`` by the positions ``0 .. length - 1``."""
    cos, sin = rotary_tables(jnp.arange(x.shape[1]), x.shape[-1], base, x.dtype, scaling)
    return rotate(x, cos[None, :, None], sin[None, :, None])
