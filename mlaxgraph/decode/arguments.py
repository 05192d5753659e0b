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
                              _OUTPUTS)}


def refuse_unknown(function: str, unknown: dict[str, Any]) -> None:
    """A ``ConfigError`` naming arguments ``function`` does not take; Hugging Face's
    logits processors and warpers (``repetition_penalty``, ``no_repeat_ngram_size``,
    ``bad_words_ids``, ``min_length``, ``min_new_tokens``, ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``) are translated into the sampler that does
    what they ask."""
    if not unknown:
        return
    names = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
    greedy = "do_sample" in unknown and not unknown["do_sample"]  # Hugging Face then drops
    parts = [f"mg.sampling.{cls}({unknown[k]!r})" for k, cls in _HF_SAMPLING.items()
             if k in unknown and not (greedy and k in _WARPERS)]  # temperature, top_k, top_p
    draws = not greedy and ("do_sample" in unknown or any(k in unknown for k in _WARPERS))
    if greedy and not parts:
        raise ConfigError(f"{function} got {names}, which it does not take: Hugging Face's "
                          f"do_sample=False is greedy decoding, generate's default (no sampler "
                          f"or sampler='greedy'; no key)")
    if parts or draws:
        if draws and not any(k in unknown for k in _WARPERS):
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
        elif close := difflib.get_close_matches(next(iter(unknown)), _TAKES, n=1):
            hint += f" (did you mean {close[0]}?)"
    raise ConfigError(f"{function} got {names}, which it does not take{hint}")
