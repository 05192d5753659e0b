"""remove_redundant_casts: fold the casts that change nothing or undo each other."""

from __future__ import annotations

import dataclasses

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.rewrite import Rewrite, Rule, rewrite
from ...ops.cast import Cast

__all__ = ["remove_redundant_casts"]


@dataclasses.dataclass(frozen=True)
class _RemoveRedundantCasts(Rule):
    def prepare(self, graph: Graph):
        # inserted cast's output -> what it casts; (value, dtype) -> the one inserted cast
        return {}, {}

    def visit(self, node: Node, rewrite: Rewrite):
        op = node.op
        if not isinstance(op, Cast):
            return None
        inserted_input, merged = rewrite.data
        (x,) = node.inputs
        if op.inserted and x in inserted_input:
            x = inserted_input[x]
        if rewrite.spec(x).dtype == op.dtype:
            return (x,)
        if op.inserted:
            key = (x, str(op.dtype))
            if key in merged:
                return (merged[key],)
            merged[key] = node.value()
            inserted_input[node.value()] = x
        return None if x == node.inputs[0] else node.replace(inputs=(x,))


def remove_redundant_casts(graph: Graph) -> Graph:
    """Removes casts to the dtype a value already has, folds a policy cast of a policy
    cast into one cast of the original value (a round trip into none), and merges
    policy casts of one value to one dtype.

    Requires: a verified graph. Ensures: no Cast node is an identity; no inserted
    Cast reads another inserted Cast; at most one inserted Cast per (value, dtype).
    Casts the user wrote are only removed when they are identities. Casts left
    without readers are removed by ``eliminate_dead_nodes``.
    """
    return rewrite(graph, _RemoveRedundantCasts())
