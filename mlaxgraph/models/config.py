"""A model's configuration: the original config's fields as a dict (what Hugging Face's
``config.to_dict()`` or a checkpoint's ``config.json`` gives), read with defaults, and
checked strictly: a ``model_type`` of another family, a field the builder neither reads
nor knows to be harmless (a typo such as ``n_layers``) and a field the builder cannot
honour are each a ``ConfigError`` naming it.

Each family declares its fields once (``Family``): the defaults it reads, the fields it
checks against the values it implements, and the fields it knows to be harmless (token
ids, the original classes' names, generation settings, fields of other heads).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import ConfigError

__all__ = ["Config", "Family", "COMMON_HARMLESS", "read_config_json"]

#: Fields of every Hugging Face config (``PretrainedConfig``) that change nothing in the
#: graph: the original classes' and tokenizer's names, token ids, output switches,
#: generation settings older files hold, labels of task heads.
COMMON_HARMLESS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "name_or_path", "_commit_hash", "_attn_implementation",
    "_attn_implementation_autoset", "attn_implementation", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "id2label", "label2id",
    "num_labels", "problem_type", "finetuning_task", "task_specific_params",
    "tokenizer_class", "prefix", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_return_dict", "use_cache", "is_encoder_decoder", "tie_encoder_decoder",
    "chunk_size_feed_forward", "pruned_heads", "tf_legacy_loss", "use_bfloat16",
    "gradient_checkpointing", "cross_attention_hidden_size", "quantization_config",
    # generation settings (older config.json files hold them; generation reads its own)
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})


@dataclasses.dataclass(frozen=True)
class Family:
    """What a builder reads from a config.

    Attributes:
      name: the builder's name (``"gpt2"``), used in errors.
      model_types: the ``model_type`` values the builder builds (a config of another
        type is an error naming both).
      defaults: the fields the builder reads, with the original config class's defaults.
      checked: fields whose other values the builder does not implement -> the values
        it does (the original's default first); absent is fine.
      harmless: fields of this family's configs that change nothing in the graph (on
        top of ``COMMON_HARMLESS``).
    """

    name: str
    model_types: tuple[str, ...]
    defaults: Mapping[str, Any]
    checked: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    harmless: frozenset[str] = frozenset()

    def known(self) -> set[str]:
        return set(self.defaults) | set(self.checked) | set(self.harmless) | COMMON_HARMLESS


def read_config_json(path: str | os.PathLike, what: str) -> Any:
    """The parsed JSON of ``path`` (a file, or a folder holding ``config.json``); a
    missing file or broken JSON is a ``ConfigError`` naming the file (and the line and
    column of the break)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        folder, path = path, os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise ConfigError(f"{what}: the folder {folder} has no config.json (a checkpoint "
                              f"folder holds one beside its weights)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read the config {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: the config {path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what}: {path} line {e.lineno} column {e.colno}: not valid "
                          f"JSON ({e.msg})") from None


class Config:
    """The fields of ``fields`` (a mapping, a path to a ``config.json`` or a folder
    holding one) over the family's defaults, checked: ``model_type`` must be one the
    family builds; every field must be read, checked or known harmless.

    Example:
      >>> f = Family("gpt2", ("gpt2",), {"n_embd": 768, "n_head": 12})
      >>> c = Config(f, {"n_embd": 64})
      >>> c["n_embd"], c["n_head"]
      (64, 12)
    """

    def __init__(self, family: Family, fields: Mapping[str, Any] | str | os.PathLike | None):
        self.family = family
        self.model = model = family.name
        if isinstance(fields, (str, os.PathLike)):
            fields = read_config_json(fields, model)
        if fields is None:
            fields = {}
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{model}: the config is a dict of the original config's fields "
                              f"(config.to_dict() or config.json), got {type(fields).__name__}")
        model_type = fields.get("model_type")
        if model_type is not None and model_type not in family.model_types:
            raise ConfigError(f"{model}: the config's model_type is {model_type!r}, but "
                              f"mg.models.{model} builds model_type "
                              f"{' or '.join(map(repr, family.model_types))}; build it with its "
                              f"own builder")
        known = family.known()
        unknown = sorted(str(k) for k in fields if k not in known)
        if unknown:
            hints = []
            for name in unknown:
                near = difflib.get_close_matches(name, sorted(known - COMMON_HARMLESS), n=2, cutoff=0.7)
                hints.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""))
            raise ConfigError(f"{model}: the config has field{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(hints)} that mg.models.{model} neither reads nor knows "
                              f"to be harmless; remove {'them' if len(unknown) > 1 else 'it'}")
        self.given = dict(fields)
        self.fields = {**family.defaults,
                       **{k: v for k, v in fields.items() if v is not None or k not in family.defaults}}
        for name, allowed in family.checked.items():
            self.unsupported(name, *allowed)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise ConfigError(f"{self.model}: the config has no field {name!r}") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def positive_int(self, name: str) -> int:
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.model}: config field {name!r} must be a positive int, "
                              f"got {value!r}")
        return value

    def number(self, name: str, low: float = 0.0, high: float = float("inf")) -> float:
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
            raise ConfigError(f"{self.model}: config field {name!r} must be a number in "
                              f"[{low}, {high}), got {value!r}")
        return float(value)

    def choice(self, name: str, supported: Iterable[Any]) -> Any:
        """The field's value, which must be one of ``supported``."""
        value, supported = self[name], list(supported)
        if value not in supported:
            raise ConfigError(f"{self.model}: config field {name!r} = {value!r} is not "
                              f"supported; supported: {', '.join(repr(s) for s in supported)}")
        return value

    def unsupported(self, name: str, *allowed: Any) -> None:
        """A field whose other values the builder does not implement: absent, or one of
        ``allowed`` (the original's default)."""
        if name in self.fields and self.fields[name] not in allowed:
            raise ConfigError(f"{self.model}: config field {name!r} = {self.fields[name]!r} is "
                              f"not supported (supported: "
                              f"{', '.join(repr(a) for a in allowed)})")
