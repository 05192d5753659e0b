"""A graph as a ``networkx.MultiDiGraph``, and back.

The export (``graph_to_networkx``):

- graph attributes: ``name``; ``inputs`` (input node names, in ``apply`` order);
  ``outputs`` (a list of ``(node, output index)`` pairs).
- one networkx node per graph node, keyed by its name, with the attributes
  ``op`` (the registered op name, e.g. ``"linear"``), ``attrs`` (the op's
  hyperparameters, ``op.attrs()``, a fresh dict), ``shape`` (the first output's dims as
  strings: ``("batch", "10")``), ``dtype`` (its dtype name: ``"float32"``),
  ``shapes`` / ``dtypes`` (the same for every output), ``params`` (trainable +
  non-trainable count, on the node that owns the weights; 0 on nodes sharing them),
  ``trainable_params``, ``non_trainable_params``, ``layer`` (whose weights the node
  uses), ``shares_weights``, ``order`` (its position in the graph's topological order)
  and ``source`` (where it was created, or None). Block nodes also have ``subgraph``:
  the nested graph as a networkx graph of its own.
- one edge per input of a node: ``producer -> consumer``, keyed by the input slot, with
  ``output`` (which output of the producer) and ``slot`` (which input of the consumer).

The import (``graph_from_networkx``) rebuilds nodes from ``op`` and ``attrs`` through the
op registry, wires them by the edges, re-infers every output spec (so edits propagate,
and the stored ``shape`` / ``dtype`` are not trusted), and checks the result with
``passes.verify`` and ``passes.infer_shapes``.

Example:
  >>> from mlaxgraph import examples
  >>> g = examples.mlp(4, (3,), 2)
  >>> nxg = graph_to_networkx(g)
  >>> nxg.nodes["logits"]["op"], nxg.nodes["logits"]["shape"], nxg.nodes["logits"]["params"]
  ('linear', ('batch', '2'), 8)
  >>> graph_from_networkx(nxg) == g
  True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..compiler.passes import infer_shapes, verify
from ..core.errors import GraphError, MlaxGraphError
from ..core.registry import lookup
from ..ir.builder import infer_outputs
from ..ir.graph import Graph, InputLayer
from ..ir.node import Node, Value
from ..ir.op import Layer
from .summary import count_params

__all__ = ["graph_to_networkx", "graph_from_networkx"]

_HINT = "networkx is needed for this: pip install networkx"


def _networkx():
    try:
        import networkx
    except ImportError as e:  # pragma: no cover - networkx is a dependency
        raise ImportError(_HINT) from e
    return networkx


def graph_to_networkx(graph):
    """The graph as a ``networkx.MultiDiGraph`` (see the module's docstring for its
    attributes)."""
    nx = _networkx()
    if not isinstance(graph, Graph):
        raise TypeError(f"graph_to_networkx takes an mg.Graph, got {type(graph).__name__}")
    counts = count_params(graph)
    result = nx.MultiDiGraph(name=graph.name, inputs=list(graph.inputs),
                             outputs=[(v.node, v.index) for v in graph.outputs])
    for order, node in enumerate(graph.nodes):
        trainable, state = (0, 0) if node.shares_weights else counts.get(node.layer, (0, 0))
        first = node.outputs[0]
        data = dict(
            op=node.op.op_name,
            attrs=node.op.attrs(),
            shape=tuple(str(d) for d in first.shape),
            dtype=str(first.dtype),
            shapes=[tuple(str(d) for d in s.shape) for s in node.outputs],
            dtypes=[str(s.dtype) for s in node.outputs],
            params=trainable + state,
            trainable_params=trainable,
            non_trainable_params=state,
            layer=node.layer,
            shares_weights=node.shares_weights,
            order=order,
            source=node.source,
        )
        inner = node.op.subgraph()
        if inner is not None:
            data["subgraph"] = graph_to_networkx(inner)
        result.add_node(node.name, **data)
    for node in graph.nodes:
        for slot, v in enumerate(node.inputs):
            result.add_edge(v.node, node.name, key=slot, output=v.index, slot=slot)
    return result


def _fail(name: Any, problem: str) -> GraphError:
    return GraphError(f"networkx node {name!r}: {problem}")


def _order(nx, nx_graph) -> list:
    """A deterministic topological order: by the stored ``order`` where nodes have one
    (nodes without it after them), then by name; ``GraphError`` naming a cycle."""
    for name in nx_graph.nodes:
        if not isinstance(name, str) or not name:
            raise GraphError(f"networkx node keys must be non-empty strings (the node "
                             f"names), got {name!r}")

    def key(name):
        order = nx_graph.nodes[name].get("order")
        valid = isinstance(order, (int, float)) and not isinstance(order, bool) and math.isfinite(order)
        return (0, order, name) if valid else (1, 0, name)

    try:
        return list(nx.lexicographical_topological_sort(nx_graph, key=key))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(nx_graph)
        path = [edge[0] for edge in cycle] + [cycle[0][0]]
        raise GraphError(f"the networkx graph has a cycle: {' -> '.join(map(str, path))}") from None


def _inputs_of(nx_graph, name) -> tuple[Value, ...]:
    """The node's inputs, in slot order, from its in-edges."""
    edges = list(nx_graph.in_edges(name, data=True))
    by_slot: dict[int, Value] = {}
    for source, _, data in edges:
        slot = data.get("slot", 0 if len(edges) == 1 else None)
        index = data.get("output", 0)
        if not isinstance(slot, int) or isinstance(slot, bool):
            raise _fail(name, f"the edge from {source!r} has no integer 'slot' attribute "
                              f"(which input it feeds), got {slot!r}")
        if not isinstance(index, int) or isinstance(index, bool):
            raise _fail(name, f"the edge from {source!r} has a non-integer 'output' "
                              f"attribute {index!r}")
        if slot in by_slot:
            raise _fail(name, f"two edges feed input slot {slot}: from {by_slot[slot].node!r} "
                              f"and {source!r}")
        by_slot[slot] = Value(source, index)
    if sorted(by_slot) != list(range(len(by_slot))):
        raise _fail(name, f"its input slots must be 0..{len(by_slot) - 1}, got {sorted(by_slot)}")
    return tuple(by_slot[i] for i in range(len(by_slot)))


def _make_op(name, data):
    op_name = data.get("op")
    if not isinstance(op_name, str):
        raise _fail(name, f"needs an 'op' attribute naming a registered op, got {op_name!r}")
    cls = lookup(op_name)
    attrs = data.get("attrs", {})
    if attrs is None:
        attrs = {}
    if not isinstance(attrs, dict):
        raise _fail(name, f"'attrs' must be a dict of the op's hyperparameters, got {attrs!r}")
    attrs = dict(attrs)
    if op_name == "block" and data.get("subgraph") is not None:
        inner = graph_from_networkx(data["subgraph"])
        given = attrs.get("graph")
        if given is not None and given != inner:
            raise _fail(name, "its 'subgraph' and attrs['graph'] describe different graphs; "
                              "edit one and delete the other")
        attrs["graph"] = inner
    if "name" in attrs:
        raise _fail(name, "'attrs' must not hold 'name': the node's key is its name")
    layer = data.get("layer", name)
    fields = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else None
    if fields is not None and set(attrs) - fields:
        raise _fail(name, f"op {op_name!r} does not take these attrs {sorted(attrs)}: "
                          f"{', '.join(sorted(set(attrs) - fields))} unknown")
    try:
        op = cls(**attrs, name=layer if isinstance(layer, str) and layer else None)
    except MlaxGraphError:
        raise
    except TypeError as e:
        raise _fail(name, f"op {op_name!r} does not take these attrs {sorted(attrs)}: {e}") from None
    if not isinstance(op, Layer) or (op_name == "block" and not isinstance(attrs.get("graph"), Graph)):
        raise _fail(name, f"op {op_name!r} could not be built from {attrs!r}")
    return op


def graph_from_networkx(nx_graph):
    """A ``Graph`` from a networkx directed graph made by ``graph_to_networkx``,
    possibly edited.

    Nodes are taken in a deterministic topological order (their stored ``order``, then
    their names), ops are built with ``registry.lookup(op)(**attrs)``, inputs come from
    the edges by ``slot``, output specs are re-inferred. Graph attributes: ``name``
    (default ``"graph"``), ``inputs`` (default: the ``input`` nodes in order) and
    ``outputs`` (default: output 0 of every node nothing reads, in order).

    Raises:
      GraphError: a cycle, an unknown op, missing or clashing attributes, or a structure
        ``passes.verify`` rejects. ShapeError / DTypeError: an edit makes shapes or dtypes
        that do not fit.
    """
    nx = _networkx()
    if not isinstance(nx_graph, nx.DiGraph):
        raise GraphError(f"expected a networkx DiGraph or MultiDiGraph, got {type(nx_graph).__name__}")
    names = _order(nx, nx_graph)
    meta = nx_graph.graph
    graph_name = meta.get("name", "graph")

    nodes: list[Node] = []
    specs: dict[str, tuple] = {}
    for name in names:
        data = nx_graph.nodes[name]
        op = _make_op(name, data)
        inputs = _inputs_of(nx_graph, name)
        got = []
        for v in inputs:
            produced = specs.get(v.node)
            if produced is None or not 0 <= v.index < len(produced):
                raise _fail(name, f"reads output {v.index} of {v.node!r}, which has "
                                  f"{0 if produced is None else len(produced)} outputs")
            got.append(produced[v.index])
        layer = data.get("layer", name)
        if not isinstance(layer, str) or not layer:
            raise _fail(name, f"'layer' must be a non-empty string, got {layer!r}")
        source = data.get("source")
        outputs = infer_outputs(op, tuple(got), name, source)
        specs[name] = outputs
        nodes.append(Node(name=name, op=op, inputs=inputs, outputs=outputs, layer=layer,
                          source=source))

    if "inputs" in meta:
        inputs = tuple(meta["inputs"])
    else:
        inputs = tuple(n.name for n in nodes if isinstance(n.op, InputLayer))
    if "outputs" in meta:
        outputs = tuple(_as_value(o) for o in meta["outputs"])
    else:
        outputs = tuple(Value(n) for n in names
                        if nx_graph.out_degree(n) == 0 and n not in inputs)
    graph = Graph.from_parts(nodes, inputs, outputs, graph_name)
    return infer_shapes(verify(graph))


def _as_value(item) -> Value:
    if isinstance(item, Value):
        return item
    if isinstance(item, str):
        return Value(item, 0)
    try:
        node, index = item
    except (TypeError, ValueError):
        raise GraphError(f"graph outputs must be (node, output index) pairs, got {item!r}") from None
    return Value(node, index)
