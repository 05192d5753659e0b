"""eliminate_dead_nodes: drop nodes no output depends on."""

from __future__ import annotations

import dataclasses

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.rewrite import Rewrite, Rule, rewrite

__all__ = ["eliminate_dead_nodes"]


@dataclasses.dataclass(frozen=True)
class _EliminateDeadNodes(Rule):
    def prepare(self, graph: Graph) -> set[str]:
        live = {v.node for v in graph.outputs} | set(graph.inputs)
        for node in reversed(graph.nodes):
            if node.name in live:
                live.update(v.node for v in node.inputs)
        return live

    def visit(self, node: Node, rewrite: Rewrite):
        return None if node.name in rewrite.data else ()


def eliminate_dead_nodes(graph: Graph) -> Graph:
    """Requires: a verified graph. Ensures: every node but the inputs (which ``apply``
    takes positionally, used or not) feeds some output; the same inside blocks."""
    return rewrite(graph, _EliminateDeadNodes())
