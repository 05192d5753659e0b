"""PEFT's LoRA adapters: the adapted graph from a folder's ``adapter_config.json``
(``lora_from_peft``), and a folder PEFT loads from an adapted graph's weights
(``save_adapter``). The weights themselves go through ``load_state_dict(...,
adapter=folder)`` and ``to_state_dict(..., adapter_only=True)``.

A module's name is what PyTorch calls it: the layer's path with dots
(``h.0.mlp.c_fc``), an attention projection under the name the checkpoint family gives
it (``h.0.attn.c_attn`` for GPT-2's fused query-key-value, ``model.layers.0.self_attn.q_proj``
for Llama's), the model class's prefix in front where the family has one
(``transformer.`` for GPT-2) when ``target_modules`` is a regular expression.
"""

from __future__ import annotations

import collections
import difflib
import json
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..adapters.lora import lora
from ..core.errors import AdapterWarning, ConfigError, GraphError, SerializationError
from ..core.signatures import unknown_keywords
from ..io.weights import write_atomic, write_safetensors
from ..ir.graph import Graph
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths
from ..ops.attention import MultiHeadAttention
from ..ops.embedding import Embedding
from ..ops.initializers import zeros
from .arguments import LORA_FROM_PEFT_HINTS, LORA_FROM_PEFT_SIGNATURE, SAVE_ADAPTER_SIGNATURE, TASK_TYPES
from .peft_config import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    DESCRIPTIVE,
    _saves,
    keeps_out,
    read_adapter_config,
)
from .peft_targets import (
    ADAPTABLE_OPS,
    LINEAR_OPS,
    all_linear_excluded,
    check_names,
    check_tied_heads,
    dilated_conv,
    near_names,
    peft_modules,
    seq_cls_extras,
)
from .state_dict import PEFT_PREFIX, to_state_dict
from .torch_layout import layout_for, unnamed_projection

__all__ = ["lora_from_peft", "save_adapter", "peft_modules", "adapted_modules", "check_adapter_config"]

def lora_from_peft(graph: Graph, folder: Any = None, **unknown: Any) -> Graph:
    """``graph`` with the LoRA adapters a PEFT folder's ``adapter_config.json``
    describes: ``target_modules`` (a list of module names, matched as PEFT matches them:
    the whole name or its last dotted parts; a regular expression matching whole names;
    or ``"all-linear"``: every Linear and attention projection but the output
    embeddings, ``lm_head``, as PEFT leaves them out),
    minus ``exclude_modules``; ``r``, ``lora_alpha``, ``rank_pattern``,
    ``alpha_pattern``, ``lora_dropout``, ``use_rslora``, ``init_lora_weights`` (how a
    fresh ``init`` draws the adapters: ``mg.lora``'s ``init_weights``). ``modules_to_save`` must name
    modules of the graph, or modules holding them (``load_state_dict(..., adapter=folder)``
    reads their weights); as PEFT, a module it names gets no adapter.
    Then ``mg.models.load_state_dict(adapted, base, adapter=folder)`` gives the weights.

    ``folder`` may also be the config itself, a dict of its fields (``json.load`` of
    the file, or PEFT's ``LoraConfig(...).to_dict()``).

    A field asking for what LoRA here does not do, an entry of ``modules_to_save`` that
    names no module, an ``exclude_modules`` that leaves nothing to adapt, or a target
    that is not a Linear, Conv, Embedding or attention projection is an
    ``mg.ConfigError`` naming it. An entry of ``target_modules`` or ``exclude_modules``
    that names no module, and a key of ``rank_pattern`` or ``alpha_pattern`` that
    matches no adapted module, are ignored as PEFT ignores them, with an
    ``mg.AdapterWarning`` naming them (a typo, or a list written for several model
    families).
    """
    if unknown:
        raise ConfigError(unknown_keywords("lora_from_peft", unknown, LORA_FROM_PEFT_SIGNATURE,
                                           LORA_FROM_PEFT_HINTS))
    if folder is None:
        raise ConfigError(f"lora_from_peft needs the adapter's folder (or its config as a "
                          f"dict); it takes {LORA_FROM_PEFT_SIGNATURE}")
    if not isinstance(graph, Graph):
        raise GraphError(f"lora_from_peft works on a Graph, got {type(graph).__name__}")
    config = read_adapter_config(folder)
    layout = layout_for(graph.name)
    modules = peft_modules(graph)
    keys = list(modules)

    def full(key: str) -> tuple[str, ...]:
        # the files' names, and transformers 5.x's in memory (ViT's layers.0.attention.q_proj),
        # which PEFT writes under it
        forms = tuple(dict.fromkeys((key, layout.memory_name(key))))
        return tuple(layout.model_prefix + f for f in forms) + forms if layout.model_prefix else forms

    if isinstance(config.target_modules, str) and config.target_modules.lower() == "all-linear":
        heads = all_linear_excluded(layout, keys, config.fields.get("task_type"))
        wanted = [k for k, (path, op) in modules.items()
                  if (op in LINEAR_OPS and k not in heads) or op == "attention"]
    else:
        wanted = [k for k in keys if any(config.selects(n) for n in full(k))]
        check_tied_heads(config, layout, modules, graph)
        check_names(config, "target_modules", config.target_modules, keys, full, graph)
    check_names(config, "exclude_modules", config.exclude_modules, keys, full, graph)
    # PEFT's rules: no adapter on what exclude_modules or modules_to_save names
    chosen = [k for k in wanted if not any(config.excludes(n) or keeps_out(config.modules_to_save, n)
                                           for n in full(k))]
    if wanted and not chosen:
        removers = " and ".join(f"{field} {value!r}" for field, value in (
            ("exclude_modules", config.exclude_modules), ("modules_to_save", list(config.modules_to_save)))
            if any((config.excludes(n) if field == "exclude_modules" else keeps_out(value, n))
                   for k in wanted for n in full(k)))
        raise ConfigError(f"{config.path}: {removers} remove{'s' if ' and ' not in removers else ''} "
                          f"all {len(wanted)} modules that target_modules "
                          f"{config.target_modules!r} selects ({', '.join(wanted[:4])}"
                          f"{', ...' if len(wanted) > 4 else ''}); nothing would be adapted")
    if not chosen:
        raise ConfigError(f"{config.path}: target_modules {config.target_modules!r} matches no "
                          f"module of graph {graph.name!r}; modules such as "
                          f"{', '.join(keys[:6])}")
    targeted = [name for k in chosen for name in full(k)]
    unmatched = [f"{field} key {pattern!r}" + (f" ({near[2:]})" if (near := near_names(pattern, chosen)) else "")
                 for field, pattern in config.unmatched_patterns(targeted)]
    if unmatched:
        warnings.warn(f"{config.path}: {'; '.join(unmatched)}: matches none of the adapted "
                      f"modules (as PEFT matches it: the end of a name, at a dot), so it is "
                      f"ignored, as PEFT ignores it", AdapterWarning, stacklevel=2)
    shared = {n.layer for n in unfold_scans(graph).nodes if n.shares_weights}
    def save_names(name: str) -> list[str]:   # PEFT's rule, as config.saves reads it
        return [k for k in keys if any(_saves((name,), n) for n in full(k))]

    extras = seq_cls_extras(config.modules_to_save, lambda name: bool(save_names(name)))
    for name in config.modules_to_save:
        saved = save_names(name)
        if name in extras:
            continue
        if not saved:
            tied = [b for a, b in layout.tied if a.startswith(name + ".")]
            raise ConfigError(f"{config.path}: modules_to_save names {name!r}, which is no module "
                              f"of graph {graph.name!r}" + (
                                  f" (its output head is tied to {tied[0]!r}: the head's weights "
                                  f"are the embedding's)" if tied else near_names(name, keys)))
        parts = [k for k in saved if modules[k][1] == "attention"
                 and not any(_saves((name,), n) for n in full(k.rsplit(".", 1)[0]))]
        if parts:
            raise ConfigError(f"{config.path}: modules_to_save names {name!r}, a projection of "
                              f"the attention {modules[parts[0]][0].rsplit('/', 1)[0]!r}, which "
                              f"is one layer here: PEFT trains a copy of that projection alone, "
                              f"which the layer cannot hold apart (name the attention module, "
                              f"{parts[0].rsplit('.', 1)[0].rsplit('.', 1)[-1]!r}, to save all of it)")
        tied_saved = [k for k in saved if modules[k][0] in shared]
        if tied_saved:
            raise ConfigError(f"{config.path}: modules_to_save names {name!r}, whose weights graph "
                              f"{graph.name!r} calls twice ({tied_saved[0]!r} is the embedding and "
                              f"the tied output head). PEFT trains a copy for the embedding alone "
                              f"and keeps the head's weights, which one shared layer cannot hold "
                              f"apart: its outputs would differ from PEFT's")
    nodes = dict(layer_paths(unfold_scans(graph)))
    for key in chosen:
        path, op = modules[key]
        if op not in ADAPTABLE_OPS and op != "attention":
            raise ConfigError(f"{config.path}: target_modules selects {key!r} (layer {path!r}, "
                              f"op {op}); LoRA adapts Linear, Conv, Embedding and attention "
                              f"projections")
        if path in nodes and (why := dilated_conv(path, nodes[path].op)):
            raise ConfigError(f"{config.path}: target_modules selects {key!r}: {why}")
    groups: dict[tuple[int, float], list[str]] = collections.defaultdict(list)
    for key in chosen:
        groups[(config.rank_of(full(key)), config.alpha_of(full(key)))].append(modules[key][0])
    adapted = graph
    for (rank, alpha), paths in groups.items():
        adapted = lora(adapted, paths, rank=rank, alpha=alpha, dropout=config.lora_dropout,
                       use_rslora=config.use_rslora, init_weights=config.init_lora_weights)
    return adapted


def adapted_modules(graph: Graph, where: str) -> dict[str, tuple[str, int, float]]:
    """Each LoRA adapter of ``graph`` by the full name of the module it adapts (the
    model class's prefix in front): ``(its target's path, rank, scale)``."""
    layout = layout_for(graph.name)
    nodes = dict(layer_paths(unfold_scans(graph)))
    modules = {path: key for key, (path, _) in peft_modules(graph).items()}
    out: dict[str, tuple[str, int, float]] = {}
    for path, node in nodes.items():
        if not path.endswith(".lora_A"):
            continue
        target = path[: -len(".lora_A")]
        key = modules.get(target) or modules.get(target.rpartition(".")[0] + "/" + target.rpartition(".")[2])
        if key is None:
            owner, _, projection = target.rpartition(".")
            if isinstance(getattr(nodes.get(owner), "op", None), MultiHeadAttention):
                raise SerializationError(f"{where}: " + unnamed_projection(
                    path, owner, projection, dict(layout.attention)))
            raise SerializationError(f"{where}: the adapter {path!r} adapts no module PEFT can name")
        scale = nodes[target + ".lora_scale"].op.constant  # type: ignore[attr-defined]
        out[layout.model_prefix + key] = (target, int(node.op.features),  # type: ignore[attr-defined]
                                          float(scale))
    return out


def check_adapter_config(graph: Graph, config: Any) -> None:
    """A ``ConfigError`` when the adapters of ``graph`` are not those an adapter
    folder's config describes (another rank, ``lora_alpha`` or ``use_rslora`` for a
    module): its weights would load, and compute with another scale than PEFT's."""
    layout = layout_for(graph.name)
    for name, (target, rank, scale) in adapted_modules(graph, "load_state_dict").items():
        bare = name[len(layout.model_prefix):]
        names = (name, layout.model_prefix + layout.memory_name(bare), bare, layout.memory_name(bare))
        want_rank, alpha = config.rank_of(names), config.alpha_of(names)
        want = alpha / (want_rank ** 0.5 if config.use_rslora else want_rank)
        if want_rank != rank or not np.isclose(want, scale, rtol=1e-6, atol=0):
            raise ConfigError(
                f"{config.path}: the adapter of {name!r} is r={want_rank}, lora_alpha={alpha:g}"
                f"{', use_rslora' if config.use_rslora else ''} (scale {want:g}), but graph "
                f"{graph.name!r} adapts it with rank {rank} and scale {scale:g} ({target!r}): "
                f"build the graph from this folder, mg.lora_from_peft(base_graph, folder)")


def _in_memory(layout: Any, name: str) -> str:
    """A module or weight name, the model class's prefix in front, as transformers 5.x
    holds it in memory (``TorchLayout.memory_name``)."""
    prefix = layout.model_prefix if name.startswith(layout.model_prefix) else ""
    return prefix + layout.memory_name(name[len(prefix):])


def _one_dropout(dropouts: dict[float, list[str]], given: Any) -> float:
    """The ``lora_dropout`` to write: ``given``, or the adapters' one dropout."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, float)) \
                or not 0.0 <= given < 1.0:
            raise SerializationError(f"save_adapter: lora_dropout must be a number in [0, 1), "
                                     f"got {given!r}")
        return float(given)
    if len(dropouts) > 1:
        listed = "; ".join(f"{rate:g} on {', '.join(keys[:2])}{', ...' if len(keys) > 2 else ''}"
                           for rate, keys in sorted(dropouts.items()))
        raise SerializationError(
            f"save_adapter: the adapters have different dropouts ({listed}), and PEFT's "
            f"adapter_config.json has one lora_dropout for every module (no per-module "
            f"pattern); pass lora_dropout= to write one of them (dropout acts in training "
            f"only), or adapt with one dropout")
    return next(iter(dropouts), 0.0)


def _init_weights(nodes: Mapping, target: str) -> bool | str:
    """PEFT's ``init_lora_weights`` for the adapter of ``target`` (``mg.lora``'s
    ``init_weights``), read off its initializers: ``"gaussian"`` draws ``A`` normal, False
    draws ``B`` (a Linear's or Conv's) or ``A`` (an Embedding's) instead of zeros."""
    a, b = nodes[target + ".lora_A"].op, nodes[target + ".lora_B"].op
    if isinstance(a, Embedding):
        return a.embedding_init is zeros
    if getattr(a.kernel_init, "family", None) == "normal":
        return "gaussian"
    return b.kernel_init is zeros


def save_adapter(graph: Graph, params: Any, folder: Any, *,
                 base_model_name_or_path: str | None = None,
                 lora_dropout: float | None = None, modules_to_save: Any = None,
                 state: Any = None, task_type: str | None = None, like: Any = None,
                 **unknown: Any) -> None:
    """Writes the LoRA adapters of ``graph`` (made by ``mg.lora`` or
    ``mg.lora_from_peft``) with their weights ``params`` (the adapted graph's, unscanned)
    as a PEFT adapter folder: ``adapter_model.safetensors`` (PEFT's names and layouts,
    each file written atomically) and ``adapter_config.json`` (``target_modules`` the
    adapted modules by full name, ``r`` and ``lora_alpha`` the most common ones and
    ``rank_pattern``/``alpha_pattern`` the others, ``lora_dropout`` the adapters'
    dropout, ``init_lora_weights`` how ``mg.lora``'s ``init_weights`` drew them).
    ``PeftModel.from_pretrained(model, folder)`` loads it.

    PEFT has one ``lora_dropout`` for every module (no per-module pattern, as for ranks
    and alphas), so adapters with different dropouts are an ``mg.SerializationError``
    naming them, unless ``lora_dropout=`` gives the one value to write (dropout acts in
    training only; the weights are written as they are). An Embedding's adapter has no
    dropout (its input is ids) and does not count.

    ``modules_to_save`` (PEFT's names: ``["lm_head"]``) writes those modules' full
    weights from ``params`` (and ``state``) with the adapters', and the field.
    ``like``, the folder (or config dict) the adapter was read from, carries its
    ``modules_to_save`` and its descriptive fields (``base_model_name_or_path``,
    ``task_type``, ``revision`` ...) over: ``save_adapter(graph, params, out,
    like=folder)`` writes a folder like the one ``lora_from_peft`` read. The keywords
    given override it.
    """
    if unknown:
        raise ConfigError(unknown_keywords("save_adapter", unknown, SAVE_ADAPTER_SIGNATURE))
    if task_type is not None and task_type not in TASK_TYPES:
        near = difflib.get_close_matches(str(task_type), TASK_TYPES, n=1, cutoff=0.4)
        raise ConfigError(f"save_adapter: task_type must be one of PEFT's {', '.join(TASK_TYPES)}"
                          f", got {task_type!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    if not isinstance(graph, Graph) or not isinstance(params, Mapping):
        raise GraphError(f"save_adapter(graph, params, folder) takes the adapted Graph and its "
                         f"params (a dict), got {type(graph).__name__} and "
                         f"{type(params).__name__}")
    graph = unfold_scans(graph)   # a scanned model's graph (model.graph) writes as its own
    layout = layout_for(graph.name)
    nodes = dict(layer_paths(graph))
    settings: dict[str, tuple[int, float]] = {}
    dropouts: dict[float, list[str]] = collections.defaultdict(list)
    for name, (target, rank, scale) in adapted_modules(graph, "save_adapter").items():
        if target in nodes and (why := dilated_conv(target, nodes[target].op)):
            raise SerializationError(f"save_adapter: {why}")
        settings[name] = (rank, scale * rank)
        drop = nodes.get(target + ".lora_dropout")
        if not isinstance(getattr(nodes.get(target), "op", None), Embedding):
            rate = 0.0 if drop is None else float(drop.op.rate)  # type: ignore[attr-defined]
            dropouts[rate].append(name)
    if not settings:
        raise SerializationError(f"save_adapter: graph {graph.name!r} has no LoRA adapters")
    dropout = _one_dropout(dropouts, lora_dropout)
    inits = collections.Counter(_init_weights(nodes, path[: -len(".lora_A")])
                                for path in nodes if path.endswith(".lora_A"))
    carried = {} if like is None else {k: v for k, v in read_adapter_config(like).fields.items()
                                       if k in DESCRIPTIVE | {"modules_to_save"}}
    if modules_to_save is None:
        modules_to_save = carried.get("modules_to_save") or None
    saved_names = modules_to_save or ()
    if isinstance(saved_names, (list, tuple)) and all(isinstance(n, str) for n in saved_names):
        # PEFT's sequence classification folders name both classifier and score
        written = [layout.model_prefix + k for k in peft_modules(graph)]
        extras = seq_cls_extras(saved_names, lambda name: any(_saves((name,), n) for n in written))
        saved_names = [n for n in saved_names if n not in extras]
    weights = to_state_dict(graph, params, state, adapter_only=True, modules_to_save=saved_names)
    # transformers 5.x holds some models' modules under other names than its files write
    # (ViT's layers.0.attention.q_proj for encoder.layer.0.attention.attention.query), and
    # PEFT under it names them so: the folder does too (lora_from_peft reads both)
    settings = {_in_memory(layout, name): value for name, value in settings.items()}
    weights = {PEFT_PREFIX + _in_memory(layout, name[len(PEFT_PREFIX):])
               if name.startswith(PEFT_PREFIX) else name: value for name, value in weights.items()}
    (rank, alpha), _ = collections.Counter(settings.values()).most_common(1)[0]
    # PEFT matches a listed name at the end of a module's (".conv1" in "layer1.0.conv1"):
    # where that takes in a module not adapted, the names go as one regular expression
    # of whole names, and a pattern's key from the start ("^conv1")
    names = [_in_memory(layout, layout.model_prefix + k) for k in peft_modules(graph)]
    others = [name for name in names if name not in settings]
    clash = {n for n in settings if any(o.endswith("." + n) for o in others)}
    targets: Any = sorted(settings)
    if clash:
        targets = "(" + "|".join(re.escape(n) for n in targets) + ")"
    # a rank_pattern or alpha_pattern key matches the end of every name, adapted or not:
    # conv1's would give every layer*.conv1 its rank too
    ends = {n for n in settings if any(o.endswith("." + n) for o in names)}

    def key(name: str) -> str:
        return ("^" if name in ends else "") + re.escape(name)

    given = {"base_model_name_or_path": base_model_name_or_path, "task_type": task_type}
    config = {
        **carried, **{k: v for k, v in given.items() if v is not None or k not in carried},
        "peft_type": "LORA",
        "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
        "target_modules": targets, "use_rslora": False,
        "fan_in_fan_out": layout.linear == "in_out", "bias": "none",
        "modules_to_save": list(modules_to_save) if modules_to_save else None,
        "rank_pattern": {key(k): r for k, (r, _) in settings.items() if r != rank},
        "alpha_pattern": {key(k): a for k, (_, a) in settings.items() if a != alpha},
        # one value for the file (PEFT has no per-module one): the most common
        "init_lora_weights": inits.most_common(1)[0][0], "use_dora": False,
    }
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    arrays = {name: np.ascontiguousarray(value) for name, value in weights.items()}
    write_atomic(os.path.join(folder, ADAPTER_WEIGHTS),
                 lambda f: write_safetensors(f, arrays, {"format": "pt"}))
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    write_atomic(os.path.join(folder, ADAPTER_CONFIG), lambda f: f.write(text.encode()))

