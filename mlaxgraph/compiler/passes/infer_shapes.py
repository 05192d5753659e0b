"""infer_shapes: recompute every node's output specs and check them against the record."""

from __future__ import annotations

from ...core.errors import DTypeError, ShapeError, node_message
from ...core.specs import TensorSpec
from ...ir.builder import infer_outputs, weight_shapes
from ...ir.graph import Graph
from ...ir.node import Value
from ...ir.printer import context_lines

__all__ = ["infer_shapes"]


def infer_shapes(graph: Graph) -> Graph:
    """Re-infers shapes and dtypes node by node from the graph inputs.

    Requires: a verified graph. Ensures: every node's recorded output specs are what
    its op infers from its inputs' specs (a graph loaded from a file cannot claim
    shapes its ops do not produce), nested blocks included. Returns the graph. Memoised
    on the graph: a block called many times is checked once.
    """
    memo = graph.memo("infer_shapes")
    if memo:
        return graph
    specs: dict[Value, TensorSpec] = {}
    weights: dict[str, tuple[str, dict]] = {}  # layer -> (first node, weight shapes)
    for node in graph.nodes:
        op = node.op
        if node.name in graph.inputs:
            outputs = op.infer(())
        else:
            inner = op.subgraph()
            if inner is not None:
                infer_shapes(inner)
            got = tuple(specs[v] for v in node.inputs)
            outputs = infer_outputs(op, got, node.name, node.source,
                                    lambda name=node.name: context_lines(graph, name))
        if outputs != node.outputs:
            kind = DTypeError if [s.shape for s in outputs] == [s.shape for s in node.outputs] else ShapeError
            raise kind(node_message(
                node.name, op.op_name, "the graph records output specs its op does not produce",
                got=", ".join(map(str, node.outputs)), expected=", ".join(map(str, outputs)),
                source=node.source, context=context_lines(graph, node.name)))
        if node.name not in graph.inputs:
            _check_shared_weights(graph, node, got, weights)
        for i, spec in enumerate(outputs):
            specs[node.value(i)] = spec
    memo["ok"] = True
    return graph


def _check_shared_weights(graph: Graph, node, got, weights) -> None:
    """Nodes sharing a layer must need weights of the same shapes."""
    shapes = weight_shapes(node.op, got)
    first = weights.setdefault(node.layer, (node.name, shapes))
    if first[1] != shapes:
        raise ShapeError(node_message(
            node.name, node.op.op_name,
            f"shares the weights of layer {node.layer!r} (first used by %{first[0]}) but its "
            f"inputs need weights of other shapes", got=str(shapes), expected=str(first[1]),
            source=node.source, context=context_lines(graph, node.name)))
