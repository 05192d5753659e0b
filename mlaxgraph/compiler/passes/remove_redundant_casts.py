"""remove_redundant_casts: fold the casts that change nothing or undo each other."""

from __future__ import annotations

from ...core.specs import TensorSpec
from ...ir.graph import Graph
from ...ir.node import Node, Value
from ...ops.cast import Cast

__all__ = ["remove_redundant_casts"]


def remove_redundant_casts(graph: Graph) -> Graph:
    """Removes casts to the dtype a value already has, folds a policy cast of a policy
    cast into one cast of the original value (a round trip into none), and merges
    policy casts of one value to one dtype.

    Requires: a verified graph. Ensures: no Cast node is an identity; no inserted
    Cast reads another inserted Cast; at most one inserted Cast per (value, dtype).
    Casts the user wrote are only removed when they are identities. Casts left
    without readers are removed by ``eliminate_dead_nodes``.
    """
    replace: dict[Value, Value] = {}
    inserted_input: dict[Value, Value] = {}  # inserted cast's output -> what it casts
    merged: dict[tuple[Value, str], Value] = {}
    specs: dict[Value, TensorSpec] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(replace.get(v, v) for v in node.inputs)
        op = node.op
        if isinstance(op, Cast):
            (x,) = inputs
            if op.inserted and x in inserted_input:
                x = inserted_input[x]
            if specs[x].dtype == op.dtype:
                replace[node.value()] = x
                continue
            if op.inserted:
                key = (x, str(op.dtype))
                if key in merged:
                    replace[node.value()] = merged[key]
                    continue
                merged[key] = node.value()
                inserted_input[node.value()] = x
            inputs = (x,)
        elif (inner := op.subgraph()) is not None:
            op = op.with_subgraph(remove_redundant_casts(inner))
        if inputs != node.inputs or op is not node.op:
            node = node.replace(inputs=inputs, op=op)
        nodes.append(node)
        for i, spec in enumerate(node.outputs):
            specs[node.value(i)] = spec
    outputs = tuple(replace.get(v, v) for v in graph.outputs)
    return graph.replace(nodes=tuple(nodes), outputs=outputs)
