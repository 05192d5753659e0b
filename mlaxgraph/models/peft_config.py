"""PEFT's adapter files: ``adapter_config.json`` read and checked field by field, and
which modules its ``target_modules`` names.

Every field is read: the ones LoRA's result depends on are honoured (``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``, ``exclude_modules``,
``use_rslora``, ``rank_pattern``, ``alpha_pattern``, ``modules_to_save``,
``fan_in_fan_out``, ``init_lora_weights`` where it only chooses how the adapters start:
true, false or ``"gaussian"``), the descriptive ones change nothing
(``base_model_name_or_path``, ``task_type`` ...; ``save_adapter(..., like=folder)`` writes
them back), and a field asking for something else (DoRA, a bias that trains,
``layers_to_transform``) is an ``mg.ConfigError`` naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import ConfigError

__all__ = ["AdapterConfig", "read_adapter_config", "saved_modules", "BASE_LAYER", "keeps_out",
           "base_layer_copies", "ADAPTER_CONFIG", "ADAPTER_WEIGHTS",
           "LEGACY_ADAPTER_WEIGHTS"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: What PEFT wrote before safetensors (``torch.save``), read when the above is absent.
LEGACY_ADAPTER_WEIGHTS = "adapter_model.bin"

#: Fields that describe the adapter without changing what it computes.
DESCRIPTIVE = frozenset({
    "base_model_name_or_path", "revision", "task_type", "inference_mode", "auto_mapping",
    "peft_version", "megatron_core", "qalora_group_size",
    # peft <= 0.2: whether to merge the adapters into the weights in eval mode (a speed
    # choice: the outputs are the same)
    "merge_weights",
})
#: Fields that must hold their default: any other value asks for what LoRA here does
#: not do. (The value a file may hold -> what to say.)
DEFAULTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_dora": ((False, None), "DoRA (weight-decomposed LoRA)"),
    "layers_to_transform": ((None, []), "adapting some layer indices only (name the layers "
                            "in target_modules instead)"),
    "layers_pattern": ((None, []), "a layers pattern (goes with layers_to_transform)"),
    "megatron_config": ((None,), "Megatron-sharded layers"),
    "loftq_config": ((None, {}), "LoftQ initialization"),
    "eva_config": ((None,), "EVA initialization"),
    "corda_config": ((None,), "CorDA initialization"),
    "layer_replication": ((None, []), "layer replication"),
    "runtime_config": ((None, {}, {"ephemeral_gpu_offload": False}), "runtime options"),
    "lora_bias": ((False, None), "a bias on lora_B"),
    "trainable_token_indices": ((None,), "training some token embeddings"),
    "target_parameters": ((None, []), "adapting parameters of non-linear modules"),
    "use_qalora": ((False, None), "QALoRA"),
    "alora_invocation_tokens": ((None,), "activated LoRA"),
    "arrow_config": ((None,), "Arrow routing"),
    "ensure_weight_tying": ((False, None), "tying adapters of tied weights"),
    "bias": (("none",), "training biases (bias='all' or 'lora_only')"),
}
HONOURED = frozenset({
    "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules",
    "use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out",
    "init_lora_weights",
})
#: ``init_lora_weights`` values that only choose how the adapters start (``mg.lora``'s
#: ``init_weights``); the others (``"pissa"``, ``"olora"``, ``"loftq"``, ``"eva"``,
#: ``"corda"`` ...) also change the base model's weights, which the adapter file does not
#: hold.
INIT_LORA_WEIGHTS = (True, False, "gaussian")


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """A LoRA adapter's settings, as ``adapter_config.json`` holds them."""

    path: str
    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: str | tuple[str, ...]
    exclude_modules: str | tuple[str, ...] | None
    use_rslora: bool
    rank_pattern: Mapping[str, int]
    alpha_pattern: Mapping[str, float]
    modules_to_save: tuple[str, ...]
    fan_in_fan_out: bool
    init_lora_weights: bool | str
    fields: Mapping[str, Any]

    def targets(self, key: str) -> bool:
        """Whether PEFT adapts the module ``key`` (``transformer.h.0.attn.c_attn``):
        a string is a regular expression matching the whole key; a list names modules
        by their last names (``c_attn``, or a dotted tail ``attn.c_attn``)."""
        return self.selects(key) and not self.excludes(key)

    def selects(self, key: str) -> bool:
        """Whether ``target_modules`` (a regular expression or a list, not
        ``"all-linear"``) names the module ``key``, ``exclude_modules`` aside."""
        return _names(self.target_modules, key)

    def excludes(self, key: str) -> bool:
        """Whether ``exclude_modules`` names the module ``key``."""
        return self.exclude_modules is not None and _names(self.exclude_modules, key)

    def rank_of(self, key: str | tuple[str, ...]) -> int:
        """The rank of the module ``key`` (or of the first of its names a pattern
        matches)."""
        return int(_first(self.rank_pattern, key, self.r))

    def alpha_of(self, key: str | tuple[str, ...]) -> float:
        return float(_first(self.alpha_pattern, key, self.lora_alpha))

    def unmatched_patterns(self, keys: list[str]) -> list[tuple[str, str]]:
        """The ``(field, pattern)`` of ``rank_pattern`` and ``alpha_pattern`` that match
        none of the module names ``keys`` (which PEFT would ignore)."""
        return [(field, pattern) for field in ("rank_pattern", "alpha_pattern")
                for pattern in getattr(self, field)
                if not any(_pattern({pattern: True}, key, False) for key in keys)]

    def saves(self, key: str) -> bool:
        """Whether the module ``key`` is one of ``modules_to_save`` (trained in full, its
        weights in the adapter file). PEFT's rule: the name ends with an entry, at a dot
        or not (``"norm"`` names ``model.norm`` and every ``input_layernorm``)."""
        return _saves(self.modules_to_save, key)


def saved_modules(graph_name: str, modules: list[str], prefix: str, names: Any,
                  adapter_only: bool) -> Callable[[str], bool] | None:
    """Which of the graph's ``modules`` (dotted names, ``prefix`` the checkpoint's model
    prefix) ``modules_to_save`` names, by PEFT's rule (the full name ends with an
    entry, at a dot or not), each entry checked to name one; None for none."""
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"to_state_dict: modules_to_save takes a list of module names, "
                          f"got {names!r}")
    if not names:
        return None
    if not adapter_only:
        raise ConfigError("to_state_dict: modules_to_save goes with adapter_only=True (the "
                          "state dict of the whole model holds every module already)")
    for name in names:
        if not any(_saves((name,), prefix + m) for m in modules):
            near = difflib.get_close_matches(name, modules, n=3, cutoff=0.5)
            raise ConfigError(f"to_state_dict: modules_to_save names {name!r}, which is no module "
                              f"of graph {graph_name!r}" + (f"; near names: {', '.join(near)}" if near else ""))
    return lambda module: _saves(names, prefix + module)


def _saves(names: Any, key: str) -> bool:
    """PEFT's ``modules_to_save`` rule: the module's full name, or a module's holding
    it (``h.1.mlp`` holds ``h.1.mlp.c_fc``: PEFT saves the whole of it), ends with an
    entry."""
    parts = key.split(".")
    holders = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(holder.endswith(name) for name in names for holder in holders)


def keeps_out(names: Any, key: str) -> bool:
    """PEFT's rule for a target in ``modules_to_save``: a module named by an entry, or
    inside one, gets no adapter (it is trained in full instead)."""
    return any(re.match(rf"(^|.*\.){name}($|\..*)", key) for name in names)


def _names(spec: str | tuple[str, ...], key: str) -> bool:
    if isinstance(spec, str):
        return re.fullmatch(spec, key) is not None
    return any(key == name or key.endswith("." + name) for name in spec)


def _pattern(patterns: Mapping[str, Any], key: str, default: Any) -> Any:
    """PEFT's rule: the first pattern that matches the end of the key at a name
    boundary (``(.*\\.)?<pattern>$``)."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", key):
            return value
    return default


def _first(patterns: Mapping[str, Any], names: str | tuple[str, ...], default: Any) -> Any:
    """``_pattern``'s value for the first of a module's names a pattern matches."""
    for name in (names,) if isinstance(names, str) else names:
        found = _pattern(patterns, name, _NONE)
        if found is not _NONE:
            return found
    return default


_NONE = object()


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a PEFT adapter folder holds "
                          f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}, line {e.lineno}, column {e.colno}: not JSON ({e.msg})") from None
    except (UnicodeDecodeError, IsADirectoryError, PermissionError) as e:
        raise ConfigError(f"{path}: cannot be read as JSON ({type(e).__name__})") from None


def _field_error(path: str, name: str, value: Any, problem: str) -> ConfigError:
    return ConfigError(f"{path}: field {name!r} = {value!r:.120}: {problem}")


def _number(path: str, fields: Mapping, name: str, default: Any, low: float, high: float,
            integer: bool = False) -> Any:
    value = fields.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) \
            or not math.isfinite(value) or not low <= value < high:
        kind = "an int" if integer else "a number"
        raise _field_error(path, name, value, f"must be {kind} in [{low}, {high})")
    return value


def _modules(path: str, name: str, value: Any, *, allow_regex: bool) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        if not allow_regex:
            return (value,)
        try:
            re.compile(value)
        except re.error as e:
            raise _field_error(path, name, value, f"not a regular expression ({e})") from None
        return value
    if isinstance(value, (set, frozenset)):  # PEFT's LoraConfig.to_dict() holds sets
        value = sorted(value, key=str)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise _field_error(path, name, value, "must be a list of module names or a regular expression")


#: What messages call a config given as a dict.
DICT_CONFIG = "adapter config (dict)"


def read_adapter_config(folder: Any) -> AdapterConfig:
    """The LoRA settings in ``folder``'s ``adapter_config.json`` (or that file itself),
    or in a dict of its fields (``json.load`` of the file, or PEFT's
    ``LoraConfig.to_dict()``), or in PEFT's ``LoraConfig`` itself."""
    if isinstance(folder, Mapping):
        path, fields = DICT_CONFIG, dict(folder)
        if not all(isinstance(k, str) for k in fields):
            raise ConfigError(f"{path}: its keys are the field names, strings; got "
                              f"{next(k for k in fields if not isinstance(k, str))!r}")
    elif callable(getattr(folder, "to_dict", None)):  # PEFT's LoraConfig itself
        path, fields = f"adapter config ({type(folder).__name__})", dict(folder.to_dict())
    elif isinstance(folder, (str, os.PathLike)):
        folder = os.fspath(folder)
        path = os.path.join(folder, ADAPTER_CONFIG) if os.path.isdir(folder) else folder
        if path.endswith((".safetensors", ".bin")):
            raise ConfigError(f"{path}: an adapter's weights file; give its folder (which holds "
                              f"{ADAPTER_CONFIG} beside it)")
        fields = _read_json(path)
    else:
        raise ConfigError(f"a PEFT adapter config is a folder, its {ADAPTER_CONFIG}, a dict of "
                          f"its fields or PEFT's LoraConfig; got {type(folder).__name__}")
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: an adapter config is a JSON object, got {type(fields).__name__}")
    peft_type = fields.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise _field_error(path, "peft_type", peft_type, "only LoRA adapters are read")
    for name, value in fields.items():
        if name in HONOURED or name in DESCRIPTIVE:
            continue
        if name in DEFAULTS:
            allowed, what = DEFAULTS[name]
            if not any(value == a and type(value) is type(a) for a in allowed):
                raise _field_error(path, name, value, f"asks for {what}, which mlaxgraph's LoRA "
                                   f"does not do; allowed: {', '.join(map(repr, allowed))}")
        elif value not in (None, False, {}, [], ""):
            close = difflib.get_close_matches(name, sorted(HONOURED | DESCRIPTIVE | set(DEFAULTS)), n=1)
            raise _field_error(path, name, value, "not a field mlaxgraph knows" + (
                f" (did you mean {close[0]!r}?)" if close else "") + "; it would be ignored, so "
                "it is refused (remove it if it changes nothing)")
    r = _number(path, fields, "r", 8, 1, float("inf"), integer=True)
    alpha = _number(path, fields, "lora_alpha", 8, 1e-12, float("inf"))
    dropout = _number(path, fields, "lora_dropout", 0.0, 0.0, 1.0)
    target = fields.get("target_modules")
    if target is None:
        raise _field_error(path, "target_modules", None, "the adapter names no modules (PEFT "
                           "fills it from the model type; write the module names)")
    patterns = {}
    for name, kind in (("rank_pattern", int), ("alpha_pattern", float)):
        value = fields.get(name) or {}
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                and v > 0 for k, v in value.items()):
            raise _field_error(path, name, value, "must map module patterns to positive numbers")
        if kind is int and not all(isinstance(v, int) for v in value.values()):
            raise _field_error(path, name, value, "ranks must be ints")
        for key in value:
            try:
                re.compile(key)
            except re.error as e:
                raise _field_error(path, name, value, f"key {key!r} is not a regular "
                                   f"expression ({e})") from None
        patterns[name] = value
    for name in ("use_rslora", "fan_in_fan_out"):  # null: the default, as PEFT reads it
        if not isinstance(fields.get(name) or False, bool):
            raise _field_error(path, name, fields[name], "must be true or false")
    init = fields.get("init_lora_weights", True)
    if not any(init == v and type(init) is type(v) for v in INIT_LORA_WEIGHTS):
        raise _field_error(path, "init_lora_weights", init,
                           "asks for an initialization mlaxgraph does not draw (PiSSA, OLoRA, "
                           "LoftQ, EVA and CorDA also change the base model's weights, which "
                           "the adapter file does not hold; orthogonal starts B nonzero); "
                           "allowed: " + ", ".join(map(repr, INIT_LORA_WEIGHTS)) + " (the "
                           "weights a folder holds load whatever the field says: write true "
                           "to read them)")
    return AdapterConfig(
        path=path, r=r, lora_alpha=float(alpha), lora_dropout=float(dropout),
        target_modules=_modules(path, "target_modules", target, allow_regex=True),
        exclude_modules=_modules(path, "exclude_modules", fields.get("exclude_modules"),
                                 allow_regex=True),
        use_rslora=bool(fields.get("use_rslora")),
        rank_pattern=patterns["rank_pattern"], alpha_pattern=patterns["alpha_pattern"],
        modules_to_save=_modules(path, "modules_to_save", fields.get("modules_to_save"),
                                 allow_regex=False) or (),
        fan_in_fan_out=bool(fields.get("fan_in_fan_out")), init_lora_weights=init,
        fields=fields)


#: The names of the weights of a LoRA target's own layer in an adapter file: PEFT saves
#: an Embedding target's table (``save_embedding_layers``) as ``<module>.base_layer.weight``.
BASE_LAYER = r".*\.base_layer\.[^.]+"


def base_layer_copies(weights: str) -> dict[str, Any]:
    """The target layers' own weights an adapter file holds, renamed to the base
    model's names (``<module>.base_layer.weight`` -> ``<module>.weight``): PEFT loads
    them over the base model's."""
    from .sources import StateDictSource

    source = StateDictSource(weights)
    try:
        return {re.sub(r"\.base_layer\.", ".", name): source.array(name)
                for name in source.names() if re.fullmatch(BASE_LAYER, name)}
    finally:
        source.close()
