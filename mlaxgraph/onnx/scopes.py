"""Node-name scopes as nested blocks: exporters name nodes by the module that made
them (``/layer1/layer1.0/conv1/Conv``), and ``from_onnx`` rebuilds that hierarchy, so
summaries, pictures and the explorer show an ONNX model's modules.

The graph read flat is replayed level by level: the nodes of one scope (``layer1``)
become a graph, called as a block named after the scope, its inputs the values the
scope reads from outside and its outputs those read outside it; its weights nest
under its name (``params["layer1"]["layer1.0"]["conv1"]["kernel"]``). A scope holding
a single operation is not a block: the operation takes the scope's name; a scope
holding a single layer named after a module inside it (a ``Sequential`` around one
``Conv``: ``/downsample/downsample.0/Conv``) is a block holding that layer, so each
module the exporter named is drawn. A shared layer's later calls (a tied head's
``embedding.attend``) call the layer its first call made, in the same block. A weight or constant
moves into the scope of the nodes reading it when they share one. When the scopes
do not nest (a scope that reads a value computed from its own output outside it),
the graph stays flat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp

from ..ir.graph import Graph, Input
from ..ir.node import Value
from ..ops.embedding import Embedding

__all__ = ["nest"]

_CARRIERS = ("param", "onnx.constant")


class _Cycle(Exception):
    """The scopes at one level depend on each other both ways."""


def _fresh(name: str, used: set[str]) -> str:
    base, n = name or "node", 1
    while name in used or not name:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


class _Nester:
    def __init__(self, graph: Graph, places: Mapping[str, tuple[tuple[str, ...], str]],
                 params: Mapping, state: Mapping, modules: frozenset[str] = frozenset()):
        self.graph, self.places, self.modules = graph, dict(places), modules
        self.flat_params, self.flat_state = params, state
        self.params: dict = {}
        self.state: dict = {}
        #: layer name -> (the layer emitted for its first call, the block path holding it)
        self.shared: dict[str, tuple[Any, tuple[str, ...]]] = {}
        consumers = graph.consumers()
        # weights and constants move into the scope of all their readers
        for node in graph.nodes:
            if node.op.op_name in _CARRIERS:
                readers = [self.places.get(c.name, ((), c.name))[0]
                           for c in consumers.get(node.name, ())]
                common = readers[0] if readers else ()
                for r in readers[1:]:
                    k = 0
                    while k < min(len(common), len(r)) and common[k] == r[k]:
                        k += 1
                    common = common[:k]
                self.places[node.name] = (common, node.name)

    def place(self, node) -> tuple[tuple[str, ...], str]:
        return self.places.get(node.name, ((), node.name))

    def run(self) -> tuple[Graph, dict, dict]:
        g = self.graph
        env: dict[Value, Any] = {}
        inputs = []
        for name in g.inputs:
            spec = g.spec(Value(name, 0))
            x = Input(spec.shape, spec.dtype, name=name)
            env[Value(name, 0)] = x
            inputs.append(x)
        body = [n for n in g.nodes if n.name not in g.inputs]
        self.level(body, 0, env, (), set(g.inputs))
        outputs = [env[v] for v in g.outputs]
        return Graph(inputs=inputs, outputs=outputs, name=g.name), self.params, self.state

    def level(self, nodes: list, depth: int, env: dict, path: tuple[str, ...],
              used: set[str]) -> None:
        """Emits ``nodes`` (all within ``path``) at this level, grouped by the scope
        component at ``depth``."""
        try:
            order, groups = self.grouped(nodes, depth, path)
        except _Cycle:
            # a layer named after a module (a Gemm read as the Linear ``c_attn``) whose
            # scope holds operations before and after it (GPT-2's Conv1D reshapes
            # around it) sits inside that scope's block, under the module's name
            keys = {self.place(n)[0][depth] for n in nodes if len(self.place(n)[0]) > depth}
            for node in nodes:
                scope, local = self.place(node)
                if len(scope) == depth and local in keys and node.op.op_name not in _CARRIERS:
                    self.places[node.name] = (scope + (local,), local)
            order, groups = self.grouped(nodes, depth, path)
        for kind, item in order:
            if kind == "node":
                self.emit(item, env, path, used)
            else:
                self.block(item, groups[item], depth, env, path, used)

    def grouped(self, nodes: list, depth: int, path: tuple[str, ...]) -> tuple[list, dict]:
        """The level's items in an order where each reads only values made before it
        (``("node", node)`` or ``("group", key)``) and each group's nodes."""
        groups: dict[str, list] = {}
        order: list[tuple[str, Any]] = []
        for node in nodes:
            scope, _ = self.place(node)
            if len(scope) > depth:
                key = scope[depth]
                if key not in groups:
                    groups[key] = []
                    order.append(("group", key))
                groups[key].append(node)
            else:
                order.append(("node", node))
        # a group of one operation (and the weights it alone reads) is that operation,
        # named after the scope; a group of one layer named after a module of its own
        # (downsample.0 in downsample) stays a block
        for key in list(groups):
            compute = [n for n in groups[key] if n.op.op_name not in _CARRIERS]
            if len(compute) == 1 and all(len(self.place(n)[0]) == depth + 1 for n in groups[key]) \
                    and (compute[0].name not in self.modules or self.place(compute[0])[1] == key):
                node = compute[0]
                for n in groups[key]:
                    if n is node:
                        self.places[n.name] = (path, key)
                    else:
                        self.places[n.name] = (path, self.place(n)[1])
                index = order.index(("group", key))
                order[index:index + 1] = [("node", n) for n in groups.pop(key)]
        return self._sorted(order, groups), groups

    def _sorted(self, order: list, groups: dict) -> list:
        """The items in an order where each reads only values made before it."""
        member = {n.name: ("group", key) for key, ns in groups.items() for n in ns}
        for kind, item in order:
            if kind == "node":
                member[item.name] = ("node", item)

        def needs(entry):
            kind, item = entry
            ns = [item] if kind == "node" else groups[item]
            inside = {n.name for n in ns}
            return {member[v.node] if member[v.node][0] == "group" else ("node", v.node)
                    for n in ns for v in n.inputs
                    if v.node in member and v.node not in inside}

        done: set = set()
        result = []
        pending = list(order)
        while pending:
            progressed = False
            for entry in list(pending):
                want = {(k, i if k == "group" else i) for k, i in needs(entry)}
                if want <= done:
                    kind, item = entry
                    done.add((kind, item if kind == "group" else item.name))
                    result.append(entry)
                    pending.remove(entry)
                    progressed = True
            if not progressed:
                raise _Cycle()
        return result

    def emit(self, node, env: dict, path: tuple[str, ...], used: set[str]) -> None:
        if node.layer in self.shared:
            # a later call of a shared layer (a tied head: embedding.attend) calls the
            # layer emitted first, in the same block; across blocks the graph stays flat
            op, where = self.shared[node.layer]
            if where != path:
                raise _Cycle()
            args = [env[v] for v in node.inputs]
            attend = isinstance(op, Embedding) and jnp.issubdtype(args[0].dtype, jnp.floating)
            result = op.attend(*args) if attend else op(*args)
            outs = result if isinstance(result, tuple) else (result,)
            for i, out in enumerate(outs):
                env[Value(node.name, i)] = out
            return
        _, local = self.place(node)
        name = _fresh(local, used)
        op = dataclasses.replace(node.op, name=name)
        object.__setattr__(op, "_created_at", node.op.__dict__.get("_created_at"))
        self.shared[node.layer] = (op, path)
        result = op(*[env[v] for v in node.inputs])
        outs = result if isinstance(result, tuple) else (result,)
        for i, out in enumerate(outs):
            env[Value(node.name, i)] = out
        if node.layer in self.flat_params:
            _set(self.params, path + (name,), self.flat_params[node.layer])
        if node.layer in self.flat_state:
            _set(self.state, path + (name,), self.flat_state[node.layer])

    def block(self, key: str, nodes: list, depth: int, env: dict, path: tuple[str, ...],
              used: set[str]) -> None:
        inside = {n.name for n in nodes}
        reads: list[Value] = []
        for n in nodes:
            for v in n.inputs:
                if v.node not in inside and v not in reads:
                    reads.append(v)
        wanted = set(self.graph.outputs)
        for n in self.graph.nodes:
            if n.name not in inside:
                wanted.update(v for v in n.inputs if v.node in inside)
        writes = [Value(n.name, i) for n in nodes for i in range(len(n.outputs))
                  if Value(n.name, i) in wanted]
        if not reads or not writes:  # a graph needs inputs and outputs: no block
            for n in nodes:
                self.emit(n, env, path, used)
            return
        name = _fresh(key, used)
        inner_env: dict[Value, Any] = {}
        inner_used: set[str] = set()
        inputs = []
        for v in reads:
            spec = self.graph.spec(v)
            x = Input(spec.shape, spec.dtype, name=_fresh(f"{v.node}_{v.index}" if v.index
                                                           else v.node, inner_used))
            inner_env[v] = x
            inputs.append(x)
        self.level(nodes, depth + 1, inner_env, path + (name,), inner_used)
        sub = Graph(inputs=inputs, outputs=[inner_env[v] for v in writes], name=name)
        result = sub.as_block(name=name)(*[env[v] for v in reads])
        outs = result if isinstance(result, tuple) else (result,)
        for v, out in zip(writes, outs):
            env[v] = out


def nest(graph: Graph, places: Mapping[str, tuple[tuple[str, ...], str]], params: Mapping,
         state: Mapping, modules: Iterable[str] = ()) -> tuple[Graph, dict, dict]:
    """The graph with its nodes grouped into nested blocks by ``places`` (node name ->
    (scope path, name within it)), and its weights nested to match; the graph as it
    is when the scopes do not nest or there are none. ``modules``: the nodes whose
    name within their scope is a module's (a layer a pattern made)."""
    if not any(scope for scope, _ in places.values()):
        return graph, dict(params), dict(state)
    try:
        return _Nester(graph, places, params, state, frozenset(modules)).run()
    except _Cycle:
        return graph, dict(params), dict(state)
