"""State dicts: a graph's weights under the original framework's names and layouts
(torchvision's, Hugging Face's), to and from NumPy mappings and safetensors files,
without torch.

``load_state_dict`` fills every weight of the graph exactly once, from a mapping of names
to arrays, a ``.safetensors`` file or a folder of shards with its index (a missing, extra or
mis-shaped weight is a ``SerializationError`` naming it); ``to_state_dict`` gives the names
and layouts back, so that a model trained here can be served by the original code."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..adapters.quantized_weights import quantize_weights
from ..compiler.flatten import flatten
from ..compiler.program import Step, get_in, leaf_paths, set_in
from ..core.donated import refuse_deleted
from ..core.errors import ConfigError, SerializationError
from ..core.registry import lookup
from ..core.signatures import unknown_keywords
from ..core.specs import flatten_specs
from ..ir.graph import Graph
from .arguments import (
    LOAD_STATE_DICT_HINTS,
    LOAD_STATE_DICT_SIGNATURE,
    TO_STATE_DICT_HINTS,
    TO_STATE_DICT_SIGNATURE,
    float_dtype,
)
from .peft_config import (
    ADAPTER_WEIGHTS,
    BASE_LAYER,
    LEGACY_ADAPTER_WEIGHTS,
    base_layer_copies,
    read_adapter_config,
    saved_modules,
)
from .sources import StateDictSource, as_stored, side_by_side, stored_dtype
from .tied_head import with_tied_heads
from .torch_layout import (
    TorchLayout,
    adapter_converter,
    exporter,
    float_name,
    importer,
    is_quantized,
    layout_for,
    quantized_refusal,
)

__all__ = ["load_state_dict", "to_state_dict"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if name else prefix


def _is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16"


#: The prefix of every name in a PEFT adapter file (``adapter_model.safetensors``).
PEFT_PREFIX = "base_model.model."


class _Layer(NamedTuple):
    step: Step
    module: str                            # the dotted name its weights go under
    shapes: dict[str, tuple[int, ...]]     # our weight path -> shape
    export: Callable
    import_: Callable
    adapter: bool                          # a LoRA adapter's (PEFT's names and layouts)


def _layers(graph: Graph, layout: TorchLayout, mode: str,
            saved: Callable[[str], bool] | None = None) -> list[_Layer]:
    """Each layer with weights, with its module name and converters. ``mode``:
    ``"read"`` (a quantized layer's float weights, which ``load_state_dict`` then
    quantizes; its ``Quantize`` nodes' state comes from ``quantize_weights``), ``"write"``
    (a quantized layer is an error) or ``"adapters"`` (the LoRA adapters, and the layers
    whose module name ``saved`` takes: PEFT's ``modules_to_save``)."""
    if not isinstance(graph, Graph):
        raise SerializationError(f"state dicts are read into an mg.Graph (the one the model "
                                 f"was built as), got {type(graph).__name__}")
    steps = list(flatten(graph).owners())
    ops = {"/".join(step.weights): step.op for step in steps}
    out = []
    for step in steps:
        shapes = {path: tuple(spec.shape) for path, spec in flatten_specs(step.param_specs)}
        shapes.update({f"state/{path}": tuple(spec.shape)
                       for path, spec in flatten_specs(step.state_specs)})
        module = ".".join(step.weights)
        adapter = adapter_converter("/".join(step.weights), module, ops, layout)
        if adapter is not None:
            out.append(_Layer(step, adapter[0], shapes, adapter[1], adapter[2], True))
        elif mode == "adapters" and not (saved and saved(module)):
            continue
        elif is_quantized(step.op):
            if mode == "adapters":  # a module modules_to_save names
                raise quantized_refusal(step.op, step.path, "to_state_dict", saved=module)
            if mode != "read":
                raise quantized_refusal(step.op, step.path, "to_state_dict")
            if float_name(step.op) is None:
                continue  # a Quantize node: quantize_weights gives its state
            out.append(_float_layer(step, module))
        else:
            out.append(_Layer(step, module, shapes, exporter(step.op, step.path),
                              importer(step.op, step.path), False))
    return out


def _float_layer(step: Step, module: str) -> _Layer:
    """A quantized layer as its float layer (the same hyperparameters), whose weights a
    state dict holds: their shapes and converters."""
    op: Any = step.op
    cls = lookup(float_name(op) or "")
    names = {f.name for f in dataclasses.fields(cls)}
    plain = cls(**{k: v for k, v in op.attrs().items() if k in names}, name=op.name)
    inputs = list(step.input_specs)
    if op.quantizes_inputs:  # it reads (q, scale) from its Quantize node: the float x
        inputs = [inputs[0].with_dtype(np.float32)]
    shapes = {path: tuple(spec.shape) for path, spec in flatten_specs(plain.param_specs(inputs))}
    export, import_ = exporter(plain, step.path), importer(plain, step.path)
    return _Layer(step, module, shapes, lambda _, *rest: export(plain, *rest),
                  lambda _, *rest: import_(plain, *rest), False)


def _expected(layers: list, layout: TorchLayout) -> dict[str, tuple[Step, str, tuple[int, ...]]]:
    """Each name a state dict of the ``layers`` holds -> (step, its name relative to the
    layer, shape), from the converters run on shapes alone."""
    expected: dict[str, Any] = {}
    for step, module, shapes, export, _, _ in layers:
        ours = {path: jax.ShapeDtypeStruct(shape, jnp.float32) for path, shape in shapes.items()}
        theirs = jax.eval_shape(lambda ours, step=step, export=export: export(
            step.op, layout, ours, jnp), ours)
        for relative, struct in theirs.items():
            name = _join(module, relative)
            if layout.is_buffer(name):  # written, but neither needed nor checked
                continue
            if name in expected:
                raise SerializationError(
                    f"layers {expected[name][0].path!r} and {step.path!r} would both hold the "
                    f"state dict's {name!r}: rename one of them")
            expected[name] = (step, relative, tuple(struct.shape))
    return expected


def to_state_dict(graph: Graph, params: Mapping, state: Mapping | None = None, *,
                  dtype: Any = None, adapter_only: bool = False,
                  modules_to_save: Sequence[str] = (),
                  **unknown: Any) -> dict[str, np.ndarray]:
    """``graph``'s weights under the original framework's names and layouts, as NumPy
    arrays (what ``safetensors.numpy.save_file`` writes and torch's
    ``load_state_dict`` reads after ``torch.from_numpy``).

    Args:
      graph: the graph the weights belong to (a builder's graph of ``mg.models``, or
        any graph whose layers are named after PyTorch modules).
      params: the graph's params in its own layout (``model.unstack_weights`` first
        for a model compiled with ``scan_blocks=True``).
      state: its state (BatchNorm's statistics), likewise; None when it has none.
      dtype: cast floating weights to it; by default they keep theirs.
      adapter_only: the LoRA adapters' weights alone (a graph made by ``mg.lora``), as
        PEFT's ``adapter_model.safetensors`` holds them: ``base_model.model.<module>.lora_A.weight``
        ... (``mg.models.save_adapter`` writes the folder). Without it, adapters' weights
        are written under the same names without the ``base_model.model.`` prefix.
      modules_to_save: with ``adapter_only``, PEFT's ``modules_to_save``: the modules
        whose full weights go with the adapters' (``base_model.model.lm_head.weight``),
        named as PEFT names them (a module whose name ends with an entry); an entry
        naming no module is an ``mg.ConfigError``.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 11,
      ...                     "n_positions": 4})
      >>> sd = mg.models.to_state_dict(g, *mg.compile(g).init(jax.random.key(0)))
      >>> sd["h.0.attn.c_attn.weight"].shape
      (8, 24)
    """
    if unknown:
        raise ConfigError(unknown_keywords("to_state_dict", unknown, TO_STATE_DICT_SIGNATURE,
                                           TO_STATE_DICT_HINTS))
    refuse_deleted("to_state_dict", params=params, state=state)
    dtype = float_dtype(dtype, "to_state_dict")
    layout = layout_for(graph.name)
    state = state or {}
    out: dict[str, np.ndarray] = {}
    saved = saved_modules(graph.name, [".".join(step.weights) for step in flatten(graph).owners()],
                          layout.model_prefix, modules_to_save, adapter_only)
    layers = _layers(graph, layout, "adapters" if adapter_only else "write", saved)
    prefix = ""
    if adapter_only:
        if not any(layer.adapter for layer in layers):
            raise SerializationError(f"to_state_dict(adapter_only=True): graph {graph.name!r} "
                                     f"has no LoRA adapters (mg.lora adds them)")
        prefix = PEFT_PREFIX + layout.model_prefix
    for step, module, shapes, export, _, _ in layers:
        ours = {}
        for path in shapes:
            tree, keys = (state, path.split("/")[1:]) if path.startswith("state/") else (params, path.split("/"))
            try:
                value = get_in(tree, step.weights + tuple(keys))
            except (KeyError, TypeError):
                which = "state" if tree is state else "params"
                stacked = any(".." in key for key in tree)
                raise SerializationError(
                    f"{which} has no weight {'/'.join(step.weights + tuple(keys))!r} (layer "
                    f"{step.path!r})" + ("; these are a scanned model's stacked weights: "
                                        "model.unstack_weights(params, state) first" if stacked else "")
                ) from None
            value = np.asarray(value)
            if value.shape != shapes[path]:
                raise SerializationError(f"weight {'/'.join(step.weights + tuple(keys))!r} has shape "
                                         f"{value.shape}; layer {step.path!r} holds {shapes[path]}")
            ours[path] = value.astype(dtype) if dtype is not None and _is_float(value.dtype) else value
        for relative, tensor in export(step.op, layout, ours, np).items():
            out[prefix + _join(module, relative)] = np.asarray(tensor, order="C")
    return out


def load_state_dict(graph: Graph, state_dict: Any, *, strict: bool = True,
                    dtype: Any = "float32", adapter: Any = None,
                    **unknown: Any) -> tuple[dict, dict]:
    """``(params, state)`` for ``graph`` from a state dict in the original framework's
    names and layouts.

    Args:
      graph: a graph of ``mg.models`` (or any graph whose layers are named after
        PyTorch modules).
      state_dict: a mapping of names to arrays (NumPy, or anything ``np.asarray``
        takes), a path to a ``.safetensors`` file, or a folder holding one, or shards
        with their ``*.safetensors.index.json``. Files are read without torch.
      strict: names the graph does not hold are an error (the weights of another head,
        say); ``strict=False`` ignores them. Missing and mis-shaped weights are errors
        either way.
      dtype: the dtype of the floating weights returned (float32, as PyTorch and
        Hugging Face load by default); None keeps the file's.
      adapter: a PEFT adapter folder (``adapter_config.json`` and
        ``adapter_model.safetensors``) for a graph ``mg.lora_from_peft`` made from it:
        the base weights come from ``state_dict``, the adapters' (and those of the
        ``modules_to_save``, which replace the base's) from the folder, its names under
        ``base_model.model.``. Every adapter weight must be there; others as ``strict``.

    A graph ``mg.quantize`` made (QLoRA's base) reads the float weights, which are then
    quantized as ``mg.quantize_weights`` does (absmax; its ``Quantize`` nodes get
    per-call scales).

    Returns:
      ``(params, state)`` in the graph's own layout, as ``init`` returns them.

    Raises:
      SerializationError: a weight is missing, extra (``strict``), of another shape
        or not floating; a tied copy differs from its weight; a file is damaged.
    """
    if unknown:
        raise ConfigError(unknown_keywords("load_state_dict", unknown,
                                           LOAD_STATE_DICT_SIGNATURE, LOAD_STATE_DICT_HINTS))
    dtype = float_dtype(dtype, "load_state_dict")
    layout = layout_for(graph.name)
    layers = _layers(graph, layout, "read")
    if adapter is not None:
        params, state = _load_with_adapter(graph, layout, layers, state_dict, adapter, strict, dtype)
    else:
        params, state = _load_from(graph, layout, layers, state_dict, strict, dtype)
    if any(is_quantized(step.op) for step in flatten(graph).owners()):
        # QLoRA: the float weights read, then quantized as mg.quantize_weights does.
        params, state = quantize_weights(graph, params, state)
    return params, state


def _load_from(graph, layout, layers, state_dict, strict, dtype):
    expected = _expected(layers, layout)
    source = StateDictSource(state_dict)
    try:
        return _load(graph, layout, layers, expected, source, strict, dtype)
    finally:
        source.close()


def _load_with_adapter(graph, layout, layers, state_dict, folder, strict, dtype):
    """The base weights from ``state_dict``, then the adapter's (and the modules it
    saves in full) from the PEFT folder."""
    if not isinstance(folder, (str, os.PathLike)):
        raise SerializationError(f"load_state_dict(adapter=...) reads the adapter's weights "
                                 f"from a PEFT adapter folder (its {ADAPTER_WEIGHTS}); got "
                                 f"{type(folder).__name__}")
    config = read_adapter_config(folder)
    adapters = [layer for layer in layers if layer.adapter]
    if not adapters:
        raise SerializationError(f"load_state_dict(adapter={os.fspath(folder)!r}): graph "
                                 f"{graph.name!r} has no adapters; build it with "
                                 f"mg.lora_from_peft(graph, folder) first")
    from .peft import check_adapter_config  # peft writes through this module

    check_adapter_config(graph, config)
    base = [layer for layer in layers if not layer.adapter]
    params, state = _load_from(graph, layout, base, state_dict, strict, dtype)
    saved = [layer for layer in base if any(
        config.saves(prefix + name) for prefix in {layout.model_prefix, ""}
        for name in (layer.module, layout.memory_name(layer.module)))]
    weights = os.path.join(os.path.dirname(config.path), ADAPTER_WEIGHTS)
    if not os.path.exists(weights):
        # PEFT before safetensors: torch.save's zip archive, read as PEFT falls back to it
        # (its arrays and names only: the pickle's code is never run, mlaxgraph.io.torch_file)
        legacy = os.path.join(os.path.dirname(config.path), LEGACY_ADAPTER_WEIGHTS)
        if not os.path.exists(legacy):
            raise SerializationError(f"{weights}: no such file (nor {LEGACY_ADAPTER_WEIGHTS})")
        weights = legacy
    peft = dataclasses.replace(layout, tied=(), prefixes=tuple(
        PEFT_PREFIX + p for p in dict.fromkeys((layout.model_prefix, "", *layout.prefixes))),
        buffers=BASE_LAYER if layout.buffers is None else f"{layout.buffers}|{BASE_LAYER}")
    copies = base_layer_copies(weights)  # an Embedding target's table, as PEFT saves it
    if copies:
        modules = {name.rsplit(".", 1)[0] for name in copies}
        targets = [layer for layer in base if any(m.endswith(layer.module) for m in modules)]
        params = _over(params, _load_from(graph, peft, targets, copies, False, dtype)[0])
    adapter_params, adapter_state = _load_from(graph, peft, adapters + saved, weights, strict, dtype)
    return _over(params, adapter_params), _over(state, adapter_state)


def _over(tree: Any, new: Any) -> Any:
    """``tree`` with each leaf of ``new`` set at its path."""
    for path, value in leaf_paths(new).items():
        tree = set_in(tree, tuple(path.split("/")), value)
    return tree


_LEGACY = {"weight": "gamma", "bias": "beta"}


def _load(graph, layout, layers, expected, source, strict, dtype):
    names = source.names()
    # Other names of the files' weights (transformers 5.x's in memory), as the files' names
    given = set(names)
    aliases = {k: v for k, v in ((layout.file_name(n), n) for n in names) if k != v and k not in given}
    if aliases:
        as_files = {v: k for k, v in aliases.items()}
        names = [as_files.get(n, n) for n in names]
    present = set(names)
    # A prefix the file puts before every name ("transformer."): the one that finds the
    # most of the graph's names.
    prefix = max(("",) + layout.prefixes,
                 key=lambda p: sum(p + name in present for name in expected))
    # a name without the prefix where the file has it so (a task model's head: classifier.*)
    found = {name: next(n for n in (prefix + name, name) if n in present)
             for name in expected if prefix + name in present or name in present}
    for name, (step, relative, _) in expected.items():
        # Legacy names Hugging Face renames on loading: LayerNorm's gamma and beta
        # (BERT's original checkpoints).
        legacy = prefix + name[:-len(relative)] + _LEGACY.get(relative, relative)
        if name not in found and step.op.op_name == "layer_norm" and legacy in present:
            found[name] = legacy
    found = with_tied_heads(found, source, expected)
    missing = sorted(set(expected) - set(found))
    used = set(found.values())
    tied = {prefix + copy if prefix + copy in present else copy: weight
            for copy, weight in layout.tied}
    extra = []
    for name in names:
        if name in used:
            continue
        bare = name[len(prefix):] if name.startswith(prefix) else name
        if name in tied or layout.is_buffer(bare):
            continue
        extra.append(name)
    if missing or (extra and strict):
        what = (f"missing {len(missing)} weight(s) of graph {graph.name!r}" if missing else
                f"{len(extra)} weight(s) that graph {graph.name!r} does not hold")
        raise SerializationError(
            f"{source.label}: {what}" + (f" (names read with the prefix {prefix!r})" if prefix else "")
            + (" (strict=False ignores the unexpected ones)" if extra and strict else "")
            + ("; an adapter's weights come from its PEFT folder: adapter=folder"
               if missing and all(".lora_" in m for m in missing) else "") + ":\n"
            + side_by_side([prefix + m for m in missing], extra))
    arrays: dict[str, np.ndarray] = {}
    for name, (step, _, shape) in expected.items():
        file_name = found[name]
        got = source.shape(aliases.get(file_name, file_name))
        if got != shape:
            raise SerializationError(
                f"{source.label}: {file_name!r} has shape {tuple(got)}; layer {step.path!r} of "
                f"graph {graph.name!r} needs {shape}")
        array = source.array(aliases.get(file_name, file_name))
        stored = stored_dtype(step)
        if stored is not None:  # an integer or boolean buffer (an imported module's)
            arrays[name] = as_stored(array, stored, file_name, source.label)
            continue
        if not _is_float(array.dtype):
            raise SerializationError(f"{source.label}: {file_name!r} is {array.dtype}; the "
                                     f"weights of layer {step.path!r} are floating point")
        arrays[name] = array if dtype is None else array.astype(dtype)
    for copy, weight in layout.tied:
        file_name = next((n for n in (prefix + copy, copy) if n in present), None)
        if file_name is not None and file_name not in used:
            value = source.array(aliases.get(file_name, file_name))
            if value.shape != arrays[weight].shape or not np.array_equal(
                    value.astype(arrays[weight].dtype), arrays[weight]):
                raise SerializationError(
                    f"{source.label}: {file_name!r} differs from {weight!r}; graph "
                    f"{graph.name!r} ties them (one weight), so they must be equal")
    params: dict = {}
    state: dict = {}
    theirs: dict[str, dict[str, np.ndarray]] = {}
    for name, (step, relative, _) in expected.items():
        theirs.setdefault(step.path, {})[relative] = arrays[name]
    for step, _, shapes, _, import_, _ in layers:
        ours = import_(step.op, layout, theirs[step.path], shapes)
        for path, value in ours.items():
            if path.startswith("state/"):
                state = set_in(state, step.weights + tuple(path.split("/")[1:]), jnp.asarray(value))
            else:
                params = set_in(params, step.weights + tuple(path.split("/")), jnp.asarray(value))
    return params, state
