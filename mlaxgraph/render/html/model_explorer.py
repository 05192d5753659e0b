"""A graph in Google Model Explorer's JSON graph format, with node-data files for the
overlays, so that Model Explorer (``pip install ai-edge-model-explorer``) opens it.

The graph file is one graph collection, ``{"label": ..., "graphs": [graph]}``, as the
Model Explorer app loads a ``.json`` file. Each layer is an op node whose ``id`` is its
path (``block0/attention``), its ``label`` its name and its ``namespace`` the path of the
blocks holding it, so Model Explorer draws nested blocks as layers to expand; a block's
inputs are its input nodes inside it, and edges into and out of a block are wired to the
nodes inside. Each node has its op and attributes in ``attrs``, its outputs' shapes and
dtypes in ``outputsMetadata``.

A node-data file (``<stem>.<overlay>.json``) holds one number per node (``results``)
with a colour ``gradient``, keyed by the graph's id, as Model Explorer's "node data"
expects; one is written for FLOPs, params and activation bytes, and one for the values
passed as ``overlay``.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from .page import check_dims, write_page
from .payload import scope_of, walk_payload

__all__ = ["model_explorer_graph", "model_explorer_node_data", "write_model_explorer",
           "NODE_DATA"]

#: Overlay -> the payload field holding its number, for the node-data files.
NODE_DATA = {"flops": "flops_v", "params": "params", "activation_bytes": "act_v"}

_GRADIENT = [{"stop": 0, "bgColor": "#fff7ec"}, {"stop": 0.5, "bgColor": "#fc8d59"},
             {"stop": 1, "bgColor": "#7f0000"}]


def _kv(key: str, value: Any) -> dict:
    return {"key": key, "value": str(value)}


def _emit(scope: dict, namespace: str, entry: dict, nodes: list[dict]) -> list[tuple[str, str]]:
    """Appends the op nodes of ``scope`` to ``nodes``; ``entry``: scope input k -> the
    (node id, output id) feeding it. Returns the (node id, output id) of each output."""
    into: dict[int, dict[int, tuple[str, str]]] = {}
    for k, (index, slot) in enumerate(scope["i"]):
        if k in entry:
            into.setdefault(index, {})[slot] = entry[k]
    incoming: dict[int, list] = {}
    for source, out, target, slot in (e[:4] for e in scope["e"]):
        incoming.setdefault(target, []).append((slot, source, out))
    results: dict[int, Any] = {}

    def source_of(index: int, out: int) -> tuple[str, str]:
        value = results[index]
        return value[out] if isinstance(value, list) else (value, str(out))

    for index, item in enumerate(scope["n"]):
        sources = dict(into.get(index, {}))
        for slot, source, out in incoming.get(index, []):
            sources[slot] = source_of(source, out)
        if "sub" in item:
            results[index] = _emit(item["sub"], item["id"], sources, nodes)
            continue
        attrs = [_kv("op", item["op"])] + [_kv(k, v) for k, v in item.get("attrs", [])]
        attrs.append(_kv("params", item.get("params", 0)))
        if item.get("flops") is not None:
            attrs.append(_kv("flops", item["flops"]))
        if item.get("act") is not None:
            attrs.append(_kv("activation_bytes", item["act"]))
        for name, shape, dtype, kind, axes in item.get("weights", []):
            attrs.append(_kv(f"weight {name}", f"{dtype}{shape} {kind}" + (f" axes {axes}" if axes else "")))
        for key, field in (("shares_weights_with", "shares"), ("sharding", "sharding"),
                           ("source", "src")):
            if item.get(field):
                attrs.append(_kv(key, item[field]))
        nodes.append({
            "id": item["id"], "label": item["name"], "namespace": namespace,
            "attrs": attrs,
            "incomingEdges": [{"sourceNodeId": s, "sourceNodeOutputId": o,
                               "targetNodeInputId": str(slot)}
                              for slot, (s, o) in sorted(sources.items())],
            "outputsMetadata": [{"id": str(j), "attrs": [_kv("shape", shape), _kv("dtype", dtype),
                                                         _kv("tensor_name", f"{item['id']}:{j}")]}
                                for j, (dtype, shape, _) in enumerate(item["outs"])],
        })
        results[index] = item["id"]
    return [source_of(index, out) for index, out in scope["o"]]


def model_explorer_graph(graph, *, dims=None, root: dict | None = None) -> dict:
    """The graph collection (a dict ready for ``json.dumps``)."""
    if root is None:
        root, _ = scope_of(graph, dims=dims, fold=False)
    nodes: list[dict] = []
    _emit(root, "", {}, nodes)
    return {"label": graph.name, "graphs": [{"id": graph.name, "nodes": nodes}]}


def model_explorer_node_data(graph_id: str, root: dict, field: str) -> dict:
    """A node-data file's content: ``{graph id: {"results": {node id: {"value": v}},
    "gradient": [...]}}`` over the op nodes that have a number."""
    results = {}
    for item in walk_payload(root):
        if "sub" in item:
            continue
        value = item.get(field)
        if value is not None:
            results[item["id"]] = {"value": value}
    return {graph_id: {"results": results, "gradient": _GRADIENT}}


def write_model_explorer(graph, path: Any, *, overlay=None, **dims: int) -> list[pathlib.Path]:
    """Writes ``path`` (the graph) and beside it ``<stem>.flops.json``,
    ``<stem>.params.json``, ``<stem>.activation_bytes.json`` and, for an ``overlay`` dict
    of layer path -> number, ``<stem>.values.json``; returns the paths, graph first.

    Args:
      graph: an ``mg.Graph`` (a compiled model's is ``model.graph``).
      path: the graph file to write, e.g. ``"model.json"``.
      overlay: a dict of layer path -> number for a node-data file of its own.
      **dims: values of symbolic dims for the numbers (a dim without one counts as 1).
    """
    check_dims("to_model_explorer", graph, dims, ["overlay"])
    if isinstance(overlay, str):
        overlay = None  # a named overlay: its file is written anyway
    root, _ = scope_of(graph, dims=dims, overlay=overlay, fold=False)
    path = pathlib.Path(os.fspath(path))
    written = [write_page(path, json.dumps(model_explorer_graph(graph, root=root), indent=1))]
    stem = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    fields = dict(NODE_DATA)
    if overlay is not None:
        fields["values"] = "val"
    for name, field in fields.items():
        data = model_explorer_node_data(graph.name, root, field)
        written.append(write_page(path.with_name(f"{stem}.{name}.json"), json.dumps(data, indent=1)))
    return written
