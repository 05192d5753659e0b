"""The JSON files ``mlaxgraph generate`` reads beside the weights or from ``--config``:
each named in its errors (a missing file, broken JSON), and a ``generation_config.json``
read strictly: a field that is not one of Hugging Face's generation settings but close
to one (``temprature``) is a ``ConfigError`` naming the one meant; another unknown field
is named in a warning (it is not read). A setting of Hugging Face's that ``mg.generate``
does not have (beam search, ``suppress_tokens``, ``min_p`` ...) is refused by name
unless it holds the value at which Hugging Face's ``generate`` does not use it."""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any

from ..core.errors import ConfigError
from ..decode.arguments import NOT_BUILT, NOT_BUILT_DRAWS
from ..models.config import read_config_json
from .loading import UsageError

__all__ = ["read_json", "read_generation_config", "refuse_unsupported", "file_count",
           "GENERATION_FIELDS"]

#: The fields of Hugging Face's GenerationConfig (``generation_config.json``).
GENERATION_FIELDS = frozenset((
    "max_length", "max_new_tokens", "min_length", "min_new_tokens", "early_stopping",
    "max_time", "stop_strings", "do_sample", "num_beams", "num_beam_groups", "penalty_alpha",
    "dola_layers", "use_cache", "cache_implementation", "cache_config", "return_legacy_cache",
    "prefill_chunk_size", "temperature", "top_k", "top_p", "min_p", "typical_p",
    "epsilon_cutoff", "eta_cutoff", "diversity_penalty", "repetition_penalty",
    "encoder_repetition_penalty", "length_penalty", "no_repeat_ngram_size", "bad_words_ids",
    "force_words_ids", "renormalize_logits", "constraints", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids", "sequence_bias",
    "token_healing", "guidance_scale", "low_memory", "watermarking_config",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate", "pad_token_id", "bos_token_id", "eos_token_id",
    "encoder_no_repeat_ngram_size", "decoder_start_token_id", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "assistant_lookbehind", "target_lookbehind", "compile_config", "disable_compile",
    "generation_kwargs", "transformers_version", "_from_model_config",
    # transformers 5's
    "top_h", "use_mtp", "max_cache_len", "speculation_type", "assistant_ensemble_weight",
    "continuous_batching_config"))


def read_json(path: str, option: str) -> Any:
    """The parsed JSON of ``path``; a missing file is a ``UsageError`` naming the option
    (exit status 2), broken JSON a ``ConfigError`` naming the file, line and column."""
    if not os.path.isfile(path):
        raise UsageError(f"{option} {path}: no such file")
    return read_config_json(path, option)


def read_generation_config(path: str) -> dict:
    """The fields of a ``generation_config.json``, checked as the module says."""
    fields = read_json(path, "generation config")
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: a generation config is a JSON object")
    for name in fields:
        if name in GENERATION_FIELDS:
            continue
        near = difflib.get_close_matches(name, sorted(GENERATION_FIELDS), n=1, cutoff=0.75)
        if near:
            raise ConfigError(f"{path}: field {name!r} (did you mean {near[0]!r}?) is not a "
                              f"Hugging Face generation setting; correct it or remove it")
        print(f"mlaxgraph generate: warning: {path}: field {name!r} is not a Hugging Face "
              f"generation setting; it is not read", file=sys.stderr)
    return fields


def refuse_unsupported(path: str, fields: dict, *, draws: bool) -> None:
    """A ``ConfigError`` naming the fields of a generation config that ask for what
    ``mg.generate`` does not do (``decode.arguments.NOT_BUILT``; ``NOT_BUILT_DRAWS``
    when the file's draw is used, ``draws``), rather than generating without them."""
    table = {**NOT_BUILT, **(NOT_BUILT_DRAWS if draws else {})}
    asked = [(name, fields[name], table[name][1]) for name in table
             if name in fields and fields[name] is not None and fields[name] not in table[name][0]]
    if asked:
        listed = "; ".join(f"{name}={value!r} ({what})" for name, value, what in asked)
        raise ConfigError(f"{path}: {listed}: mlaxgraph's generate does not do this; remove the "
                          f"field{'s' if len(asked) > 1 else ''} (or set Hugging Face's default) to "
                          f"generate without it")


def file_count(path: str, fields: dict, name: str) -> int | None:
    """The field ``name`` of a generation config as an int >= 0, or None (not set)."""
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path}: field {name!r} must be an int >= 0, got {value!r}")
    return value
