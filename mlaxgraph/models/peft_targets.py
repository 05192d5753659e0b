"""Which modules of a graph a PEFT config's ``target_modules`` names: the graph's
modules under PyTorch's names (``peft_modules``), what PEFT's ``"all-linear"`` leaves
out, and the names that match nothing (an ``AdapterWarning``) or an output head tied to
the embedding (a ``ConfigError``)."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import AdapterWarning, ConfigError
from ..ir.graph import Graph
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths
from ..ops.attention import MultiHeadAttention
from .peft_config import keeps_out
from .torch_layout import float_name, layout_for

__all__ = ["LINEAR_OPS", "ADAPTABLE_OPS", "peft_modules", "all_linear_excluded",
           "check_tied_heads", "check_names", "near_names", "seq_cls_extras",
           "dilated_conv"]

#: The ops PEFT's ``all-linear`` adapts here (and attention projections).
LINEAR_OPS = ("linear",)
ADAPTABLE_OPS = ("linear", "embedding", "conv")


def peft_modules(graph: Graph) -> dict[str, tuple[str, str]]:
    """Each module name of ``graph`` (as PyTorch would name it, without the model
    class's prefix) -> (the path ``mg.lora`` takes, the op's name: a quantized layer's
    float op's); attention layers give one module per projection (``op`` is then
    ``"attention"``)."""
    layout = layout_for(graph.name)
    out: dict[str, tuple[str, str]] = {}
    for path, node in layer_paths(unfold_scans(graph)):
        module = path.replace("/", ".")
        if isinstance(node.op, MultiHeadAttention):
            for ours, theirs in layout.attention:
                out[f"{module}.{theirs}"] = (f"{path}/{ours}", "attention")
        else:  # a quantized layer (QLoRA) as its float layer: PEFT adapts it alike
            out[module] = (path, float_name(node.op) or node.op.op_name)
    return out


#: The classification heads PEFT's ``all-linear`` leaves out for ``task_type`` ``SEQ_CLS``
#: where the model has no output embeddings (its ``SEQ_CLS_HEAD_NAMES``, the first found).
_SEQ_CLS_HEADS = ("score", "classifier")


def seq_cls_extras(names: Any, matches: Callable[[str], bool]) -> set[str]:
    """The entries of ``modules_to_save`` that name no module (``matches``) and are one of
    the heads PEFT's sequence classification model adds there itself (``classifier``
    and ``score``, both, whichever the model has) while another of them names one:
    PEFT ignores such an entry. Any other entry naming no module is refused."""
    heads = [name for name in names if name in _SEQ_CLS_HEADS]
    missing = {name for name in heads if not matches(name)}
    return missing if len(missing) < len(heads) else set()


def all_linear_excluded(layout: Any, keys: list[str], task_type: Any) -> set[str]:
    """The modules PEFT's ``all-linear`` leaves out: a Hugging Face model's output
    embeddings (``lm_head``, the module of the weight the layout's ``tied`` names), or,
    without them, for ``task_type="SEQ_CLS"``, its top-level ``score`` or
    ``classifier``. Any other Linear is adapted, the last layer of a model without
    output embeddings included (torchvision's ResNet ``fc``), as PEFT adapts it."""
    heads = {name.rsplit(".", 1)[0] for name, _ in layout.tied}
    if heads:
        return heads
    if task_type == "SEQ_CLS":
        return {next((name for name in _SEQ_CLS_HEADS if name in keys), "")}
    return set()


def check_tied_heads(config, layout: Any, modules: Mapping, graph: Graph) -> None:
    """A ``ConfigError`` for ``target_modules`` naming an output head tied to the
    embedding (``lm_head`` of GPT-2, of Llama with ``tie_word_embeddings``): PEFT adapts
    that Linear apart, and here it is the embedding's second call, which LoRA does not
    adapt; leaving it out would load the rest and compute another model."""
    for weight, embedding in layout.tied:
        head = weight.rsplit(".", 1)[0]
        if head not in modules and config.targets(head) and not keeps_out(config.modules_to_save, head):
            raise ConfigError(
                f"{config.path}: target_modules {config.target_modules!r} names {head!r}, the "
                f"output head tied to {embedding!r}, which PEFT adapts as a Linear of its own; "
                f"in graph {graph.name!r} the head is the embedding's second call (one layer "
                f"called twice), and LoRA adapts one call of a layer: this adapter cannot be "
                f"read (an adapter on {embedding.rsplit('.', 1)[0]!r} adapts its lookup alone)")


def check_names(config, field: str, spec: Any, keys: list[str], full, graph: Graph) -> None:
    """An ``AdapterWarning`` for the entries of a list of module names
    (``target_modules``, ``exclude_modules``) that name no module of ``graph``: PEFT
    ignores them (a list written for several model families), and so does this, saying
    so (a typo). A ``ConfigError`` for a ``target_modules`` entry naming a module that
    holds others (Llama's ``mlp``), which PEFT refuses."""
    if not isinstance(spec, tuple):
        return
    absent = [name for name in spec
              if not any(n == name or n.endswith("." + name) for k in keys for n in full(k))]
    for name in absent if field == "target_modules" else ():
        inside = next((n for k in keys for n in full(k)
                       if n.startswith(name + ".") or f".{name}." in n), None)
        if inside is not None:   # a module holding others: PEFT's check raises on it
            raise ConfigError(
                f"{config.path}: target_modules names {name!r}, a module holding others "
                f"({inside!r} ...), which PEFT refuses (LoRA adapts Linear, Conv, Embedding "
                f"and attention projections, not the modules holding them): name the layers "
                f"inside it")
    missing = [f"{name!r}" + (f" ({near[2:]})" if (near := near_names(name, keys)) else "")
               for name in absent]
    if missing:
        warnings.warn(f"{config.path}: {field} names {'; '.join(missing)}, which is no module "
                      f"of graph {graph.name!r}: ignored, as PEFT ignores it", AdapterWarning,
                      stacklevel=3)


def near_names(name: str, keys: list[str]) -> str:
    """The module names nearest ``name``: tails of as many dotted parts as it has
    (``attention.self.query`` against ViT's ``attention.attention.query``), then the
    last names."""
    parts = name.count(".") + 1
    tails = sorted({".".join(k.split(".")[-parts:]) for k in keys} | {k.rsplit(".", 1)[-1] for k in keys})
    close = difflib.get_close_matches(name, tails, n=4, cutoff=0.5)
    return f"; near names: {', '.join(close)}" if close else ""


def dilated_conv(path: str, op: Any) -> str | None:
    """Why a LoRA adapter of layer ``path`` (``op``) cannot go to or come from PEFT, or
    None: PEFT's adapter of a Conv draws its ``lora_A`` with the conv's kernel size,
    stride and padding but not its dilation, so on a dilated conv it computes another
    function than ``mg.lora``'s (whose ``A`` has the conv's dilation, which merging
    needs), or fails on the shapes where the padding is explicit."""
    dilation = getattr(op, "dilation", 1)
    dilation = dilation if isinstance(dilation, tuple) else (dilation,)
    if "conv" not in op.op_name or all(d == 1 for d in dilation):
        return None
    return (f"layer {path!r} is a Conv with dilation {op.dilation}, and PEFT's "
            f"LoRA draws a Conv's lora_A without the dilation (kernel size, stride and padding "
            f"only): its adapter there computes another function than mlaxgraph's, whose A "
            f"has the conv's dilation, or fails on the shapes, so it is not exchanged with PEFT")
