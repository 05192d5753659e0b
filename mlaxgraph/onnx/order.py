"""The order ``from_onnx`` reads an ONNX graph's nodes in, and the values that must
be known when it is built: a node is read after the nodes computing what it reads
(its inputs, and what its bodies read around them); the values at the operators'
static input positions (a ``Reshape``'s shape) and those they are computed from are
static, an ahead-of-time compiler (``backend.py``) takes the graph inputs among them
as constants."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..core.errors import GraphError
from .layer import TABLE
from .ops_control import free_names
from .sequences import OPS, STATIC, STRUCTURAL

__all__ = ["static_inputs"]


def static_inputs(model: Any) -> set[str]:
    """The names of the values that must be constants when the graph is built: those
    at the static input positions of the operators (a ``Reshape``'s shape) and,
    through the nodes computing them, the values they are computed from (a ``Shape``
    needs only its input's shape, known when the graph is built)."""
    return _static_values(model.graph)


def _static_values(graph: Any) -> set[str]:
    needed: set[str] = set()
    for node in reversed(list(graph.node)):
        op = TABLE.get(node.op_type)
        bodies = [a.g for a in node.attribute if a.HasField("g")]
        structural = node.op_type in ("Shape", "Size") + STRUCTURAL
        if not structural and any(out in needed for out in node.output):
            needed.update(i for i in _reads(node) if i)  # a body's reads around it too
        static = op.static if op is not None else STATIC.get(node.op_type, ())
        needed.update(node.input[p] for p in static if p < len(node.input) and node.input[p])
        if node.op_type == "If" and node.input and any(n.op_type in OPS for b in bodies
                                                        for n in b.node):
            needed.add(node.input[0])  # a branch making a sequence is read when picked
        for body in bodies:
            # an If's branch (a Loop's body) setting a shape from a value around it
            needed.update(_static_values(body) & free_names(body))
    return needed


def _reads(node: Any) -> list[str]:
    """The values a node reads: its inputs, and those its bodies read from around them."""
    bodies = [a.g for a in node.attribute if a.HasField("g")]
    return list(node.input) + (sorted(set().union(*(free_names(g) for g in bodies))) if bodies else [])


def _where(node: Any) -> str:
    return f"node {node.name or '(unnamed)'!r} ({node.op_type})"


def _toposort(nodes: list, known: set[str], defined: Collection[str] = ()) -> list:
    """The nodes in an order that reads each value after the node computing it. Each
    value is assigned once (ONNX's single static assignment): a node writing another
    node's output or one of ``defined`` (the graph's inputs and initializers) is a
    ``GraphError`` naming both."""
    producers: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for out in n.output:
            if not out:
                continue
            if out in producers or out in defined:
                first = (f"{_where(nodes[producers[out]])} writes it too" if out in producers
                         else "it is a graph input or an initializer")
                raise GraphError(f"{_where(n)} writes {out!r}, but {first}; an ONNX graph "
                                 f"assigns each value once (onnx.checker refuses the file)")
            producers[out] = i
    order, state = [], [0] * len(nodes)
    for start in range(len(nodes)):
        stack = [(start, 0)]
        while stack:
            i, k = stack.pop()
            if k == 0:
                if state[i] == 2:
                    continue
                if state[i] == 1:
                    raise GraphError(f"the ONNX graph has a cycle through node "
                                     f"{nodes[i].name or nodes[i].op_type!r} ({nodes[i].op_type})")
                state[i] = 1
            deps = [producers[v] for v in _reads(nodes[i]) if v in producers and v not in known]
            if k < len(deps):
                stack.append((i, k + 1))
                if state[deps[k]] != 2:
                    if state[deps[k]] == 1:
                        raise GraphError(f"the ONNX graph has a cycle through node "
                                         f"{nodes[i].name or nodes[i].op_type!r} "
                                         f"({nodes[i].op_type})")
                    stack.append((deps[k], 0))
                continue
            state[i] = 2
            order.append(nodes[i])
    return order
