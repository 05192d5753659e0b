"""What ``mg.generate`` takes, and where Hugging Face's ``generate`` arguments go in it:
its logits processors and warpers are ``mg.sampling`` samplers, named in the message an
unknown keyword raises, rather than ignored."""

from __future__ import annotations

import difflib
from typing import Any

from ..core.errors import ConfigError

__all__ = ["refuse_unknown", "NOT_BUILT", "NOT_BUILT_DRAWS"]

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
#: Hugging Face's ``generate`` settings for what mlaxgraph's does not do: each one, the
#: values at which Hugging Face's does not use it (None always), and what it asks for
#: (beam search's other settings are read with num_beams > 1 only).
NOT_BUILT: dict[str, tuple[tuple[Any, ...], str]] = {
    "num_beams": ((1,), "beam search"),
    "constraints": ((), "constrained beam search"),
    "force_words_ids": ((), "constrained beam search"),
    "num_return_sequences": ((1,), "several sequences per prompt"),
    "penalty_alpha": ((0,), "contrastive search"),
    "dola_layers": ((), "DoLa decoding"),
    "guidance_scale": ((1,), "classifier-free guidance"),
    "token_healing": ((False,), "token healing"),
    "stop_strings": (([],), "stop strings (stop tokens are eos_token_id)"),
    "max_time": ((), "a time limit"),
    "suppress_tokens": (([],), "suppressed tokens"),
    "begin_suppress_tokens": (([],), "tokens suppressed at the first step"),
    "sequence_bias": (({}, []), "a bias of token sequences"),
    "forced_bos_token_id": ((), "a forced first token"),
    "forced_eos_token_id": ((), "a forced last token"),
    "forced_decoder_ids": (([],), "forced tokens"),
    "exponential_decay_length_penalty": ((), "a length penalty"),
    "watermarking_config": ((), "watermarking"),
}
#: Hugging Face's drawing settings that mlaxgraph's generate does not have (read with
#: ``do_sample`` only), as ``NOT_BUILT``.
NOT_BUILT_DRAWS: dict[str, tuple[tuple[Any, ...], str]] = {
    "min_p": ((), "min-p sampling"),
    "top_h": ((), "top-h sampling"),
    "typical_p": ((1,), "typical sampling"),
    "epsilon_cutoff": ((0,), "epsilon sampling"),
    "eta_cutoff": ((0,), "eta sampling"),
}
_OUTPUTS = "generate returns the token ids; model.apply gives the logits of a sequence"
_BEAMS = ("beam search is not built (length_penalty scores beams): generate takes one token "
          "per row and step, greedy or drawn")


def _not_built(name: str) -> str | None:
    """Why ``generate`` does not take Hugging Face's argument ``name``, if it is one for
    what it does not do."""
    if name in ("output_scores", "return_dict_in_generate", "output_logits"):
        return _OUTPUTS
    if name in ("num_beam_groups", "early_stopping", "length_penalty"):  # read with num_beams > 1
        return _BEAMS
    entry = NOT_BUILT.get(name) or NOT_BUILT_DRAWS.get(name)
    if entry is None:
        return None
    if entry[1].startswith("beam search"):
        return _BEAMS
    return f"{entry[1]} ({name}) is not built"


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
    if given.get("min_new_tokens") is not None:  # Hugging Face's precedence over min_length
        active.pop("min_length", None)
    parts = [f"mg.sampling.{cls}({active[k]!r})" for k, cls in _HF_SAMPLING.items()
             if k in active and (sample or k not in _WARPERS)]
    # the others given, which no sampler stands for
    rest = [k for k in given if k not in _HF_SAMPLING and k != "do_sample"]
    ignored = [k for k in _WARPERS if k in active and not sample]
    draws = sample
    if not parts and not draws and not rest and (ignored or "do_sample" in given
                                                 or set(given) <= set(_HF_SAMPLING)):
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
        if "min_new_tokens" in given and given.get("min_length") not in (None, 0):
            hint += (f"; min_length={given['min_length']!r} is left out: Hugging Face's "
                     f"min_new_tokens takes precedence over it")
        if rest:  # not dropped from the translation unsaid
            hint += "; " + "; ".join(_not_built(k) or f"{k} is not an argument of generate"
                                     for k in rest)
    else:
        hint = ("; it takes max_new_tokens (or max_length), attention_mask, sampler, key, "
                "eos_token_id and pad_token_id")
        missing = [why for k in unknown if (why := _not_built(k)) is not None]
        if missing:  # Hugging Face's arguments for what generate does not do
            hint += f" ({'; '.join(dict.fromkeys(missing))})"
        elif close := difflib.get_close_matches(next(iter(unknown)), _TAKES + tuple(_HF_SAMPLING), n=1):
            hint += (f" (did you mean {close[0]}?)" if close[0] in _TAKES else
                     f" (did you mean Hugging Face's {close[0]}? here sampler="
                     f"mg.sampling.{_HF_SAMPLING[close[0]]}(...))")
    raise ConfigError(f"{function} got {names}, which it does not take{hint}")
