"""eliminate_dead_nodes: drop nodes no output depends on."""

from __future__ import annotations

from ...ir.graph import Graph

__all__ = ["eliminate_dead_nodes"]


def eliminate_dead_nodes(graph: Graph) -> Graph:
    """Requires: a verified graph. Ensures: every node but the inputs (which ``apply``
    takes positionally, used or not) feeds some output; the same inside blocks."""
    live = {v.node for v in graph.outputs} | set(graph.inputs)
    for node in reversed(graph.nodes):
        if node.name in live:
            live.update(v.node for v in node.inputs)
    nodes = []
    for node in graph.nodes:
        if node.name not in live:
            continue
        inner = node.op.subgraph()
        if inner is not None:
            op = node.op.with_subgraph(eliminate_dead_nodes(inner))
            if op is not node.op:
                node = node.replace(op=op)
        nodes.append(node)
    if len(nodes) == len(graph.nodes) and all(a is b for a, b in zip(nodes, graph.nodes)):
        return graph
    return graph.replace(nodes=tuple(nodes))
