"""``mg.decoder``: prefill and step of a causal language model over a key/value cache
the compiler derives from its graph (``mlaxgraph.decode.derive``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import CompiledModel, compile
from ..compiler.passes.fold_repeated_blocks import repeated_runs
from ..compiler.policy import Policy
from ..compiler.program import Program, ScanStep, get_in, set_in
from ..compiler.weights import refuse_unread_adapters
from ..core.donated import reraise_deleted
from ..core.errors import ConfigError, GraphError, ShapeError, ShardingError
from ..core.signatures import unknown_keywords
from ..ir.graph import Graph
from ..ops.cached_attention import CachedAttention
from ..ops.embedding import Embedding
from .derive import decode_graph
from .inputs import check_cache, prompt_arrays, prompt_room, step_ids

__all__ = ["Decoder", "Cache", "decoder", "bucket_length"]

#: The smallest prompt bucket: prompts are left-padded to 64, 128, 256, ... tokens, so
#: prompts of other lengths in one bucket reuse one compiled prefill.
MIN_BUCKET = 64


def bucket_length(length: int, limit: int) -> int:
    """The padded length of a prompt of ``length`` tokens: the smallest power of two
    times ``MIN_BUCKET`` holding it, at most ``limit`` (and at least ``length``)."""
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return max(length, min(bucket, limit))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cache:
    """The decoding state of a batch: the key/value caches (nested by layer path, as
    ``state``: ``cache.layers["h.0"]["attn"]["key"]``), the next cache slot, each
    row's next position and which slots hold a token (padding excluded).

    Attributes:
      layers: ``{"key", "value"}`` of each cached attention, ``(batch, max_length,
        kv_heads, head_dim)`` (with a leading blocks axis in a scanned run).
      index: int32 scalar: the slot the next token is written to.
      positions: int32 ``(batch,)``: each row's next position.
      mask: bool ``(batch, max_length)``: the slots holding a token.
      filled: the slots used, known on the host (not traced): ``step`` refuses to go
        past ``max_length``.
    """

    layers: dict
    index: jax.Array
    positions: jax.Array
    mask: jax.Array
    filled: int = dataclasses.field(default=0, metadata={"static": True})

    @property
    def nbytes(self) -> int:
        """The bytes of the key/value caches."""
        return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(self.layers))


def _cache_steps(program: Program, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, int | None]]:
    """``(weights path, the step, blocks)`` of every cached attention of the program;
    ``blocks`` the length of the scanned run holding it, or None."""
    found: list[tuple[tuple[str, ...], Any, int | None]] = []
    for step in program.owners():
        if isinstance(step, ScanStep):
            for path, inner, _ in _cache_steps(step.block):
                found.append((step.weights + path, inner, len(step.blocks)))
        elif isinstance(step.op, CachedAttention):
            found.append((prefix + step.weights, step, None))
    return found


class Decoder:
    """Prefill and step of a causal language model with a key/value cache, compiled
    for one ``max_length`` (made by ``mg.decoder``).

    Attributes:
      source: the model's graph.
      max_length: the cache's slots: the prompt (padded to its bucket) plus the new
        tokens must fit.
      cache_dtype: the cache's dtype, or None for each attention's compute dtype.
      compile_count: how many times a prefill, step or generate loop was traced (and
        compiled): calls of new shapes add one; calls in one bucket add none.
      mesh, rules: the device mesh and the logical-axis rules the decoding model is
        compiled with (None: one device); the caches are sharded by their logical
        axes (``"batch"``, ``"cache_length"``, the key kernel's heads and features).
    """

    def __init__(self, source: Graph, *, max_length: int, cache_dtype: Any = None,
                 policy: Policy | None = None, scan_blocks: bool | str = False, mesh: Any = None,
                 rules: Any = None):
        if not isinstance(max_length, (int, np.integer)) or isinstance(max_length, bool) or max_length < 1:
            raise GraphError(f"max_length must be a positive int, got {max_length!r}")
        self.source = source
        self.max_length = int(max_length)
        self.cache_dtype = None if cache_dtype is None else _cache_dtype(cache_dtype)
        self.policy = policy
        self.scan_blocks = scan_blocks
        self.mesh, self.rules = mesh, rules
        self.compile_count = 0
        self._models: dict[int | str, CompiledModel] = {}
        self._jitted: dict[Any, Any] = {}
        decode_graph(source, max_length=self.max_length, batch=1)  # refuse a bad graph now
        self.vocab_size = _vocab_size(source)

    # --- the derived graph and model ------------------------------------------------

    def decode_graph(self, batch: int | str = 1) -> Graph:
        """The decoding graph for ``batch`` rows, caches in ``cache_dtype`` (``decode.derive``)."""
        return decode_graph(self.source, max_length=self.max_length, batch=batch, cache_dtype=self.cache_dtype)

    def model(self, batch: int | str = 1) -> CompiledModel:
        """The compiled decoding graph for ``batch`` rows: its summary, cost table and
        explorer show the caches as state."""
        model = self._models.get(batch)
        if model is None:
            model = self._models[batch] = compile(self.decode_graph(batch), self.policy, self.mesh,
                                                  self.rules, scan_blocks=self.scan_blocks)
        return model

    def cache_bytes(self, batch: int = 1) -> int:
        """The bytes of the key/value caches for ``batch`` rows."""
        total = 0
        for _, step, blocks in _cache_steps(self.model(batch).program):
            shape = step.state_specs["key"].shape
            total += 2 * (blocks or 1) * int(np.prod(shape)) * self._dtype(step).itemsize
        return total

    def _dtype(self, step) -> np.dtype:
        return step.state_specs["key"].stored_dtype(None)  # the graph's: cache_dtype or compute

    def empty_cache(self, batch: int) -> Cache:
        """A cache of zeros for ``batch`` rows (no slot filled); on a mesh, each cache
        made sharded as its logical axes say."""
        model = self.model(batch)
        layers: dict = {}
        for path, step, blocks in _cache_steps(model.program):
            shape = ((blocks,) if blocks else ()) + tuple(step.state_specs["key"].shape)
            dtype = self._dtype(step)
            entry = {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}
            if model.sharding is not None:
                placed = get_in(model.sharding.state, path)
                entry = {k: jax.device_put(v, placed[k]) for k, v in entry.items()}
            layers = set_in(layers, path, entry)
        return Cache(layers, jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32),
                     jnp.zeros((batch, self.max_length), bool), 0)

    # --- the pure functions (for a wider jitted region) ------------------------------

    def prefill_fn(self, batch: int | str):
        """The pure ``prefill(params, state, cache, input_ids, attention_mask) -> (logits,
        cache)`` for an empty cache: the prompt written at slots ``0 .. seq - 1``."""
        model = self.model(batch)
        paths = [path for path, _, _ in _cache_steps(model.program)]

        def prefill(params, state, cache, input_ids, attention_mask):
            mask = attention_mask.astype(bool)
            positions = prompt_positions(mask)
            seq = input_ids.shape[1]
            cache_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, 0))
            logits, layers = _run(model, paths, params, state, cache.layers, input_ids, positions,
                                  jnp.zeros((), jnp.int32), cache_mask)
            new = Cache(layers, jnp.asarray(seq, jnp.int32),
                        jnp.sum(mask, axis=1, dtype=jnp.int32), cache_mask, cache.filled)
            return logits, new

        return prefill

    def chunk_fn(self, batch: int | str):
        """The pure ``chunk(params, state, layers, input_ids, positions, index,
        cache_mask) -> layers``: ``seq`` tokens of a prompt at slots ``index ..``, at the
        given positions, attending to the slots ``cache_mask`` marks (a prefill in
        pieces: ``mg.generate`` runs only the pieces holding tokens)."""
        model = self.model(batch)
        paths = [path for path, _, _ in _cache_steps(model.program)]

        def chunk(params, state, layers, input_ids, positions, index, cache_mask):
            return _run(model, paths, params, state, layers, input_ids, positions, index,
                        cache_mask)[1]

        return chunk

    def step_fn(self, batch: int | str):
        """The pure ``step(params, state, cache, token_ids (batch, seq)) -> (logits,
        cache)``: the tokens written at the cache's next slots."""
        model = self.model(batch)
        paths = [path for path, _, _ in _cache_steps(model.program)]

        def step(params, state, cache, token_ids):
            seq = token_ids.shape[1]
            new_slots = jnp.ones((token_ids.shape[0], seq), bool)
            cache_mask = jax.lax.dynamic_update_slice(cache.mask, new_slots, (0, cache.index))
            positions = cache.positions[:, None] + jnp.arange(seq, dtype=jnp.int32)[None]
            logits, layers = _run(model, paths, params, state, cache.layers, token_ids, positions,
                                  cache.index, cache_mask)
            return logits, Cache(layers, cache.index + seq, cache.positions + seq, cache_mask,
                                 cache.filled)

        return step

    def _jit(self, kind: str, batch: int):
        key = (kind, batch)
        fn = self._jitted.get(key)
        if fn is None:
            pure = self.prefill_fn(batch) if kind == "prefill" else self.step_fn(batch)

            def counted(*args):
                self.compile_count += 1  # runs when traced only
                return pure(*args)

            fn = self._jitted[key] = jax.jit(counted, donate_argnums=(2,))
        return fn

    # --- the calls ------------------------------------------------------------------

    def prefill(self, params: Any, state: Any, input_ids: Any, attention_mask: Any = None,
                *, room: int | None = None, **unknown: Any):
        """Runs the prompt: ``(logits (batch, seq, vocab), cache)``.

        The prompt is left-padded to its bucket (``bucket_length``) so that prompts of
        other lengths reuse the compiled prefill; ``attention_mask`` (1 = token, 0 =
        padding, as Hugging Face's) marks padding of its own. A right-padded row is
        aligned to the right first (its padding moved before its tokens), so the
        logits are those of the aligned rows: ``logits[:, -1]`` is every row's
        next-token logits. Positions count the tokens of each row, as Hugging Face's
        ``generate`` does. ``room``: the slots to keep free for ``step`` after the prompt
        (the bucket shrinks to leave them; more than the prompt leaves is a ShapeError); by
        default half the cache. Another keyword is a ``ConfigError`` naming the one meant."""
        if unknown:
            raise ConfigError(unknown_keywords("prefill", unknown, _PREFILL, {"mask": "attention_mask="}))
        ids, mask = self._prompt(input_ids, attention_mask)
        seq = ids.shape[1]
        room = prompt_room(room, seq, self.max_length)
        padded = bucket_length(seq, self.max_length - room)
        logits, cache = self._prefill_padded(params, state, *_left_pad(ids, mask, padded))
        return logits[:, padded - seq:], cache

    def _prefill_padded(self, params: Any, state: Any, ids: np.ndarray, mask: np.ndarray):
        """``prefill`` of a prompt already left-padded to its bucket: the logits of every
        column of the bucket, so that prompts of one bucket share what reads them."""
        batch = ids.shape[0]
        try:
            logits, cache = self._jit("prefill", batch)(params, state, self.empty_cache(batch),
                                                        ids, mask)
        except (RuntimeError, ValueError) as e:
            reraise_deleted(e, "prefill", params=params, state=state)
            raise
        return logits, dataclasses.replace(cache, filled=ids.shape[1])

    def step(self, params: Any, state: Any, cache: Cache, token_ids: Any):
        """Runs new tokens (``(batch,)`` or ``(batch, n)``) after those in ``cache``:
        ``(logits (batch, n, vocab), cache)``. The cache given is consumed (its
        buffers are reused): step again from the one returned. Token ids are checked
        on the host (integers in the vocabulary) unless traced."""
        check_cache(cache, Cache, self.max_length)
        return self._advance(params, state, cache, step_ids(token_ids, cache.mask.shape[0],
                                                            self.vocab_size))

    def _advance(self, params: Any, state: Any, cache: Cache, ids: Any):
        """``step`` of ids ``(batch, n)`` and a cache already checked (a sampler's)."""
        if cache.filled + ids.shape[1] > self.max_length:
            raise ShapeError(f"the cache is full: {cache.filled} of max_length={self.max_length} "
                             f"slots used, {ids.shape[1]} more asked; make the decoder with a "
                             f"larger max_length")
        traced = dataclasses.replace(cache, filled=0)  # static: the host's count stays out of jit
        try:
            logits, new = self._jit("step", ids.shape[0])(params, state, traced, ids)
        except (RuntimeError, ValueError) as e:
            reraise_deleted(e, "step", params=params, state=state)
            raise
        return logits, dataclasses.replace(new, filled=cache.filled + ids.shape[1])

    def _prompt(self, input_ids: Any, attention_mask: Any) -> tuple[np.ndarray, np.ndarray]:
        """The prompt's int32 ids and bool mask on the host, checked, each row's tokens
        at its end (``mlaxgraph.decode.inputs.prompt_arrays``)."""
        return prompt_arrays(input_ids, attention_mask, vocab=self.vocab_size,
                             max_length=self.max_length)


_PREFILL = "prefill(params, state, input_ids, attention_mask=None, *, room=None)"


def _cache_dtype(value: Any) -> np.dtype:
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ConfigError(f"cache_dtype must be a float dtype such as 'bfloat16', 'float16' or "
                          f"'float32' (or None: each attention's compute dtype), got {value!r}")
    return dtype


def _left_pad(ids: np.ndarray, mask: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The host's prompt padded on the left to ``length`` columns (on the host: an eager
    ``jnp.pad`` would compile once per prompt length)."""
    pad = length - ids.shape[1]
    return np.pad(ids, ((0, 0), (pad, 0))), np.pad(mask, ((0, 0), (pad, 0)))


def prompt_positions(mask: jax.Array) -> jax.Array:
    """int32 positions of a left-padded prompt's tokens from its bool mask: counted from
    each row's first token, as Hugging Face's ``generate`` does; padding gets 1 (any row
    of the position table: its keys are masked out)."""
    return jnp.where(mask, jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 1)


def _run(model: CompiledModel, paths, params, state, layers, ids, positions, index, cache_mask):
    """The decoding model's apply with the caches put into ``state``: ``(logits, the
    caches' new values)``."""
    refuse_unread_adapters(model.program, params)  # traced once per jitted function
    full = state if isinstance(state, Mapping) else {}
    for path in paths:
        full = set_in(full, path, get_in(layers, path))
    logits, new_state = model.apply_fn(params, full, ids, positions, index, cache_mask,
                                       inference_mode=True)
    if model.sharding is not None:  # the new caches where the old ones live (XLA may choose otherwise)
        _, new_state = model.sharding.constrain_weights(None, new_state)
    out: dict = {}
    for path in paths:
        entry = get_in(new_state, path)
        out = set_in(out, path, {"key": entry["key"], "value": entry["value"]})
    return logits, out


def _vocab_size(graph: Graph) -> int | None:
    """The vocabulary of the embedding reading the token ids, if one does."""
    ids = graph.inputs[0] if graph.inputs else None
    for node in graph.nodes:
        if isinstance(node.op, Embedding) and any(v.node == ids for v in node.inputs):
            return node.op.num_embeddings
    return None


#: What ``mg.decoder`` does not take and where it belongs.
_DECODER_HINTS = {**{k: f"{k} is mg.generate's, which takes a decoder"
                     for k in ("max_new_tokens", "sampler", "eos_token_id", "pad_token_id",
                               "temperature", "top_k", "top_p", "do_sample")},
                  **{k: f"{k} is mg.compile's: pass the CompiledModel, whose {k} the decoder keeps"
                     for k in ("policy", "scan_blocks")}}


def decoder(model_or_graph: Any, *, max_length: int | None = None, cache_dtype: Any = None, mesh: Any = None,
            rules: Any = None, **unknown: Any) -> Decoder:
    """The decoder of a causal language model: ``prefill`` and ``step`` over a
    key/value cache of ``max_length`` slots, derived from its graph.

    Args:
      model_or_graph: the model's ``Graph`` (token ids in, logits out, causal
        attention), or a ``CompiledModel`` of it (its policy and ``scan_blocks`` are
        kept, so its params fit).
      max_length: the cache's slots (prompt, padded to its bucket, plus new tokens).
      cache_dtype: the cache's dtype; None: each attention's compute dtype.
      mesh: a ``jax.sharding.Mesh`` to decode on (docs/sharding.md); a
        ``CompiledModel`` compiled with a mesh gives its own (and its rules) unless
        these are given.
      rules: logical axis -> mesh axis, as ``mg.compile``'s (e.g.
        ``mg.models.sharding_rules(graph, mesh)``: the caches split by heads, as the
        key/value kernels are).

    Raises:
      GraphError: for a graph the rewrite cannot handle (a non-causal attention, a
        layer mixing positions), naming the layer.
      ConfigError: a ``cache_dtype`` that is not a float dtype.
      ShardingError: rules without a mesh, or rules that do not fit it.

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> model = mg.compile(g)
      >>> params, state = model.init(jax.random.key(0))
      >>> dec = mg.decoder(g, max_length=128)
      >>> logits, cache = dec.prefill(params, state, jnp.array([[1, 2, 3]]))
      >>> logits, cache = dec.step(params, state, cache, jnp.argmax(logits[:, -1], -1))
      >>> logits.shape, cache.filled
      ((1, 1, 64), 65)
    """
    if unknown:
        raise ConfigError(unknown_keywords(
            "decoder", unknown, "decoder(model_or_graph, max_length, cache_dtype=None, mesh=None, "
            "rules=None)", _DECODER_HINTS))
    if max_length is None:
        raise ConfigError("decoder needs max_length=, the cache's slots (the prompt and the new "
                          "tokens together); mg.generate makes a decoder of the size it needs")
    if rules is not None and mesh is None:
        raise ShardingError("rules map logical axes to the axes of a mesh: pass mesh= too")
    if isinstance(model_or_graph, CompiledModel):
        scan = _scan_option(model_or_graph)
        plan = model_or_graph.sharding
        if mesh is None and plan is not None:
            mesh, rules = plan.mesh, plan.rules
        return Decoder(model_or_graph.source_graph, max_length=max_length, cache_dtype=cache_dtype,
                       policy=model_or_graph.policy, scan_blocks=scan, mesh=mesh, rules=rules)
    if not isinstance(model_or_graph, Graph):
        raise GraphError(f"mg.decoder takes a Graph or a CompiledModel, got "
                         f"{type(model_or_graph).__name__}")
    return Decoder(model_or_graph, max_length=max_length, cache_dtype=cache_dtype, mesh=mesh, rules=rules)


def _scan_option(model: CompiledModel) -> bool | str:
    """The ``scan_blocks`` that folds the decoding graph's runs as ``model``'s were:
    none, every one (``"always"``), or those the rule folds (``True``; its choice
    depends on the run and the block's weights, which decoding keeps)."""
    folded = sum(1 for n in model.graph.nodes if n.op.op_name == "scan")
    if not folded:
        return False
    return "always" if folded == len(repeated_runs(model.source_graph)) else True
