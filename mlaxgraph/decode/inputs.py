"""The checks of what a caller gives the decoder: prompts and their attention masks,
the token ids of a step, the stop tokens, the random key and the cache. Each runs on
the host, once per call, on arrays it can read (nothing is added inside jit); each
refusal is an ``mg.*Error`` saying what to give instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..core.errors import ConfigError, GraphError, ShapeError

__all__ = ["prompt_arrays", "host_rows", "step_ids", "stop_ids", "token_id", "check_key", "check_cache",
           "check_vocabulary", "inferred_mask", "prompt_room"]


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def _integer_ids(value: Any, what: str, form: str) -> np.ndarray:
    """``value`` read on the host, refused unless it holds integers."""
    ids = host_rows(value, what)
    if not (np.issubdtype(ids.dtype, np.integer) and ids.dtype != np.bool_):
        raise ShapeError(f"{what} must be integer token ids {form}, got {_describe(ids)}")
    return ids


def host_rows(value: Any, what: str) -> np.ndarray:
    """``value`` as a NumPy array; rows given as Python lists of several lengths, or of
    none, are named (NumPy raises on the first and makes the second float64)."""
    if isinstance(value, Mapping):  # a tokenizer's output (a BatchEncoding too)
        raise ShapeError(f"{what} takes the token ids, got a {type(value).__name__} of "
                         f"{', '.join(map(str, list(value)[:3]))}: pass input_ids=batch['input_ids'] "
                         f"and attention_mask=batch['attention_mask']")
    if isinstance(value, (list, tuple)) and value and all(isinstance(r, (list, tuple)) for r in value):
        lengths = sorted({len(r) for r in value})
        if len(lengths) > 1:  # NumPy's "inhomogeneous shape" ValueError
            raise ShapeError(f"{what}: rows of {lengths[0]} to {lengths[-1]} tokens; pad them to "
                             f"one length (on the left) and pass attention_mask (0 on the padding)")
        if lengths == [0]:  # [[]]: NumPy makes it float64
            raise ShapeError(f"{what}: the prompt is empty (rows of 0 tokens)")
    return np.asarray(value)


def check_vocabulary(ids: np.ndarray, vocab: int | None, what: str) -> None:
    """A ``ShapeError`` (``what``: the message's subject) for an id outside ``[0, vocab)``."""
    if vocab is None or ids.size == 0:
        return
    bad = ids[(ids < 0) | (ids >= vocab)]
    if bad.size:
        raise ShapeError(f"{what}: token id {int(bad[0])} is out of the vocabulary: ids must be "
                         f"in [0, {vocab})")


def prompt_arrays(input_ids: Any, attention_mask: Any, *, vocab: int | None,
                  max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The prompt as int32 ids and a bool mask ``(batch, seq)``, each row's tokens at
    its end: a right-padded row (padding after its tokens, the default padding side
    of many tokenizers) is rotated so that its padding comes first, as if it had been
    left-padded; positions are counted from the mask either way.

    Raises:
      ShapeError: ids that are not integers ``(batch, seq)``, no row, no column, more
        tokens than ``max_length``, an id out of the vocabulary, a mask of another
        shape, or a row whose mask marks no token (an empty prompt).
      ConfigError: a mask holding other values than 0 and 1.
    """
    ids = _integer_ids(input_ids, "input_ids", "(batch, seq)")
    if ids.ndim != 2:
        raise ShapeError(f"input_ids must be integer token ids (batch, seq), got {_describe(ids)}")
    if ids.shape[0] < 1:
        raise ShapeError(f"input_ids has no rows ({_describe(ids)}): give at least one prompt")
    if ids.shape[1] < 1:
        raise ShapeError("the prompt is empty: give at least one token per row")
    if ids.shape[1] > max_length:
        raise ShapeError(f"the prompt has {ids.shape[1]} tokens, more than the decoder's "
                         f"max_length={max_length}")
    check_vocabulary(ids, vocab, "input_ids")
    ids = ids.astype(np.int32)
    if attention_mask is None:
        return ids, np.ones(ids.shape, bool)
    given = np.asarray(attention_mask)
    if given.shape != ids.shape:
        raise ShapeError(f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, "
                         f"got {tuple(given.shape)}")
    if given.dtype != np.bool_:
        if not (np.issubdtype(given.dtype, np.number) and np.isin(given, (0, 1)).all()):
            odd = given[~np.isin(given, (0, 1))] if np.issubdtype(given.dtype, np.number) else given
            raise ConfigError(f"attention_mask must hold 1 (a token) and 0 (padding), got "
                              f"{odd.flat[0].item()!r} ({given.dtype})")
    mask = given.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ShapeError(f"row {int(empty[0])} of attention_mask marks no token: that prompt is "
                         f"empty; give at least one token per row")
    trailing = np.argmax(mask[:, ::-1], axis=1)  # the padding after each row's last token
    if trailing.any():
        columns = (np.arange(ids.shape[1])[None] - trailing[:, None]) % ids.shape[1]
        ids = np.take_along_axis(ids, columns, axis=1)
        mask = np.take_along_axis(mask, columns, axis=1)
    return ids, mask


def step_ids(token_ids: Any, batch: int, vocab: int | None) -> Any:
    """The token ids of a step as ``(batch, n)``: checked on the host (integers, in
    the vocabulary) unless they are traced, when only their dtype is checked."""
    ids: Any
    if isinstance(token_ids, jax.core.Tracer):
        ids = token_ids
        if not np.issubdtype(ids.dtype, np.integer) or ids.dtype == np.bool_:
            raise ShapeError(f"token_ids must be integer token ids (batch,) or (batch, n), got "
                             f"{_describe(ids)}")
    else:
        ids = _integer_ids(token_ids, "token_ids", "(batch,) or (batch, n)")
    if ids.ndim == 1:
        ids = ids[:, None]
    if ids.ndim != 2 or ids.shape[0] != batch:
        raise ShapeError(f"token_ids must be (batch,) or (batch, n) with the cache's batch "
                         f"{batch}, got {tuple(np.shape(token_ids))}")
    if not isinstance(ids, jax.core.Tracer):
        check_vocabulary(ids, vocab, "token_ids")
        ids = ids.astype(np.int32)
    return ids


def token_id(value: Any, vocab: int | None, what: str) -> int:
    """One token id given as an argument (``pad_token_id``, an ``eos_token_id``): an
    int, or an integer array of one (NumPy's, JAX's, torch's, as a list of them is)."""
    if hasattr(value, "__array__") and not isinstance(value, np.integer) and np.ndim(value) == 0 \
            and np.issubdtype(np.asarray(value).dtype, np.integer):
        value = np.asarray(value).item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{what} must be an int token id, got {_describe(value)}")
    if vocab is not None and not 0 <= value < vocab:
        raise ConfigError(f"{what} {int(value)} is out of the vocabulary: ids must be in "
                          f"[0, {vocab})")
    return int(value)


def stop_ids(eos_token_id: Any, vocab: int | None) -> tuple[int, ...]:
    """The stop tokens: none for None, one for an int, several for a list (any of them
    ends a row, as Hugging Face's ``generation_config.eos_token_id`` list does)."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (list, tuple)) or (hasattr(eos_token_id, "__array__")
                                                    and np.ndim(eos_token_id) >= 1):
        items = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else \
            list(np.asarray(eos_token_id).reshape(-1))  # NumPy's, JAX's, torch's
        if not items:
            raise ConfigError("eos_token_id is an empty list: give None for no stop token")
        return tuple(token_id(v, vocab, "eos_token_id") for v in items)
    return (token_id(eos_token_id, vocab, "eos_token_id"),)


def inferred_mask(input_ids: np.ndarray, attention_mask: Any, pad_token_id: Any,
                  eos_token_id: Any) -> Any:
    """``attention_mask``, or, where none is given, the one Hugging Face's ``generate``
    infers: 0 on the prompt's ``pad_token_id`` tokens when some are there and it is not
    a stop token (None: no padding to infer)."""
    if attention_mask is not None or pad_token_id is None or input_ids.ndim != 2:
        return attention_mask
    if not np.issubdtype(input_ids.dtype, np.integer) or input_ids.dtype == np.bool_:
        return None  # refused as such by prompt_arrays
    pad = token_id(pad_token_id, None, "pad_token_id")
    if pad in stop_ids(eos_token_id, None) or not (input_ids == pad).any():
        return None
    mask = (input_ids != pad).astype(np.int32)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ShapeError(f"row {int(empty[0])} of input_ids holds only pad_token_id={pad}: that "
                         f"prompt is empty (without attention_mask, the tokens equal to "
                         f"pad_token_id are padding, as in Hugging Face's generate)")
    return mask


def check_key(key: Any) -> None:
    """A random key: ``jax.random.key(...)`` (or a legacy ``jax.random.PRNGKey``)."""
    if key is None:
        return
    if isinstance(key, np.ndarray) and key.dtype == np.uint32 and key.shape == (2,):
        return  # a legacy raw key on the host, as jax.random.PRNGKey's
    if isinstance(key, jax.Array):
        if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
            return
        if key.dtype == np.uint32 and key.shape == (2,):
            return
    raise ConfigError(f"key must be one JAX random key, e.g. key=jax.random.key(0), got "
                      f"{_describe(key)}")


def prompt_room(room: Any, seq: int, max_length: int) -> int:
    """``prefill``'s ``room``: the slots to keep free after a prompt of ``seq`` tokens,
    half the cache by default; an int from 0 to what the prompt leaves."""
    if room is None:
        return max_length // 2
    if isinstance(room, bool) or not isinstance(room, (int, np.integer)) or room < 0:
        raise ConfigError(f"room must be an int >= 0 (the slots to keep free for step after the "
                          f"prompt), got {room!r}")
    if room > max_length - seq:
        raise ShapeError(f"room={int(room)}: a prompt of {seq} tokens leaves {max_length - seq} of "
                         f"the decoder's max_length={max_length} slots; make the decoder with a "
                         f"larger max_length")
    return int(room)


def check_cache(cache: Any, kind: type, max_length: int | None = None) -> None:
    """A cache ``step`` can run from: one ``prefill`` or ``step`` of this decoder
    (``max_length`` slots) returned and no ``step`` has consumed yet (its buffers are
    donated to the next cache)."""
    if not isinstance(cache, kind):
        raise GraphError(f"step takes the cache that prefill or step returned, got "
                         f"{type(cache).__name__}")
    slots = tuple(getattr(getattr(cache, "mask", None), "shape", ()))
    if max_length is not None and len(slots) == 2 and slots[1] != max_length:
        raise GraphError(f"this cache has {slots[1]} slots: it is another decoder's (this one has "
                         f"max_length={max_length}); step it with the decoder whose prefill made it")
    if any(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_deleted()
           for x in jax.tree.leaves(cache)):
        raise GraphError("this cache was consumed by step (its buffers hold the cache step "
                         "returned): use the one it returned, `logits, cache = dec.step(...)`")
