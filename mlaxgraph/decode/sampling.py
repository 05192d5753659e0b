"""Samplers: how ``mg.generate`` picks the next token from the logits.

``"greedy"`` takes the most likely token. ``Temperature(t)``, ``TopK(k)`` and
``TopP(p)`` each reshape the distribution and then draw from it. The logits processors
``RepetitionPenalty``, ``NoRepeatNGram``, ``BadWords``, ``MinNewTokens`` and
``MinLength`` change the logits by the tokens so far (the prompt's columns, its
padding included, as Hugging Face's ``input_ids``, and the new ones); alone, or with
no drawing sampler, the most likely token left is taken. They compose in order with
``+`` or as a list (``RepetitionPenalty(1.2) + TopK(40) + TopP(0.9)``, as Hugging
Face's logits processors do one after the other: its penalties first, then its
warpers). A drawing sampler needs ``key``.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import ConfigError
from ..core.signatures import KeywordsNamed

__all__ = ["Sampler", "Greedy", "Temperature", "TopK", "TopP", "Chain", "as_sampler", "History",
           "RepetitionPenalty", "NoRepeatNGram", "BadWords", "MinNewTokens", "MinLength"]


class History(NamedTuple):
    """The tokens so far, for the processors that read them: ``ids (batch, width)``
    int32, whose columns ``start`` (inclusive) to ``end`` (exclusive) hold each row's
    sequence (the prompt's columns as given, then the new tokens from column
    ``prompt_end``); ``eos`` the stop tokens (-1: none). All rows share the columns,
    the prompts being left-padded. ``attended`` ``(batch,)``: each row's first column
    its attention mask attends (None: ``start``), before which transformers' repetition
    penalty does not look (``prompt_ignore_length``: the left padding)."""

    ids: jax.Array
    start: jax.Array
    end: jax.Array
    prompt_end: jax.Array
    eos: jax.Array
    attended: jax.Array | None = None

    def valid(self) -> jax.Array:
        """``(width,)`` bool: the columns that hold the sequence."""
        column = jnp.arange(self.ids.shape[1])
        return (column >= self.start) & (column < self.end)


class Sampler(KeywordsNamed):
    """Picks tokens ``(batch,)`` int32 from logits ``(batch, vocab)``."""

    #: Whether it draws at random (and needs a key).
    draws: bool = True
    #: Whether it reads the tokens so far (a ``History``).
    reads_history: bool = False

    def process(self, logits: jax.Array, history: History | None = None) -> jax.Array:
        """The logits reshaped (masked tokens at the dtype's lowest value)."""
        return logits

    def __call__(self, logits: jax.Array, key: Any, history: History | None = None) -> jax.Array:
        logits = self.process(logits.astype(jnp.float32), history)
        if not self.draws:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    def __add__(self, other: Sampler) -> Chain:
        return Chain(tuple(_parts(self)) + tuple(_parts(as_sampler(other))))


def _parts(sampler: Sampler) -> tuple[Sampler, ...]:
    return sampler.parts if isinstance(sampler, Chain) else (sampler,)


@dataclasses.dataclass(frozen=True)
class Greedy(Sampler):
    """The most likely token (``"greedy"``)."""

    draws = False


@dataclasses.dataclass(frozen=True)
class Temperature(Sampler):
    """Draws from ``softmax(logits / temperature)``."""

    temperature: float

    def __post_init__(self):
        value = _real("Temperature", "temperature", self.temperature, "a number > 0")
        if not value > 0:
            raise ConfigError(f"Temperature: temperature must be > 0, got {self.temperature!r}")
        object.__setattr__(self, "temperature", value)

    def process(self, logits, history=None):
        return logits / jnp.asarray(self.temperature, logits.dtype)


@dataclasses.dataclass(frozen=True)
class TopK(Sampler):
    """Draws among the ``k`` most likely tokens (``TopK(1)`` is greedy)."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, numbers.Integral) or isinstance(self.k, bool) or self.k < 1:
            raise ConfigError(f"TopK: k must be a positive int, got {self.k!r}")
        object.__setattr__(self, "k", int(self.k))  # NumPy's too: hashed, compared as an int

    def process(self, logits, history=None):
        k = min(self.k, logits.shape[-1])
        kth = jax.lax.top_k(logits, k)[0][..., -1:]
        return jnp.where(logits < kth, jnp.finfo(logits.dtype).min, logits)


@dataclasses.dataclass(frozen=True)
class TopP(Sampler):
    """Draws among the most likely tokens whose probabilities sum to at least ``p``
    (nucleus sampling); the most likely token is always kept."""

    p: float

    def __post_init__(self):
        value = _real("TopP", "p", self.p, "a number in (0, 1]")
        if not 0 < value <= 1:
            raise ConfigError(f"TopP: p must be in (0, 1], got {self.p!r}")
        object.__setattr__(self, "p", value)

    def process(self, logits, history=None):
        order = jnp.argsort(-logits, axis=-1)
        ranked = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the more likely tokens
        keep_ranked = before < jnp.asarray(self.p, probs.dtype)
        keep = jnp.zeros_like(keep_ranked).at[
            jnp.arange(logits.shape[0])[:, None], order].set(keep_ranked)
        return jnp.where(keep, logits, jnp.finfo(logits.dtype).min)


# --- logits processors: Hugging Face's, by the tokens so far ------------------------------

class _Processor(Sampler):
    draws = False
    reads_history = True

    def process(self, logits, history=None):
        if history is None:
            raise ConfigError(f"{self!r} reads the tokens so far: it runs inside mg.generate "
                              f"(or is given an mg.sampling.History)")
        return self.change(logits, history)

    def change(self, logits: jax.Array, history: History) -> jax.Array:
        raise NotImplementedError


def _banned(logits: jax.Array, tokens: jax.Array, hit: jax.Array) -> jax.Array:
    """``logits`` with ``tokens[b, j]`` at -inf in row ``b`` wherever ``hit[b, j]``."""
    rows = jnp.arange(logits.shape[0])[:, None]
    ban = jnp.zeros(logits.shape, bool).at[rows, tokens].max(hit, mode="drop")
    return jnp.where(ban, -jnp.inf, logits)


def _real(owner: str, name: str, value: Any, what: str) -> float:
    """A sampler's number as a Python float (a JAX or NumPy scalar too: the compiled
    loop is cached by the sampler, which must hash); None or an array is refused."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or np.ndim(value) == 0
                                       and np.issubdtype(np.asarray(value).dtype, np.number)):
        raise ConfigError(f"{owner}: {name} must be {what}, got {value!r}")
    return float(np.asarray(value))


def _count(owner: str, name: str, value: Any) -> None:
    """A count of tokens: an int from 0 (Hugging Face's default: the processor does
    nothing) to int32's largest."""
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or not 0 <= int(value) <= 2**31 - 1):
        raise ConfigError(f"{owner}: {name} must be an int >= 0 (0: no effect, as Hugging "
                          f"Face's default), got {value!r}")


@dataclasses.dataclass(frozen=True)
class RepetitionPenalty(_Processor):
    """Hugging Face's ``repetition_penalty``: the logit of each token already in the
    sequence divided by ``penalty`` where positive, multiplied where negative (> 1
    makes repeats less likely)."""

    penalty: float

    def __post_init__(self):
        value = _real("RepetitionPenalty", "penalty", self.penalty, "a number > 0 (1.0: no penalty)")
        if not value > 0:
            raise ConfigError(f"RepetitionPenalty: penalty must be a number > 0 (1.0: no "
                              f"penalty), got {self.penalty!r}")
        object.__setattr__(self, "penalty", value)

    def change(self, logits, history):
        rows = jnp.arange(logits.shape[0])[:, None]
        valid = jnp.broadcast_to(history.valid(), history.ids.shape)
        if history.attended is not None:  # the left padding is not seen (transformers 5)
            valid = valid & (jnp.arange(history.ids.shape[1]) >= history.attended[:, None])
        seen = jnp.zeros(logits.shape, bool).at[rows, history.ids].max(valid, mode="drop")
        penalty = jnp.asarray(self.penalty, logits.dtype)
        return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


@dataclasses.dataclass(frozen=True)
class NoRepeatNGram(_Processor):
    """Hugging Face's ``no_repeat_ngram_size``: no n-gram of ``size`` tokens occurs
    twice; a token that would complete one already in the sequence gets -inf."""

    size: int

    def __post_init__(self):
        _count("NoRepeatNGram", "size", self.size)

    def change(self, logits, history):
        n, ids = self.size, history.ids
        width = ids.shape[1]
        if n == 0 or n > width:  # 0: Hugging Face's default, no n-gram banned
            return logits
        starts = jnp.arange(width - n + 1)  # the n-gram at columns j .. j + n - 1
        hit = (starts >= history.start) & (starts <= history.end - n)
        for k in range(n - 1):  # its first n - 1 tokens equal the sequence's last n - 1
            last = jax.lax.dynamic_index_in_dim(ids, history.end - (n - 1) + k, 1)
            hit = hit & (ids[:, k:width - n + 1 + k] == last)
        return _banned(logits, ids[:, n - 1:], hit)


@dataclasses.dataclass(frozen=True)
class BadWords(_Processor):
    """Hugging Face's ``bad_words_ids``: token sequences that never occur. A sequence
    of one token is never taken (unless it is a stop token, which Hugging Face keeps);
    a longer one's last token gets -inf when the sequence ends with the others."""

    sequences: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        value = self.sequences
        ok = (isinstance(value, (list, tuple)) and len(value) > 0
              and all(isinstance(s, (list, tuple)) and len(s) > 0 for s in value)
              and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0
                      for s in value for t in s))
        if not ok:
            raise ConfigError(f"BadWords takes a non-empty list of non-empty lists of token "
                              f"ids >= 0 (Hugging Face's bad_words_ids), got {value!r}")
        object.__setattr__(self, "sequences", tuple(tuple(int(t) for t in s) for s in value))

    def change(self, logits, history):
        vocab = logits.shape[1]
        beyond = sorted({t for s in self.sequences for t in s if t >= vocab})
        if beyond:  # as transformers refuses them
            raise ConfigError(f"BadWords: token ids {beyond} are out of the model's vocabulary "
                              f"of {vocab}")
        singles = [s[0] for s in self.sequences if len(s) == 1]
        if singles:
            banned = jnp.zeros((vocab,), bool).at[jnp.asarray(singles)].set(True)
            banned = banned & ~jnp.isin(jnp.arange(vocab), history.eos)
            logits = jnp.where(banned, -jnp.inf, logits)
        length = history.end - history.start
        for s in (s for s in self.sequences if len(s) > 1):
            m = len(s)
            if m - 1 > history.ids.shape[1]:
                continue
            tail = jax.lax.dynamic_slice_in_dim(history.ids, history.end - (m - 1), m - 1, 1)
            hit = jnp.all(tail == jnp.asarray(s[:-1], tail.dtype), axis=1) & (length >= m - 1)
            logits = logits.at[:, s[-1]].set(jnp.where(hit, -jnp.inf, logits[:, s[-1]]))
        return logits


def _no_stop(logits: jax.Array, history: History, early: jax.Array) -> jax.Array:
    stop = jnp.isin(jnp.arange(logits.shape[1]), history.eos)
    return jnp.where(stop & early, -jnp.inf, logits)


@dataclasses.dataclass(frozen=True)
class MinNewTokens(_Processor):
    """Hugging Face's ``min_new_tokens``: no stop token (``eos_token_id``) before
    ``count`` new tokens."""

    count: int

    def __post_init__(self):
        _count("MinNewTokens", "count", self.count)

    def change(self, logits, history):
        return _no_stop(logits, history, history.end - history.prompt_end < self.count)


@dataclasses.dataclass(frozen=True)
class MinLength(_Processor):
    """Hugging Face's ``min_length``: no stop token before the sequence (the prompt's
    columns, its padding included, and the new tokens) holds ``length`` tokens."""

    length: int

    def __post_init__(self):
        _count("MinLength", "length", self.length)

    def change(self, logits, history):
        return _no_stop(logits, history, history.end - history.start < self.length)


@dataclasses.dataclass(frozen=True)
class Chain(Sampler):
    """Samplers applied in order, then one draw (``a + b`` or a list); the most likely
    token left when none of them draws, or when one of them is ``Greedy`` (``"greedy"``:
    the processors' logits' most likely token, as transformers' ``do_sample=False``)."""

    parts: tuple[Sampler, ...]

    @property
    def draws(self) -> bool:  # type: ignore[override]
        return any(p.draws for p in self.parts) and not any(isinstance(p, Greedy) for p in self.parts)

    @property
    def reads_history(self) -> bool:  # type: ignore[override]
        return any(p.reads_history for p in self.parts)

    def process(self, logits, history=None):
        for part in self.parts:
            logits = part.process(logits, history)
        return logits


def as_sampler(value: Any) -> Sampler:
    """``"greedy"``, a ``Sampler`` or a list of them, as one sampler."""
    if isinstance(value, Sampler):
        return value
    if value == "greedy" or value is None:
        return Greedy()
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, Sampler) or v == "greedy" for v in value):
        return Chain(tuple(p for v in value for p in _parts(as_sampler(v))))
    hint = ""
    if isinstance(value, str):  # a misspelt "greedy", or a sampler's name as text
        names = {"greedy": "'greedy'", **{n.lower(): f"mg.sampling.{n}(...)" for n in _NAMED}}
        close = difflib.get_close_matches(value.lower(), list(names), n=1, cutoff=0.6)
        hint = f" (did you mean {names[close[0]]}?)" if close else ""
    raise ConfigError(f"sampler must be 'greedy', an mg.sampling sampler or a list of them, "
                      f"got {value!r}{hint}")


#: The samplers a text naming one is compared with.
_NAMED = ("Temperature", "TopK", "TopP", "RepetitionPenalty", "NoRepeatNGram", "BadWords",
          "MinLength", "MinNewTokens")
