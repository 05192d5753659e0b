"""``mg.generate`` and ``mg.generate_stream``: new tokens from a causal language model,
through its decoder (``mg.decoder``). The whole loop of one ``generate`` call is one
jitted function (``lax.while_loop`` over the decoder's step), compiled once per batch
size, prompt bucket and sampler."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import CompiledModel
from ..core.donated import reraise_deleted
from ..core.errors import ConfigError, GraphError, ShapeError
from ..ir.graph import Graph
from .arguments import refuse_unknown
from .decoder import MIN_BUCKET, Cache, Decoder, _left_pad, _scan_option, bucket_length, decoder, prompt_positions
from .derive import position_limit
from .inputs import check_key, host_rows, inferred_mask, stop_ids, token_id
from .sampling import History, Sampler, as_sampler

__all__ = ["generate", "generate_stream"]

#: The tokens of a prompt's piece in ``generate``'s prefill (only the pieces holding a
#: token of some row run).
PREFILL_CHUNK = 16

#: Decoders made by ``generate`` for a model on a mesh (by max_length), kept while the
#: model lives (for a graph, and a model on one device, in the graph's memo: ``_made_for``).
_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decoder_for(source: Any, prompt: int, new: int) -> Decoder:
    """The decoder itself, or one made for the model with room for the prompt's bucket
    and the new tokens: the smallest power of two holding both (128 slots for a prompt
    of up to 64 tokens and up to 64 new ones), so that the prompts of one bucket share
    it and a step attends over few unused slots."""
    if isinstance(source, Decoder):
        return source
    if not isinstance(source, (CompiledModel, Graph)):
        raise GraphError(f"generate takes a CompiledModel, a Graph or an mg.decoder, got "
                         f"{type(source).__name__}")
    graph = source if isinstance(source, Graph) else source.source_graph
    limit = position_limit(graph)
    if limit is not None and prompt + new > limit:
        raise ShapeError(f"a prompt of {prompt} tokens and max_new_tokens={new} need {prompt + new} "
                         f"positions, but the model's position table has {limit}",
                         expected=f"prompt + max_new_tokens of at most {limit}")
    need = bucket_length(prompt, 1 << 62) + new
    length = MIN_BUCKET
    while length < need:
        length *= 2
    if limit is not None:
        length = min(length, limit)  # the prompt's bucket shrinks to fit (_prepare)
    made = _made_for(source)
    if length not in made:
        made[length] = decoder(source, max_length=length)
    return made[length]


def _made_for(source: CompiledModel | Graph) -> dict:
    """The decoders made for ``source`` by max_length. A model's are kept in its graph's
    memo by what the decoder takes from it (its policy and ``scan_blocks``), so that
    ``generate(mg.compile(g), ...)`` called again finds the decoder, and its compiled
    loops, that the first call made; a model on a mesh keeps its own."""
    if isinstance(source, Graph):
        return source.memo("decoders")
    if source.sharding is not None:
        return _DECODERS.setdefault(source, {})
    return source.source_graph.memo("model decoders").setdefault(
        (source.policy, _scan_option(source)), {})


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 0)


def _new_tokens(where: str, max_new_tokens: Any, max_length: Any, prompt: int) -> int:
    """The new tokens per row: ``max_new_tokens``, or Hugging Face's ``max_length``
    (the prompt's columns and the new tokens together) less the prompt's columns."""
    if max_length is None:
        if max_new_tokens is None:
            raise ConfigError(f"{where} needs max_new_tokens (the new tokens per row) or "
                              f"max_length (Hugging Face's: the prompt's length and them)")
        if not _is_count(max_new_tokens):
            raise ConfigError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        return int(max_new_tokens)
    if max_new_tokens is not None:
        raise ConfigError(f"{where} got max_new_tokens={max_new_tokens!r} and "
                          f"max_length={max_length!r}: give one (max_length counts the "
                          f"prompt's {prompt} tokens too)")
    if not _is_count(max_length) or max_length <= prompt:
        raise ConfigError(f"max_length counts the prompt's {prompt} tokens and the new ones, "
                          f"so it must be an int > {prompt}, got {max_length!r} (or give "
                          f"max_new_tokens)")
    return int(max_length) - prompt


def _prepare(where, source, input_ids, attention_mask, max_new_tokens, max_length, sampler, key,
             eos_token_id, pad_token_id):
    input_ids = host_rows(input_ids, "input_ids")
    prompt = int(np.shape(input_ids)[1]) if np.ndim(input_ids) == 2 else 0
    new = _new_tokens(where, max_new_tokens, max_length, prompt)
    attention_mask = inferred_mask(input_ids, attention_mask, pad_token_id, eos_token_id)
    used = _used_columns(input_ids, attention_mask, prompt)
    dec = _decoder_for(source, used, new)
    ids, mask = dec._prompt(input_ids, attention_mask)
    ids, mask = ids[:, ids.shape[1] - used:], mask[:, mask.shape[1] - used:]
    seq = ids.shape[1]
    if seq + new > dec.max_length:
        raise ShapeError(f"max_new_tokens={new} after a prompt of {seq} tokens goes past the "
                         f"decoder's max_length={dec.max_length}")
    padded = bucket_length(seq, dec.max_length - new)
    sample = as_sampler(sampler)
    check_key(key)
    if sample.draws and key is None:
        raise ConfigError(f"the sampler {sample!r} draws at random: pass key=jax.random.key(...)")
    stops = stop_ids(eos_token_id, dec.vocab_size)
    pad = (token_id(pad_token_id, dec.vocab_size, "pad_token_id") if pad_token_id is not None
           else stops[0] if stops else 0)
    given = np.asarray(input_ids).astype(np.int32)  # given back as it came (padding too)
    return dec, given, ids, mask, new, padded, sample, _stop_array(stops), pad


def _used_columns(input_ids: Any, attention_mask: Any, columns: int) -> int:
    """The prompt's columns that hold a token of some row once each row's tokens are at
    its end (as ``prompt_arrays`` aligns them): the longest row's span. Columns that are
    padding in every row take no cache slot and count against no position limit."""
    mask = None if attention_mask is None else np.asarray(attention_mask)
    if mask is None or mask.shape != np.shape(input_ids) or mask.ndim != 2 or not mask.size \
            or not np.isin(mask, (0, 1)).all() or not mask.any(axis=1).all():
        return columns  # none to leave out, or a mask prompt_arrays refuses
    marked = mask.astype(bool)
    first = np.argmax(marked, axis=1)
    last = columns - 1 - np.argmax(marked[:, ::-1], axis=1)
    return int(np.max(last - first + 1))


def _stop_array(stops: Sequence[int]) -> np.ndarray:
    """The stop tokens as int32, filled with -1 (none) to a power of two of at least 4,
    so that one to four stop tokens share a compiled loop."""
    width = 4
    while width < len(stops):
        width *= 2
    return np.asarray([*stops, *[-1] * (width - len(stops))], np.int32)


def _stopped(token: jax.Array, eos: jax.Array) -> jax.Array:
    """Whether each row's token is one of the stop tokens ``eos`` (-1: none)."""
    return jnp.any(token[:, None] == eos[None, :], axis=1)


def generate(model_or_decoder: Any, params: Any, state: Any, input_ids: Any, *,
             max_new_tokens: int | None = None, attention_mask: Any = None,
             sampler: Any = "greedy", key: jax.Array | None = None,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
             max_length: int | None = None, **unknown: Any) -> jax.Array:
    """The prompt followed by up to ``max_new_tokens`` new tokens per row:
    ``int32 (batch, prompt + max_new_tokens)``.

    Args:
      model_or_decoder: a ``CompiledModel`` or ``Graph`` of a causal language model
        (a decoder is made for it, with room for the prompt and the new tokens), or an
        ``mg.decoder``.
      params: the model's trainable weights (``model.init`` or loaded).
      state: its non-trainable weights.
      input_ids: int ``(batch, seq)``; rows of different lengths are padded and
        marked by ``attention_mask`` (1 = token, 0 = padding), positions counted from
        it as Hugging Face's ``generate`` does. Left or right padding: a right-padded
        row is aligned to the right before it runs, so each row generates what it
        generates alone; the prompt is given back as it came.
      max_new_tokens: the new tokens per row.
      max_length: instead of ``max_new_tokens``, as Hugging Face's: the prompt's
        columns (``input_ids.shape[1]``, padding included) and the new tokens together.
      sampler: ``"greedy"``, an ``mg.sampling`` sampler or a list of them.
      key: the random key of a drawing sampler, ``jax.random.key(...)`` (step ``i``
        uses ``fold_in(key, i)``).
      eos_token_id: a stop token, or a list of them (any one ends a row, as Hugging
        Face's); a row stops after it; later tokens of that row are
        ``pad_token_id``; the loop ends when every row has stopped.
      pad_token_id: fills stopped rows; by default the (first) ``eos_token_id``,
        else 0. Without ``attention_mask``, the prompt's tokens equal to it are
        padding (when it is not a stop token), as Hugging Face's ``generate`` infers.

    Raises:
      ShapeError: no rows, an empty prompt (a row whose mask marks no token), a
        prompt longer than the decoder's ``max_length``, ``max_new_tokens`` past it,
        or token ids out of the vocabulary.
      ConfigError: an argument it does not take (Hugging Face's ``temperature``,
        ``top_k``, ``top_p`` and ``do_sample`` named with the sampler that does what
        they ask), a bad sampler, a drawing one without ``key``, a key that is not a
        JAX random key, stop or pad tokens that are not ints in the vocabulary, an
        ``attention_mask`` holding other values than 0 and 1.

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> model = mg.compile(g)
      >>> params, state = model.init(jax.random.key(0))
      >>> mg.generate(model, params, state, jnp.array([[1, 2, 3]]), max_new_tokens=5).shape
      (1, 8)
    """
    refuse_unknown("generate", unknown)
    dec, given, ids, mask, new, padded, sample, eos, pad = _prepare(
        "generate", model_or_decoder, input_ids, attention_mask, max_new_tokens, max_length,
        sampler, key, eos_token_id, pad_token_id)
    if new == 0:
        return given
    ids_p, mask_p = _left_pad(ids, mask, padded)
    run = _loop(dec, ids.shape[0], padded, sample)
    try:
        tokens = run(params, state, ids_p, mask_p,
                     np.int32(new), jax.random.key(0) if key is None else key,
                     eos, np.int32(pad), np.int32(padded - ids.shape[1]))
    except (RuntimeError, ValueError) as e:
        reraise_deleted(e, "generate", params=params, state=state)
        raise
    # joined on the host: an eager concatenate would compile once per prompt length
    return jax.device_put(np.concatenate([given, np.asarray(tokens)[:, :new]], axis=1))


def _loop(dec: Decoder, batch: int, padded: int, sample: Sampler):
    """The jitted generation loop for one batch size, prompt bucket and sampler."""
    memo_key = ("generate", batch, padded, sample)
    fn = dec._jitted.get(memo_key)
    if fn is not None:
        return fn
    prefill, step, chunk = dec.prefill_fn(batch), dec.step_fn(batch), dec.chunk_fn(batch)
    room = dec.max_length - padded

    def prompt(params, state, ids, mask):
        """The cache after the prompt less its last token, in chunks of ``PREFILL_CHUNK``
        tokens: only those holding a token of some row run (the rows are left-padded
        to the bucket, so the tokens are the last ``longest`` columns; a 16-token
        prompt in a 64-token bucket runs one chunk, not 63 positions). A first chunk
        reaching before column 0 starts at 0 and computes again the slots of the next
        one, which writes the same keys and values."""
        prefix, size = padded - 1, min(PREFILL_CHUNK, padded - 1)
        cache = dec.empty_cache(batch)
        mask = mask.astype(bool)
        cache_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, 0))
        positions = prompt_positions(mask)
        longest = jnp.max(jnp.sum(mask, axis=1, dtype=jnp.int32))
        chunks = (longest - 1 + size - 1) // size

        def piece(i, layers):
            start = jnp.maximum(0, prefix - (chunks - i) * size)
            return chunk(params, state, layers, jax.lax.dynamic_slice(ids, (0, start), (batch, size)),
                         jax.lax.dynamic_slice(positions, (0, start), (batch, size)), start,
                         cache_mask)

        layers = jax.lax.fori_loop(0, chunks, piece, cache.layers)
        return Cache(layers, jnp.asarray(prefix, jnp.int32),
                     jnp.sum(mask[:, :-1], axis=1, dtype=jnp.int32), cache_mask, 0)

    def seen(ids, start, tokens, i, eos, mask):
        """The tokens so far, for a sampler that reads them: the prompt's columns as
        given (from ``start`` in the bucket) and the ``i`` new ones."""
        if not sample.reads_history:
            return None
        return History(jnp.concatenate([ids, tokens], axis=1), start, padded + i,
                       jnp.asarray(padded, jnp.int32), eos,
                       jnp.argmax(mask.astype(bool), axis=1).astype(jnp.int32))

    def loop(params, state, ids, mask, new, key, eos, pad, start):
        dec.compile_count += 1  # runs when traced only
        if padded > 1:  # the prompt's last token (left padding: every row's) through a step,
            # so that the head runs on one position, not on the whole bucket
            logits, cache = step(params, state, prompt(params, state, ids, mask), ids[:, -1:])
        else:
            logits, cache = prefill(params, state, dec.empty_cache(batch), ids, mask)
        tokens = jnp.full((batch, room), pad, jnp.int32)
        token = sample(logits[:, -1], jax.random.fold_in(key, 0), seen(ids, start, tokens, 0, eos, mask))
        done = _stopped(token, eos)
        tokens = tokens.at[:, 0].set(token)

        def cond(carry):
            i, _, _, done, _ = carry
            return (i < new) & ~jnp.all(done)

        def body(carry):
            i, token, cache, done, tokens = carry
            logits, cache = step(params, state, cache, token[:, None])
            token = sample(logits[:, -1], jax.random.fold_in(key, i),
                           seen(ids, start, tokens, i, eos, mask))
            token = jnp.where(done, pad, token)
            tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, i))
            return i + 1, token, cache, done | _stopped(token, eos), tokens

        carry = (jnp.asarray(1, jnp.int32), token, cache, done, tokens)
        return jax.lax.while_loop(cond, body, carry)[-1]

    fn = dec._jitted[memo_key] = jax.jit(loop)
    return fn


def generate_stream(model_or_decoder: Any, params: Any, state: Any, input_ids: Any, *,
                    max_new_tokens: int | None = None, attention_mask: Any = None,
                    sampler: Any = "greedy", key: jax.Array | None = None,
                    eos_token_id: int | Sequence[int] | None = None,
                    pad_token_id: int | None = None, max_length: int | None = None,
                    **unknown: Any) -> Iterator[jax.Array]:
    """``generate`` one token at a time: yields each step's new tokens, int32
    ``(batch,)`` (``pad_token_id`` for rows that have stopped), until every row has
    stopped or ``max_new_tokens`` were made. The same tokens as ``generate`` with the
    same arguments.

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> params, state = mg.compile(g).init(jax.random.key(0))
      >>> [t.shape for t in mg.generate_stream(g, params, state, jnp.array([[5, 6]]),
      ...                                      max_new_tokens=3)]
      [(1,), (1,), (1,)]
    """
    refuse_unknown("generate_stream", unknown)  # checked at the call, not at the first next()
    dec, _, ids, mask, new, padded, sample, eos, pad = _prepare(
        "generate_stream", model_or_decoder, input_ids, attention_mask, max_new_tokens,
        max_length, sampler, key, eos_token_id, pad_token_id)
    return _stream(dec, params, state, ids, mask, new, padded, sample,
                   jax.random.key(0) if key is None else key, eos, pad)


def _stream(dec, params, state, ids, mask, new, padded, sample, key, eos, pad) -> Iterator[jax.Array]:
    """``generate_stream``'s tokens, its arguments checked."""
    if new == 0:
        return
    pick = _pick(dec, sample)
    # the prompt runs left-padded to its bucket, as in generate: what reads it is
    # compiled once per bucket, not once per prompt length
    ids_p, mask_p = _left_pad(ids, mask, padded)
    logits, cache = dec._prefill_padded(params, state, ids_p, mask_p)
    done = np.zeros((ids.shape[0],), bool)
    history = (History(*jax.device_put((
        np.pad(ids_p, ((0, 0), (0, dec.max_length - padded)), constant_values=pad),
        np.int32(padded - ids.shape[1]),
        np.int32(padded), np.int32(padded), eos, np.argmax(mask_p, axis=1).astype(np.int32))))
               if sample.reads_history else None)
    for i in range(new):
        token, done, history = pick(logits, key, np.int32(i), done, np.int32(pad), eos, history)
        yield token
        if i + 1 == new or bool(np.all(done)):
            return
        logits, cache = dec._advance(params, state, cache, token[:, None])


def _pick(dec: Decoder, sample: Sampler):
    """``generate_stream``'s jitted choice of each step's tokens from the last column's
    logits: ``(token, done, history)`` with the rows that stopped given ``pad`` and the
    token written to the history."""
    fn = dec._jitted.get(("sample", sample))
    if fn is None:
        def pick(logits, key, i, done, pad, eos, history):
            token = jnp.where(done, pad, sample(logits[:, -1], jax.random.fold_in(key, i), history))
            if history is not None:
                history = history._replace(
                    ids=jax.lax.dynamic_update_slice(history.ids, token[:, None], (0, history.end)),
                    end=history.end + 1)
            return token, done | _stopped(token, eos), history

        fn = dec._jitted[("sample", sample)] = jax.jit(pick)
    return fn
