"""What a program computes: the nodes its outputs depend on, and the buffers it updates
(``self.count += 1``, an EMA ``self.ema.mul_(0.9).add_(...)``: torch.export's
``buffer_mutation`` outputs) as new state. A BatchNorm layer keeps its running
statistics itself, and its ``num_batches_tracked`` (read only by ``momentum=None``) is
written as 0, so those updates are left out; every other buffer's update is the new
value of its ``aten.buffer`` layer's state, as PyTorch's module holds it after the call."""

from __future__ import annotations

from typing import Any

from ..core.errors import GraphError

__all__ = ["buffer_updates", "live_nodes"]


def _refs(value: Any):
    if isinstance(value, dict) and "ref" in value:
        yield value["ref"]
    elif isinstance(value, (list, dict)):
        for v in (value.values() if isinstance(value, dict) else value):
            yield from _refs(v)


def buffer_updates(record: dict, is_layer: Any) -> dict[str, str]:
    """The updates carried as new state: the node holding a buffer's new value -> the
    buffer's input (placeholder) name; ``is_layer(node)``: whether a batch norm node is
    one of our layers (which keeps its statistics). An update of a buffer the state
    dict leaves out (``persistent=False``) is an ``mg.GraphError`` naming it."""
    by_name = {n["name"]: n for n in record["nodes"]}
    placeholders = {i["target"]: i for i in record["inputs"] if i["kind"] == "buffer"}
    updates = {}
    for node_name, target in record["mutations"].items():
        made = by_name.get(node_name)
        while made is not None and made["target"] == "getitem":
            made = by_name.get(made["args"][0].get("ref")) if isinstance(made["args"][0], dict) else None
        if (made is not None and "batch_norm" in made["target"] and is_layer(made)) or \
                target.rpartition(".")[2] == "num_batches_tracked":
            continue  # the BatchNorm layer's own
        entry = placeholders.get(target)
        if entry is None or entry.get("persistent") is False:
            raise GraphError(f"the module updates its buffer {target!r} in forward, which its "
                             f"state dict leaves out (persistent=False): mlaxgraph carries a "
                             f"buffer's updates as the graph's state; register it persistent")
        updates[node_name] = entry["name"]
    return updates


def live_nodes(record: dict, updates: dict[str, str]) -> list[dict]:
    """The nodes the module's outputs and the buffers' new values depend on."""
    by_name = {n["name"]: n for n in record["nodes"]}
    wanted = [record["outputs"][i] for i in record["user_outputs"]]
    stack = [r for w in wanted for r in _refs(w)] + list(updates)
    live: set[str] = set()
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        node = by_name[name]
        stack.extend(_refs(node["args"]))
        stack.extend(_refs(node["kwargs"]))
    return [n for n in record["nodes"] if n["name"] in live]
