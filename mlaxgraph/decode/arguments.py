"""What ``mg.generate`` takes, and where Hugging Face's ``generate`` arguments go in it:
its logits processors and warpers are ``mg.sampling`` samplers, named in the message an
unknown keyword raises, rather than ignored."""

from __future__ import annotations

import difflib
from typing import Any

from ..core.errors import ConfigError

__all__ = ["refuse_unknown"]

#: Hugging Face ``generate`` arguments that a sampler expresses, in the order its logits
#: processors, then its warpers, run.
_HF_SAMPLING = {"repetition_penalty": "RepetitionPenalty", "no_repeat_ngram_size": "NoRepeatNGram",
                "bad_words_ids": "BadWords", "min_length": "MinLength",
                "min_new_tokens": "MinNewTokens", "temperature": "Temperature", "top_k": "TopK",
                "top_p": "TopP"}
_WARPERS = ("temperature", "top_k", "top_p")

#: What generate takes, for the nearest spelling of one it does not.
_TAKES = ("max_new_tokens", "max_length", "attention_mask", "sampler", "key", "eos_token_id",
          "pad_token_id")
_BEAMS = ("beam search is not built (length_penalty scores beams): generate takes one token "
          "per row and step, greedy or drawn")
_OUTPUTS = "generate returns the token ids; model.apply gives the logits of a sequence"
#: Hugging Face ``generate`` arguments for what mlaxgraph's does not do.
_NOT_BUILT = {**dict.fromkeys(("num_beams", "num_beam_groups", "early_stopping", "length_penalty"),
                              _BEAMS),
              **dict.fromkeys(("output_scores", "return_dict_in_generate", "output_logits"),
                              _OUTPUTS),
              **dict.fromkeys(("forced_eos_token_id", "forced_bos_token_id"),
                              "forcing a token at a position is not built")}
#: The values of Hugging Face's processors and warpers that leave the logits as they are.
_NO_EFFECT = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
              "min_new_tokens": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def refuse_unknown(function: str, unknown: dict[str, Any]) -> None:
    """A ``ConfigError`` naming arguments ``function`` does not take; Hugging Face's
    logits processors and warpers (``repetition_penalty``, ``no_repeat_ngram_size``,
    ``bad_words_ids``, ``min_length``, ``min_new_tokens``, ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``) are translated into the sampler that does
    what they ask."""
    if not unknown:
        return
    # None is Hugging Face's unset (a generation config's to_dict() holds dozens)
    given = {k: v for k, v in unknown.items() if v is not None} or unknown
    names = ", ".join(f"{k}={v!r}" for k, v in given.items())
    if len(given) < len(unknown):
        names += f" (and {len(unknown) - len(given)} more set to None)"
    active = {k: v for k, v in given.items()
              if k in _HF_SAMPLING and v is not None and v != _NO_EFFECT.get(k)}
    sample = bool(given.get("do_sample"))  # Hugging Face's warpers act with do_sample=True only
    parts = [f"mg.sampling.{cls}({active[k]!r})" for k, cls in _HF_SAMPLING.items()
             if k in active and (sample or k not in _WARPERS)]
    ignored = [k for k in _WARPERS if k in active and not sample]
    draws = sample
    if not parts and not draws and (ignored or "do_sample" in given or set(given) <= set(_HF_SAMPLING)):
        note = (f" (Hugging Face ignores {', '.join(ignored)} without do_sample=True)"
                if ignored else "")
        raise ConfigError(f"{function} got {names}, which it does not take: as Hugging Face "
                          f"reads them, this is greedy decoding{note}, generate's default (no "
                          f"sampler or sampler='greedy'; no key); to draw, pass "
                          f"sampler=mg.sampling.Temperature(...) and key=jax.random.key(...)")
    if parts or draws:
        if draws and not any(k in active for k in _WARPERS):
            parts.append("mg.sampling.Temperature(1.0)")
        key = " with key=jax.random.key(...)" if draws else ""
        hint = (f": it takes sampler= (Hugging Face's logits processors and do_sample, "
                f"temperature, top_k, top_p), here sampler={' + '.join(parts)}{key} (the "
                f"samplers run in the order written, as Hugging Face's: penalties first; add "
                f"the top_k or top_p your generation config sets; without a drawing sampler, "
                f"the most likely token)")
    else:
        hint = ("; it takes max_new_tokens (or max_length), attention_mask, sampler, key, "
                "eos_token_id and pad_token_id")
        missing = [_NOT_BUILT[k] for k in unknown if k in _NOT_BUILT]
        if missing:  # Hugging Face's arguments for what generate does not do
            hint += f" ({'; '.join(dict.fromkeys(missing))})"
        elif close := difflib.get_close_matches(next(iter(unknown)), _TAKES + tuple(_HF_SAMPLING), n=1):
            hint += (f" (did you mean {close[0]}?)" if close[0] in _TAKES else
                     f" (did you mean Hugging Face's {close[0]}? here sampler="
                     f"mg.sampling.{_HF_SAMPLING[close[0]]}(...))")
    raise ConfigError(f"{function} got {names}, which it does not take{hint}")
