"""PyTorch's names and layouts of our layers' weights, for state dicts.

A layer's weights in a PyTorch state dict are named ``<its path, dotted>.<name>``: the
layer ``h.0/attn`` of a graph is the module ``h.0.attn``. Each op with weights has a
converter between our weights (flat paths: ``kernel``, ``query/bias``, state as
``state/mean``) and the module's tensors (``weight``, ``q_proj.bias``), written with
array methods and ``xp.concatenate`` only, so that one function serves NumPy arrays
and ``jax.eval_shape``'s shapes. A ``TorchLayout`` holds what differs between
checkpoint families: GPT-2's ``Conv1D`` stores linear weights ``(in, out)``, attention
projections have the original module's names, files may add a prefix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..adapters.quantize import QUANTIZED_OPS
from ..core.errors import SerializationError
from ..ops.quantize import Quantize

__all__ = ["TorchLayout", "register_layout", "layout_for", "exporter", "importer", "supported_ops"]

#: A separate projection per attention weight, named as Llama's modules.
SEPARATE = (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"), ("out", "o_proj"))


@dataclasses.dataclass(frozen=True)
class TorchLayout:
    """How one family of checkpoints names and lays out weights.

    Attributes:
      linear: ``"out_in"`` (``torch.nn.Linear``: weight ``(out, in)``) or ``"in_out"``
        (GPT-2's ``Conv1D``: weight ``(in, out)``).
      attention: ``MultiHeadAttention``'s projections as modules: pairs of (our name,
        the module's name relative to the layer), or ``(("qkv", "c_attn"), ("out",
        "c_proj"))`` for one fused query-key-value projection.
      prefixes: prefixes a file may put before every name (``"transformer."`` for
        GPT2LMHeadModel's files); they are accepted on loading, not written.
      tied: names a file may hold as copies of another weight (``"lm_head.weight"``
        of a tied head): accepted when equal to it, not written.
      buffers: a regular expression of the names of buffers the model computes rather
        than loads (GPT-2's causal mask ``attn.bias``): accepted and ignored.
      model_prefix: the prefix of the modules' names in the Hugging Face model class
        the graph stands for (``"transformer."``: GPT-2's graph computes logits, as
        ``GPT2LMHeadModel``), which PEFT's adapter files write after
        ``base_model.model.`` and its ``target_modules`` patterns may match.
      renames: ``(pattern, replacement)`` regular expressions from other names of the
        same weights to the files' (after the prefix, applied in order, the first
        that matches wins): transformers 5.x renames some models' modules in memory
        (``ViTModel().state_dict()``: ``layers.0.attention.q_proj`` for the files'
        ``encoder.layer.0.attention.attention.query``) and writes the files' names
        back on saving; loading accepts both.
    """

    linear: str = "out_in"
    attention: tuple[tuple[str, str], ...] = SEPARATE
    prefixes: tuple[str, ...] = ()
    tied: tuple[tuple[str, str], ...] = ()
    buffers: str | None = None
    model_prefix: str = ""
    renames: tuple[tuple[str, str], ...] = ()

    def file_name(self, name: str) -> str:
        """``name`` as the files write it (``renames`` applied after the prefix); the
        name itself when no rename matches."""
        if not self.renames:
            return name
        for prefix in sorted(("",) + self.prefixes, key=len, reverse=True):
            if name.startswith(prefix):
                rest = name[len(prefix):]
                for pattern, replacement in self.renames:
                    renamed, count = re.subn(pattern, replacement, rest, count=1)
                    if count:
                        return prefix + renamed
                return name
        return name

    def memory_name(self, name: str) -> str:
        """A module's ``name`` as the files write it (``encoder.layer.0.attention.attention.query``)
        in the form ``renames`` reads (transformers 5.x's in memory,
        ``layers.0.attention.q_proj``, which PEFT's adapter folders name); the name
        itself when no rename gives it."""
        for pattern, replacement in self.renames:
            # each rename read backwards: its replacement as a pattern, \1 a number
            parts = re.split(r"\\1", replacement)
            back = "^" + r"(\d+)".join(re.escape(p) for p in parts)
            forth = re.sub(r"\(\\d\+\)", r"\\1", pattern.lstrip("^")).replace("\\.", ".")
            renamed, count = re.subn(back, forth, name + ".", count=1)
            if count:
                return renamed[:-1]
        return name

    def is_buffer(self, name: str) -> bool:
        return name.endswith(".num_batches_tracked") or (
            self.buffers is not None and re.fullmatch(self.buffers, name) is not None)


_LAYOUTS: dict[str, TorchLayout] = {}


def register_layout(graph_name: str, layout: TorchLayout) -> None:
    """The layout of the graphs named ``graph_name`` (the zoo's builders name theirs)."""
    _LAYOUTS[graph_name] = layout


def layout_for(graph_name: str) -> TorchLayout:
    """The registered layout of a graph's name; PyTorch's defaults for other graphs."""
    return _LAYOUTS.get(graph_name, TorchLayout())


# --- converters: ours (flat paths) <-> the module's tensors (names relative to it) -----

Weights = Mapping[str, Any]


def _linear(w, layout):
    """Our ``(in, out)`` kernel as the module's weight, and back (a transpose, or none)."""
    return w.T if layout.linear == "out_in" else w


def _renamed(pairs: tuple[tuple[str, str], ...]) -> tuple[Callable, Callable]:
    def export(op, layout, ours, xp):
        return {theirs: ours[mine] for mine, theirs in pairs if mine in ours}

    def import_(op, layout, theirs, shapes):
        return {mine: theirs[name] for mine, name in pairs if mine in shapes}
    return export, import_


def _linear_export(op, layout, ours, xp):
    out = {"weight": _linear(ours["kernel"], layout)}
    if "bias" in ours:
        out["bias"] = ours["bias"]
    return out


def _linear_import(op, layout, theirs, shapes):
    out = {"kernel": _linear(theirs["weight"], layout)}
    if "bias" in shapes:
        out["bias"] = theirs["bias"]
    return out


def _conv_perm(rank: int, channels_last: bool, transposed: bool) -> tuple[int, ...]:
    """The permutation of our kernel's axes that gives PyTorch's: ``(out, in, *window)``
    for Conv, ``(in, out, *window)`` for ConvTranspose."""
    if channels_last:  # ours (out, *window, in)
        first = (rank - 1, 0) if transposed else (0, rank - 1)
        return first + tuple(range(1, rank - 1))
    return ((1, 0) if transposed else (0, 1)) + tuple(range(2, rank))


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(perm)), key=perm.__getitem__))


def _conv(transposed: bool) -> tuple[Callable, Callable]:
    def export(op, layout, ours, xp):
        kernel = ours["kernel"]
        out = {"weight": kernel.transpose(_conv_perm(kernel.ndim, op.channels_last, transposed))}
        if "bias" in ours:
            out["bias"] = ours["bias"]
        return out

    def import_(op, layout, theirs, shapes):
        weight = theirs["weight"]
        out = {"kernel": weight.transpose(_inverse(_conv_perm(weight.ndim, op.channels_last, transposed)))}
        if "bias" in shapes:
            out["bias"] = theirs["bias"]
        return out
    return export, import_


_BATCH_NORM = _renamed((("scale", "weight"), ("bias", "bias"), ("state/mean", "running_mean"),
                        ("state/var", "running_var")))


def _batch_norm_export(op, layout, ours, xp):
    out = _BATCH_NORM[0](op, layout, ours, xp)
    # PyTorch's count of training batches: it matters only to momentum=None (a
    # cumulative average), which has no counterpart here; a new module's value.
    out["num_batches_tracked"] = np.zeros((), np.int64)
    return out


def _attention(op, layout) -> tuple[dict[str, str], bool]:
    names = dict(layout.attention)
    return names, "qkv" in names


def _attention_export(op, layout, ours, xp):
    names, fused = _attention(op, layout)
    out = {}

    def flat_in(kernel):  # (d, heads, head_dim) -> (d, heads * head_dim)
        return kernel.reshape(kernel.shape[0], -1)

    projections = ("query", "key", "value")
    if fused:
        kernels = [flat_in(ours[f"{p}/kernel"]) for p in projections]
        out[f"{names['qkv']}.weight"] = _linear(xp.concatenate(kernels, axis=1), layout)
        if "query/bias" in ours:
            out[f"{names['qkv']}.bias"] = xp.concatenate([ours[f"{p}/bias"].reshape(-1) for p in projections])
    else:
        for p in projections:
            out[f"{names[p]}.weight"] = _linear(flat_in(ours[f"{p}/kernel"]), layout)
            if f"{p}/bias" in ours:
                out[f"{names[p]}.bias"] = ours[f"{p}/bias"].reshape(-1)
    kernel = ours["out/kernel"]  # (heads, head_dim, out)
    out[f"{names['out']}.weight"] = _linear(kernel.reshape(-1, kernel.shape[-1]), layout)
    if "out/bias" in ours:
        out[f"{names['out']}.bias"] = ours["out/bias"]
    return out


def _attention_import(op, layout, theirs, shapes):
    names, fused = _attention(op, layout)
    out = {}
    projections = ("query", "key", "value")
    if fused:
        kernel = _linear(theirs[f"{names['qkv']}.weight"], layout)
        start = 0
        for p in projections:
            shape = shapes[f"{p}/kernel"]
            width = shape[1] * shape[2]
            out[f"{p}/kernel"] = kernel[:, start:start + width].reshape(shape)
            if f"{p}/bias" in shapes:
                out[f"{p}/bias"] = theirs[f"{names['qkv']}.bias"][start:start + width].reshape(shapes[f"{p}/bias"])
            start += width
    else:
        for p in projections:
            out[f"{p}/kernel"] = _linear(theirs[f"{names[p]}.weight"], layout).reshape(shapes[f"{p}/kernel"])
            if f"{p}/bias" in shapes:
                out[f"{p}/bias"] = theirs[f"{names[p]}.bias"].reshape(shapes[f"{p}/bias"])
    out["out/kernel"] = _linear(theirs[f"{names['out']}.weight"], layout).reshape(shapes["out/kernel"])
    if "out/bias" in shapes:
        out["out/bias"] = theirs[f"{names['out']}.bias"]
    return out


_SCALE_BIAS = _renamed((("scale", "weight"), ("bias", "bias")))


def _buffer_export(op, layout, ours, xp):
    # an imported module's buffer (mg.from_torch), held as float32 state: its own dtype back
    return {"": ours["state/value"].astype(op.dtype)}


def _buffer_import(op, layout, theirs, shapes):
    return {"state/value": theirs[""]}

_CONVERTERS: dict[str, tuple[Callable, Callable]] = {
    "linear": (_linear_export, _linear_import),
    "conv": _conv(transposed=False),
    "conv_transpose": _conv(transposed=True),
    "batch_norm": (_batch_norm_export, _BATCH_NORM[1]),
    "layer_norm": _SCALE_BIAS,
    "rms_norm": _SCALE_BIAS,
    "group_norm": _SCALE_BIAS,
    "embedding": _renamed((("embedding", "weight"),)),
    "param": _renamed((("value", ""),)),
    "aten.buffer": (_buffer_export, _buffer_import),
    "multi_head_attention": (_attention_export, _attention_import),
}


def supported_ops() -> list[str]:
    return sorted(_CONVERTERS)


def float_name(op) -> str | None:
    """The op name of a quantized layer's float layer (``"linear"`` for a
    ``QuantizedLinear``: its weights' PyTorch layout, read as floats and then quantized);
    None for any other op."""
    return next((name for name, cls in QUANTIZED_OPS.items() if isinstance(op, cls)), None)


def is_quantized(op) -> bool:
    """Whether ``op`` is a quantized layer or the ``Quantize`` node of one (what
    ``mg.quantize`` made): its stored weights have no PyTorch layout."""
    return float_name(op) is not None or isinstance(op, Quantize)


def quantized_refusal(op, path: str, what: str, saved: str | None = None) -> SerializationError:
    """The error for a quantized layer where float PyTorch weights are written (``saved``:
    the module name by which ``modules_to_save`` names it)."""
    scheme = getattr(op, "scheme", None)
    if saved is not None:
        return SerializationError(
            f"{what}: modules_to_save names {saved!r}, which is quantized ({scheme}), and a "
            f"PEFT folder holds a saved module's float weights: write the adapters alone "
            f"(save_adapter(..., modules_to_save=[]): a folder given as like= carries its "
            f"modules_to_save over), or save the module before quantizing")
    return SerializationError(
        f"{what}: layer {path!r} ({op.op_name}{', ' + scheme if scheme else ''}) is quantized, "
        f"and a PyTorch state dict holds float weights: write the float model's (the graph "
        f"before mg.quantize), or the LoRA adapters alone (adapter_only=True, save_adapter)")


def _converter(op, path: str) -> tuple[Callable, Callable]:
    try:
        return _CONVERTERS[op.op_name]
    except KeyError:
        raise SerializationError(
            f"layer {path!r} ({op.op_name}) has no PyTorch layout; state dicts hold the "
            f"weights of {', '.join(supported_ops())}") from None


def exporter(op, path: str) -> Callable:
    """``export(op, layout, ours, xp) -> {module-relative name: tensor}``."""
    return _converter(op, path)[0]


def importer(op, path: str) -> Callable:
    """``import_(op, layout, theirs, shapes) -> {our weight path: array}``."""
    return _converter(op, path)[1]


# --- LoRA adapters, as PEFT names and lays them out ---------------------------------------

#: What an adapter layer's name ends with: ``<target>.lora_A`` / ``<target>.lora_B``.
ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


def _adapter_linear(export_name: str) -> tuple[Callable, Callable]:
    """An adapter's Linear as PEFT's ``nn.Linear`` (``(out, in)`` whatever the base's
    layout), under ``export_name``."""
    def export(op, layout, ours, xp):
        return {export_name: ours["kernel"].T}

    def import_(op, layout, theirs, shapes):
        return {"kernel": theirs[export_name].T}
    return export, import_


def _adapter_embedding_a(op, layout, ours, xp):
    return {"lora_embedding_A": ours["embedding"].T}


def _adapter_embedding_a_import(op, layout, theirs, shapes):
    return {"embedding": theirs["lora_embedding_A"].T}



def unnamed_projection(path: str, owner: str, projection: str, names: dict[str, str]) -> str:
    """The problem with adapter ``path`` of attention ``owner``'s ``projection``, which
    the checkpoint's layout (its projections ``names``: ours -> its module) has no
    module for (GPT-2 fuses query, key and value into ``c_attn``)."""
    return (f"layer {path!r}: the state dict's layout names the attention projections "
            f"{', '.join(names)}, not {projection!r}: its checkpoint holds no module an "
            f"adapter of {projection!r} alone belongs to; adapt those projections "
            f"({', '.join(f'{owner}/{k} as {v}' for k, v in names.items())}), "
            f"e.g. mg.lora(graph, {owner + '/' + next(iter(names), '')!r}, rank=...)")

def adapter_converter(path: str, module: str, ops: Mapping[str, Any],
                      layout: TorchLayout) -> tuple[str, Callable, Callable] | None:
    """For the weights of an adapter layer ``path`` (``<target>.lora_A`` or ``.lora_B``,
    ``module`` its dotted name): the module PEFT names them under, and the converters.
    ``ops`` maps layer paths to ops. None for another layer.

    PEFT's names: ``<module>.lora_A.weight`` (``nn.Linear``: ``(rank, in)``; an
    ``nn.Conv2d`` for a Conv), ``<module>.lora_B.weight``; for an Embedding
    ``<module>.lora_embedding_A`` ``(rank, num_embeddings)`` and
    ``<module>.lora_embedding_B`` ``(features, rank)``; for an attention projection the
    module is the projection's own (``h.0.attn.c_attn``, ``layers.0.self_attn.q_proj``).
    """
    suffix = next((s for s in ADAPTER_SUFFIXES if path.endswith(s)), None)
    if suffix is None:
        return None
    target = path[: -len(suffix)]
    target_module = module[: -len(suffix)]
    owner, _, projection = target.rpartition(".")
    base_op = ops.get(target)
    owner_op = ops.get(owner)
    if base_op is None and owner_op is not None and "multi_head_attention" in (
            owner_op.op_name, float_name(owner_op)):
        names = dict(layout.attention)
        if projection not in names:
            raise SerializationError(unnamed_projection(path, owner, projection, names))
        target_module = target_module[: -len(projection)] + names[projection]
        base_op = ops[owner]
    if base_op is None:
        return None
    kind = "A" if suffix == ".lora_A" else "B"
    base_name = float_name(base_op) or base_op.op_name   # QLoRA: the float layer's adapter
    if base_name == "embedding":
        if kind == "A":
            return target_module, _adapter_embedding_a, _adapter_embedding_a_import
        return (target_module, *_adapter_linear("lora_embedding_B"))
    if base_name == "conv":
        export, import_ = _conv(transposed=False)
        return f"{target_module}.lora_{kind}", export, import_
    return (f"{target_module}.lora_{kind}", *_adapter_linear("weight"))
