"""Samplers: how ``mg.generate`` picks the next token from the logits.

``"greedy"`` takes the most likely token. ``Temperature(t)``, ``TopK(k)`` and
``TopP(p)`` each reshape the distribution and then draw from it; they compose in order
with ``+`` or as a list (``TopK(40) + TopP(0.9) + Temperature(0.7)``, as Hugging Face's
logits processors do one after the other). A drawing sampler needs ``key``.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import jax
import jax.numpy as jnp

from ..core.errors import ConfigError

__all__ = ["Sampler", "Greedy", "Temperature", "TopK", "TopP", "Chain", "as_sampler"]


class Sampler:
    """Picks tokens ``(batch,)`` int32 from logits ``(batch, vocab)``."""

    #: Whether it draws at random (and needs a key).
    draws: bool = True

    def process(self, logits: jax.Array) -> jax.Array:
        """The logits reshaped (masked tokens at the dtype's lowest value)."""
        return logits

    def __call__(self, logits: jax.Array, key: Any) -> jax.Array:
        logits = self.process(logits.astype(jnp.float32))
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    def __add__(self, other: Sampler) -> Chain:
        return Chain(tuple(_parts(self)) + tuple(_parts(as_sampler(other))))


def _parts(sampler: Sampler) -> tuple[Sampler, ...]:
    return sampler.parts if isinstance(sampler, Chain) else (sampler,)


@dataclasses.dataclass(frozen=True)
class Greedy(Sampler):
    """The most likely token (``"greedy"``)."""

    draws = False

    def __call__(self, logits, key):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Temperature(Sampler):
    """Draws from ``softmax(logits / temperature)``."""

    temperature: float

    def __post_init__(self):
        if not float(self.temperature) > 0:
            raise ConfigError(f"Temperature: temperature must be > 0, got {self.temperature!r}")

    def process(self, logits):
        return logits / jnp.asarray(self.temperature, logits.dtype)


@dataclasses.dataclass(frozen=True)
class TopK(Sampler):
    """Draws among the ``k`` most likely tokens (``TopK(1)`` is greedy)."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ConfigError(f"TopK: k must be a positive int, got {self.k!r}")

    def process(self, logits):
        k = min(self.k, logits.shape[-1])
        kth = jax.lax.top_k(logits, k)[0][..., -1:]
        return jnp.where(logits < kth, jnp.finfo(logits.dtype).min, logits)


@dataclasses.dataclass(frozen=True)
class TopP(Sampler):
    """Draws among the most likely tokens whose probabilities sum to at least ``p``
    (nucleus sampling); the most likely token is always kept."""

    p: float

    def __post_init__(self):
        if not 0 < float(self.p) <= 1:
            raise ConfigError(f"TopP: p must be in (0, 1], got {self.p!r}")

    def process(self, logits):
        order = jnp.argsort(-logits, axis=-1)
        ranked = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the more likely tokens
        keep_ranked = before < jnp.asarray(self.p, probs.dtype)
        keep = jnp.zeros_like(keep_ranked).at[
            jnp.arange(logits.shape[0])[:, None], order].set(keep_ranked)
        return jnp.where(keep, logits, jnp.finfo(logits.dtype).min)


@dataclasses.dataclass(frozen=True)
class Chain(Sampler):
    """Samplers applied in order, then one draw (``a + b`` or a list)."""

    parts: tuple[Sampler, ...]

    @property
    def draws(self) -> bool:  # type: ignore[override]
        return any(p.draws for p in self.parts)

    def process(self, logits):
        for part in self.parts:
            logits = part.process(logits)
        return logits

    def __call__(self, logits, key):
        if not self.draws:
            return Greedy()(logits, key)
        return super().__call__(logits, key)


def as_sampler(value: Any) -> Sampler:
    """``"greedy"``, a ``Sampler`` or a list of them, as one sampler."""
    if isinstance(value, Sampler):
        return value
    if value == "greedy" or value is None:
        return Greedy()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Sampler) for v in value):
        return Chain(tuple(p for v in value for p in _parts(v)))
    raise ConfigError(f"sampler must be 'greedy', an mg.sampling sampler or a list of them, "
                      f"got {value!r}")


#: Hugging Face ``generate`` arguments that a sampler expresses, in the order its
#: logits warpers run (temperature, then top-k, then top-p).
_HF_SAMPLING = {"temperature": "Temperature", "top_k": "TopK", "top_p": "TopP"}


#: What generate takes, for the nearest spelling of one it does not.
_TAKES = ("max_new_tokens", "max_length", "attention_mask", "sampler", "key", "eos_token_id",
          "pad_token_id")
_BEAMS = "beam search is not built: generate takes one token per row and step, greedy or drawn"
_PROCESSORS = ("of Hugging Face's logits processors, generate has temperature, top-k and top-p "
               "(mg.sampling); repetition and length penalties and banned words are not built")
_OUTPUTS = "generate returns the token ids; model.apply gives the logits of a sequence"
#: Hugging Face ``generate`` arguments for what mlaxgraph's does not do.
_NOT_BUILT = {**dict.fromkeys(("num_beams", "num_beam_groups", "early_stopping"), _BEAMS),
              **dict.fromkeys(("repetition_penalty", "no_repeat_ngram_size", "length_penalty",
                               "bad_words_ids", "min_new_tokens", "min_length"), _PROCESSORS),
              **dict.fromkeys(("output_scores", "return_dict_in_generate", "output_logits"),
                              _OUTPUTS)}


def refuse_unknown(function: str, unknown: dict[str, Any]) -> None:
    """A ``ConfigError`` naming arguments ``function`` does not take; Hugging Face's
    sampling arguments (``do_sample``, ``temperature``, ``top_k``, ``top_p``) are
    translated into the sampler that does what they ask."""
    if not unknown:
        return
    names = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
    parts = [f"mg.sampling.{cls}({unknown[k]!r})" for k, cls in _HF_SAMPLING.items()
             if k in unknown]
    if parts or "do_sample" in unknown:
        chain = " + ".join(parts) or "mg.sampling.Temperature(1.0)"
        hint = (f": it takes sampler= (Hugging Face's do_sample/temperature/top_k/top_p), "
                f"here sampler={chain} with key=jax.random.key(...) (the samplers run in "
                f"the order written, as Hugging Face's; add the top_k or top_p your "
                f"generation config sets; without a sampler, greedy)")
    else:
        hint = ("; it takes max_new_tokens (or max_length), attention_mask, sampler, key, "
                "eos_token_id and pad_token_id")
        missing = [_NOT_BUILT[k] for k in unknown if k in _NOT_BUILT]
        if missing:  # Hugging Face's arguments for what generate does not do
            hint += f" ({'; '.join(dict.fromkeys(missing))})"
        elif close := difflib.get_close_matches(next(iter(unknown)), _TAKES, n=1):
            hint += f" (did you mean {close[0]}?)"
    raise ConfigError(f"{function} got {names}, which it does not take{hint}")

