"""verify: structural checks of a graph that may not have come from the builder
(a file, networkx, a pass or a rewrite)."""

from __future__ import annotations

from ..core.errors import GraphError, node_message
from ..core.specs import TensorSpec
from .graph import Graph, InputLayer
from .node import Node, Value
from .op import Layer
from .printer import context_lines

__all__ = ["verify", "find_cycle"]


def _fail(graph: Graph, node: Node, problem: str, **kw) -> GraphError:
    return GraphError(node_message(node.name, getattr(node.op, "op_name", "?"), problem,
                                   source=node.source, context=context_lines(graph, node.name), **kw))


def find_cycle(nodes) -> list[str] | None:
    """Names along one cycle among ``nodes`` (by their input references), or None."""
    edges = {n.name: [v.node for v in n.inputs] for n in nodes}
    state: dict[str, int] = {}
    for start in edges:
        if state.get(start):
            continue
        path, stack = [], [(start, iter(edges[start]))]
        state[start] = 1
        path.append(start)
        while stack:
            name, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[name] = 2
            elif nxt in edges and state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt in edges and not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(edges[nxt])))
    return None


def _is_value(v) -> bool:
    return (isinstance(v, Value) and isinstance(v.node, str) and isinstance(v.index, int)
            and not isinstance(v.index, bool))


def _check_record(graph: Graph, node: Node) -> None:
    """Field types of a node that may have come from a file."""
    if not isinstance(node.name, str) or not node.name or not isinstance(node.layer, str):
        raise GraphError(f"graph {graph.name!r}: node names and layers must be non-empty "
                         f"strings, got {node.name!r}, {node.layer!r}")
    if any(c in node.name or c in node.layer for c in "/#"):
        raise GraphError(f"graph {graph.name!r}: node {node.name!r} (layer {node.layer!r}): "
                         f"names cannot hold '/' (it joins the names of a path) or '#'")
    if not isinstance(node.op, Layer):
        raise GraphError(f"graph {graph.name!r}: node {node.name!r} holds {node.op!r}, not a layer")
    if not isinstance(node.inputs, tuple) or not all(_is_value(v) for v in node.inputs):
        raise _fail(graph, node, f"inputs must be a tuple of mg.Value, got {node.inputs!r}")
    if (not isinstance(node.outputs, tuple) or not node.outputs
            or not all(isinstance(s, TensorSpec) for s in node.outputs)):
        raise _fail(graph, node, f"outputs must be a non-empty tuple of TensorSpec, got {node.outputs!r}")


def verify(graph: Graph) -> Graph:
    """Checks structure; returns the graph unchanged or raises ``GraphError``.

    Requires: nothing. Ensures: node names are unique; every node holds a registered
    op; inputs are ``input`` nodes and only they; every reference names an earlier
    node and an existing output (so the graph is acyclic and in topological order);
    nodes sharing a layer hold equal ops; node names hold no ``/`` (the separator of
    paths) and no ``#``; the same for nested blocks. Memoised on the graph: a block
    called many times is checked once.
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"expected a Graph, got {type(graph).__name__}")
    memo = graph.memo("verify")
    if memo:
        return graph
    _verify(graph)
    memo["ok"] = True
    return graph


def _verify(graph: Graph) -> None:
    seen: dict[str, Node] = {}
    layers: dict[str, Node] = {}
    inputs = set(graph.inputs)
    if not isinstance(graph.name, str) or not graph.name:
        raise GraphError(f"a graph name must be a non-empty string, got {graph.name!r}")
    for name in graph.inputs:
        if not isinstance(name, str) or name not in graph:
            raise GraphError(f"graph {graph.name!r} lists input {name!r}, which is not a node")
    if len(inputs) != len(graph.inputs):
        raise GraphError(f"graph {graph.name!r} lists an input twice: {graph.inputs}")
    for node in graph.nodes:
        _check_record(graph, node)
        if node.name in seen:
            raise _fail(graph, node, "two nodes have this name")
        if isinstance(node.op, InputLayer) != (node.name in inputs):
            problem = ("an input node that is not among the graph's inputs"
                       if isinstance(node.op, InputLayer) else "listed as a graph input but not an input op")
            raise _fail(graph, node, problem)
        for v in node.inputs:
            producer = seen.get(v.node)
            if producer is None:
                if v.node in graph:
                    cycle = find_cycle(graph.nodes)
                    problem = (f"the graph has a cycle: {' -> '.join(cycle)}" if cycle else
                               f"reads %{v.node}, which comes after it (nodes must be in topological order)")
                else:
                    problem = f"reads %{v.node}, which is not a node of graph {graph.name!r}"
                raise _fail(graph, node, problem)
            if not 0 <= v.index < len(producer.outputs):
                raise _fail(graph, node, f"reads output {v.index} of %{v.node}, which has "
                                         f"{len(producer.outputs)}")
        owner = layers.setdefault(node.layer, node)
        if owner is not node and owner.op != node.op:
            raise _fail(graph, node, f"shares the weights of layer {node.layer!r} but holds another op",
                        got=repr(node.op), expected=repr(owner.op))
        inner = node.op.subgraph()
        if inner is not None:
            verify(inner)
        seen[node.name] = node
    for v in graph.outputs:
        if not _is_value(v) or v.node not in seen or not 0 <= v.index < len(seen[v.node].outputs):
            raise GraphError(f"graph {graph.name!r} returns {v}, which is not an output of any node")
    if not graph.outputs:
        raise GraphError(f"graph {graph.name!r} has no outputs")
