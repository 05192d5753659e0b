"""The explorer's data: a graph (or a compiled model) as plain JSON-ready dicts.

The page draws what this module describes and computes nothing about the model itself:
each node carries its path (as in params: ``block0/attention``), its registered op name,
its attributes, output specs, weights, FLOPs and activation bytes (as formulas of the
symbolic dims and as numbers at the given dims: the cost table's, from the program's
steps), the user's ``file:line`` and, for a compiled model, its sharding, the casts the
policy put around it and, when asked for, its optimized HLO operations.

A level of the graph is a *scope*: ``{"n": nodes, "e": edges, "i": inputs, "o": outputs}``
where an edge is ``[source index, output index, target index, input slot]``, ``i[k]`` is
``[node index, input slot]`` where input ``k`` of the enclosing block enters, and ``o[j]``
is ``[node index, output index]`` of the block's output ``j``. A nested block's node holds
its own scope in ``sub``; a run of equal consecutive blocks is folded into one node
(``fold``: the count) whose ``sub`` chains them (and hands each the run's further
inputs). A block's FLOPs and bytes are the sums of its layers'; a fold's and a scan's
(``runs``: its count; its ``sub`` is one block) are the whole run's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...compiler.flatten import flatten
from ...compiler.policy import Policy
from ...core.errors import GraphError
from ...core.specs import dtype_str, flatten_specs, is_symbolic, shape_str, trains
from ...ir.graph import Graph, InputLayer
from ...ir.printer import format_attr
from ..dot import dtype_category
from ..dot_style import layer_category
from ..summary import count_params
from .fold import fold_runs

__all__ = ["OVERLAYS", "graph_payload", "model_payload", "scope_of", "walk_payload"]

#: The overlays the page colours nodes by; a dict of numbers is the ``custom`` one.
OVERLAYS = ("dtype", "flops", "params", "activation_bytes")

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
#: Attribute texts longer than this are cut (a callable's repr, a long tuple).
ATTR_WIDTH = 200


def _text(value: Any) -> str:
    text = _ADDRESS.sub("", format_attr(value))
    return text if len(text) <= ATTR_WIDTH else text[:ATTR_WIDTH - 1] + "\u2026"


def _evaluate(value, dims: Mapping[str, int], unbound: dict[str, None]) -> int | None:
    """A formula's number at ``dims``, as the cost table evaluates it; a dim without a
    value counts as 1 (and is recorded in ``unbound``, which the page names in its
    legend)."""
    from ...analysis.cost import evaluate

    if value is None:
        return None
    names = value._get_vars() if is_symbolic(value) else ()
    for name in names:
        if name not in dims:
            unbound.setdefault(name)
    return evaluate(value, {n: int(dims.get(n, 1)) for n in names})


def _formula(value) -> str | None:
    return None if value is None else str(value).replace(" ", "")


def _sum(values):
    total = 0
    for v in values:
        total = total + v
    return total


class _Builder:
    """Walks a graph into scopes; one instance per payload."""

    def __init__(self, *, param_dtype, dims, sharding, hlo, overlay, fold: bool, program):
        self.param_dtype = np.dtype(param_dtype)
        self.dims = dict(dims)
        self.sharding = sharding or {}
        self.hlo = hlo
        self.custom = overlay
        self.fold = fold
        self.program = program
        self.steps = {step.path: step for step in program.all_steps()}
        self.unbound: dict[str, None] = {}

    # --- one node ----------------------------------------------------------------------

    def node(self, graph, node, path: str, inputs, outputs, counts, casts) -> dict:
        op = node.op
        item: dict[str, Any] = {"id": path, "name": node.name, "op": op.op_name,
                                "outs": [[dtype_str(s.dtype), shape_str(s.shape), dtype_category(s.dtype)]
                                         for s in outputs],
                                "cat": dtype_category(outputs[0].dtype) if outputs else "other"}
        if op.subgraph() is None:
            attrs = [[k, _text(v)] for k, v in op.attrs().items() if v is not None]
            if attrs:
                item["attrs"] = attrs
        if len(node.inputs) > 1:
            item["nin"] = len(node.inputs)
        if node.source is not None:
            item["src"] = str(node.source)
        if node.shares_weights:
            item["shares"] = node.layer
        trainable, state = counts.get(node.layer, (0, 0))
        item["params"] = 0 if node.shares_weights else self.count(item, trainable + state)
        if getattr(op, "inserted", False):
            item["inserted"] = True
        if path in self.sharding and self.sharding[path]:
            item["sharding"] = self.sharding[path]
        if casts.get(node.name):
            item["casts"] = casts[node.name]
        if self.hlo is not None and path in self.hlo:
            item["hlo"] = [str(o) for o in self.hlo[path]]
        if isinstance(op, InputLayer):
            if op.axes is not None:
                item["axes"] = [a if a is not None else "-" for a in op.axes]
            item["flops_f"], item["act_f"] = 0, 0
            return item
        if op.subgraph() is not None:
            return item  # totals and the nested scope are filled by the caller
        weights = []
        for kind, specs in (("param", op.param_specs(inputs)), ("state", op.state_specs(inputs))):
            for name, spec in flatten_specs(specs):
                stored = spec.stored_dtype(self.param_dtype)  # a quantized layer's int8 values do not train
                weights.append([name, shape_str(spec.shape), dtype_str(stored),
                                "trainable" if kind == "param" and trains(stored) else "non-trainable",
                                None if spec.axes is None else
                                ",".join(a if a is not None else "-" for a in spec.axes)])
        if weights:
            item["weights"] = weights
        if outputs:  # a quantized layer: by the dtype its weights are stored in
            item["cat"] = layer_category(op, inputs, outputs[0].dtype)
        item["flops_f"], item["act_f"] = self.formulas(path)
        return item

    def count(self, item: dict, count) -> int | None:
        """A weight count's number at the dims (a symbolic one, a decoding graph's caches
        for any batch, also as its formula in ``params_f``)."""
        if is_symbolic(count):
            item["params_f"] = _formula(count)
        return _evaluate(count, self.dims, self.unbound)

    def formulas(self, path: str):
        """The forward FLOPs and output bytes of the program's step at ``path``, as the
        cost table counts them (training forward, weights at the policy's dtype)."""
        from ...analysis.cost import step_formulas

        return step_formulas(self.steps[path], self.param_dtype, inference_mode=False)

    # --- one level ---------------------------------------------------------------------

    def scope(self, graph, prefix: str = "") -> dict:
        """The scope of ``graph``, a level of the hierarchy; its nodes' specs are the
        program's, bound to the top level's dims (so formulas are in them)."""
        counts = count_params(graph)
        casts = _casts_around(graph)
        index: dict[str, int] = {}
        nodes: list[dict] = []
        edges: list[list[int]] = []
        for node in graph.nodes:
            path = prefix + node.name
            inputs, outputs = self.program.node_specs(path)
            item = self.node(graph, node, path, inputs, outputs, counts, casts)
            body = node.op.subgraph()
            if body is not None:
                sub = self.scope(body, path + "/")
                item["sub"] = sub
                item["graph"] = body.name
                item["layers"] = sum(1 for n in node.op.graph.nodes
                                     if n.name not in node.op.graph.inputs)
                self.totals(item, sub["n"], self.steps.get(path))
            index[node.name] = len(nodes)
            nodes.append(item)
            for slot, v in enumerate(node.inputs):
                edges.append([index[v.node], v.index, index[node.name], slot])
        for item in nodes:
            self.finish(item)
        scope = {"n": nodes, "e": edges, "i": [[index[name], 0] for name in graph.inputs],
                 "o": [[index[v.node], v.index] for v in graph.outputs]}
        if self.fold:
            scope = fold_runs(graph, scope, self)
        return scope

    def totals(self, item: dict, members: list[dict], scan=None) -> None:
        """A block's (or a fold's) FLOPs and activation bytes: the sum of its layers'.
        A scan (``scan``: its step) draws one block of its run: its FLOPs are its
        step's, the run's (as in the cost table), and its activation bytes those of
        its blocks' layers, the run's too."""
        flops = [m.get("_flops") for m in members]
        item["flops_f"] = None if any(f is None for f in flops) else _sum(flops)
        item["act_f"] = _sum(m.get("_act", 0) for m in members)
        if scan is not None:
            item["runs"] = scan.op.length
            item["flops_f"] = self.formulas(scan.path)[0]
            item["act_f"] = item["act_f"] * scan.op.length

    def finish(self, item: dict) -> None:
        """Formulas to text and numbers (the objects themselves are not JSON)."""
        if "flops_f" not in item:
            return
        flops, act = item.pop("flops_f"), item.pop("act_f")
        item["flops"] = _formula(flops)
        item["flops_v"] = _evaluate(flops, self.dims, self.unbound)
        item["act"] = _formula(act)
        item["act_v"] = _evaluate(act, self.dims, self.unbound)
        item["_flops"], item["_act"] = flops, act  # kept for folds; dropped at the end
        if self.custom is not None:
            value = self.custom.get(item["id"])
            if value is None and "sub" in item:  # a block: the sum of what its layers have
                inner = [m["val"] for m in item["sub"]["n"] if "val" in m]
                value = sum(inner) if inner else None
            if value is not None:
                item["val"] = value


def _casts_around(graph) -> dict[str, list[str]]:
    """Node name -> the policy-inserted casts that feed it or read it."""
    result: dict[str, list[str]] = {}
    for node in graph.nodes:
        if getattr(node.op, "inserted", False):
            for v in node.inputs:
                result.setdefault(v.node, []).append(
                    f"{node.name}: casts the output to {dtype_str(node.outputs[0].dtype)}")
    for node in graph.nodes:
        for v in node.inputs:
            source = graph.node(v.node)
            if getattr(source.op, "inserted", False) and not getattr(node.op, "inserted", False):
                result.setdefault(node.name, []).append(
                    f"{source.name}: casts the input to {dtype_str(source.outputs[0].dtype)}")
    return result


def walk_payload(scope: dict):
    """Every node dict of a scope, nested scopes' included (depth first)."""
    for item in scope["n"]:
        yield item
        if "sub" in item:
            yield from walk_payload(item["sub"])


def _strip(scope: dict) -> None:
    for item in walk_payload(scope):
        item.pop("_flops", None)
        item.pop("_act", None)


def _check_overlay(overlay, paths: set[str]):
    """``(initial overlay name, custom values or None)``; ``GraphError`` for anything else."""
    if overlay is None or (isinstance(overlay, str) and overlay in OVERLAYS):
        return overlay or "dtype", None
    if isinstance(overlay, str):
        raise GraphError(f"overlay must be one of {', '.join(OVERLAYS)} or a dict of layer "
                         f"path -> number, got {overlay!r}")
    if not isinstance(overlay, Mapping):
        raise GraphError(f"overlay must be one of {', '.join(OVERLAYS)} or a dict of layer "
                         f"path -> number, got {type(overlay).__name__}")
    values = {}
    for key, value in overlay.items():
        if not isinstance(key, str):
            raise GraphError(f"overlay keys are layer paths (str), got {key!r}")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise GraphError(f"overlay[{key!r}] must be a number, got {value!r}")
        if not np.isfinite(float(value)):
            raise GraphError(f"overlay[{key!r}] must be finite, got {value!r}")
        values[key] = float(value)
    unknown = sorted(set(values) - paths)
    if unknown:
        raise GraphError(f"overlay names {unknown[0]!r}, which is no layer path of the graph "
                         f"(paths look like 'block0/attention')")
    return "custom", values




def scope_of(graph, *, param_dtype="float32", dims=None, sharding=None, hlo=None,
             overlay=None, fold: bool = True, program=None) -> tuple[dict, dict]:
    """The root scope of ``graph`` and the facts about it the page needs (``overlay``
    chosen, which dims were left at 1); ``program``: the graph's flattened program
    (a compiled model's; made here for a plain graph)."""
    if not isinstance(graph, Graph):
        raise GraphError(f"the explorer draws an mg.Graph or mg.CompiledModel, got "
                         f"{type(graph).__name__}")
    dims = dict(dims or {})
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise GraphError(f"dim {name}={value!r}: dims are non-negative ints (batch=8)")
    program = program if program is not None else flatten(graph)
    initial, custom = _check_overlay(overlay, set(program.all_paths()))
    builder = _Builder(param_dtype=param_dtype, dims=dims, sharding=sharding, hlo=hlo,
                       overlay=custom, fold=fold, program=program)
    root = builder.scope(graph)
    _strip(root)
    facts = {"overlay": initial, "custom": custom is not None,
             "dims": {k: int(v) for k, v in dims.items()}, "unbound": list(builder.unbound)}
    return root, facts


def _params(graph, dims, facts: dict) -> dict:
    """The page's weight count: its number at the dims (a dim without a value at 1, as
    named in ``facts``) and, when symbolic, its formula (``params_f``)."""
    total = _sum(t + s for t, s in count_params(graph).values())
    unbound = dict.fromkeys(facts["unbound"])
    value = _evaluate(total, dict(dims or {}), unbound)
    facts["unbound"] = list(unbound)
    return {"params": value, "params_f": _formula(total)} if is_symbolic(total) else {"params": int(total)}


def graph_payload(graph, *, overlay=None, dims=None, title: str | None = None,
                  fold: bool = True) -> dict:
    """The page data of a graph (see the module's docstring)."""
    root, facts = scope_of(graph, dims=dims, overlay=overlay, fold=fold)
    return {"version": 1, "title": title or graph.name, "graph": graph.name,
            **_params(graph, dims, facts), "compiled": False, "policy": None,
            "root": root, **facts}


def model_payload(model, *, overlay=None, dims=None, hlo: bool = False,
                  title: str | None = None, fold: bool = True) -> dict:
    """The page data of a compiled model: its compiled graph (inserted casts as nodes),
    weights at the policy's ``param_dtype``, sharding labels with a mesh and, with
    ``hlo=True``, each layer's optimized HLO operations (needs every symbolic dim)."""
    policy = model.policy or Policy()
    by_layer = model.hlo_by_layer(optimized=True, **(dims or {})) if hlo else None
    sharding = None if model.sharding is None else model.sharding.labels()
    root, facts = scope_of(model.graph, param_dtype=policy.param_dtype, dims=dims,
                           sharding=sharding, hlo=by_layer, overlay=overlay, fold=fold,
                           program=model.program)
    return {"version": 1, "title": title or model.graph.name, "graph": model.graph.name,
            **_params(model.graph, dims, facts), "compiled": True,
            "policy": None if model.policy is None else repr(model.policy),
            "hlo": bool(hlo), "root": root, **facts}
