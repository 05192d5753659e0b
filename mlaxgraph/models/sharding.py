"""The zoo's sharding rules: the Megatron layout for the Transformers, data parallelism
for the convolutional networks.

The builders name their weights' logical axes so that one rule set gives Megatron's
tensor parallelism: the query/key/value projections and the MLP's up-projections are
column-parallel (split on ``"heads"`` / ``"mlp"``), the attention's output projection
and the MLP's down-projection row-parallel (their input dim split the same way, their
output whole), so each attention and each MLP ends in one all-reduce of its output.
"""

from __future__ import annotations

import difflib
from typing import Any

from jax.sharding import Mesh

from ..compiler.flatten import flatten
from ..core.errors import ShardingError
from ..ir.graph import Graph

__all__ = ["sharding_rules", "FAMILIES"]

_TRANSFORMERS = ("gpt2", "bert", "vit", "llama", "qwen2")
_CONVOLUTIONAL = ("resnet18", "resnet34", "resnet50", "unet")
#: The families ``sharding_rules`` knows, by the graph names the builders give.
FAMILIES = _TRANSFORMERS + _CONVOLUTIONAL


def _kv_heads(graph: Graph) -> set[int]:
    """The key/value head counts of the graph's attention layers."""
    layers: list[Any] = [step.op for step in flatten(graph).owners()
                         if step.op.op_name == "multi_head_attention"]
    return {layer.kv_heads for layer in layers}


def sharding_rules(model: Graph | str, mesh: Mesh | None = None, *, data: str = "data",
                   model_axis: str = "model") -> dict[str, Any]:
    """The rules that shard a zoo model as its family is sharded at scale, for
    ``mg.compile(graph, mesh=mesh, rules=...)``.

    Transformers (``gpt2``, ``bert``, ``vit``, ``llama``, ``qwen2``): the batch on the
    ``data`` mesh axis; Megatron's tensor parallelism on ``model_axis``: ``"heads"``,
    ``"kv_heads"`` and ``"mlp"``. Key/value heads fewer than the ``model_axis`` devices
    (or not divisible by them) are replicated, as MaxText does: with a graph and a
    mesh given, the ``"kv_heads"`` rule is left out then. ResNets and the U-Net: the
    batch on ``data`` (data parallelism). Rules for mesh axes the mesh lacks are left
    out (a 1-D ``("data",)`` mesh gets data parallelism only); a mesh with neither
    axis, or an axis one letter from ``data`` or ``model_axis`` where that one is
    missing, is a ``ShardingError`` naming them.

    Args:
      model: a graph a zoo builder made, or its family's name (``"llama"``).
      mesh: the mesh the rules are for; None keeps every rule.
      data: the name of the mesh's data axis.
      model_axis: the name of the mesh's model axis.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.models.sharding_rules("gpt2")
      {'batch': 'data', 'heads': 'model', 'kv_heads': 'model', 'mlp': 'model'}
    """
    family = model.name if isinstance(model, Graph) else model
    if family not in FAMILIES:
        raise ShardingError(f"sharding_rules knows the zoo's families ({', '.join(FAMILIES)}); got "
                            f"{family!r}: write the rules for this graph's logical axes yourself")
    rules: dict[str, Any] = {"batch": data}
    if family in _TRANSFORMERS:
        rules.update({"heads": model_axis, "kv_heads": model_axis, "mlp": model_axis})
    if mesh is None:
        return rules
    axes = tuple(mesh.shape)
    named = [name for name in (data, model_axis) if name in axes]
    if not named:  # a mesh of other names: every rule left out, all replicated
        raise ShardingError(f"sharding_rules: the mesh's axes {axes} include neither the data "
                            f"axis {data!r} nor the model axis {model_axis!r}: name yours "
                            f"(sharding_rules(graph, mesh, data={axes[0]!r}"
                            + (f", model_axis={axes[1]!r}" if len(axes) > 1 else "") + "))")
    for given, keyword in ((data, "data"), (model_axis, "model_axis")):
        if given not in axes and len(axes) > len(named):
            near = difflib.get_close_matches(given, [a for a in axes if a not in named], n=1)
            if near:  # a misspelt axis: its rules silently left out
                raise ShardingError(f"sharding_rules: the mesh has no axis {given!r} "
                                    f"({keyword}=); did you mean {near[0]!r}? its axes: {axes}")
    rules = {k: v for k, v in rules.items() if v in mesh.shape}
    if "kv_heads" in rules and isinstance(model, Graph):
        size = mesh.shape[model_axis]
        if any(count % size for count in _kv_heads(model)):
            del rules["kv_heads"]  # fewer (or not divisible): replicated on every device
    return rules
