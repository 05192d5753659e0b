"""fold_repeated_blocks: runs of equal blocks become one ``scan`` node."""

from __future__ import annotations

from ...ir.block import Block
from ...ir.graph import Graph
from ...ir.node import Node, Value
from ...ir.scan import Scan

__all__ = ["fold_repeated_blocks", "unfold_scans", "repeated_runs"]


def _foldable(node: Node, graph: Graph, sharers: set[str]) -> bool:
    """A block call with weights of its own (not shared, not sharing) and one output of
    its first input's spec (so its output can feed the next one); further inputs (an
    attention mask) are the same for every block of a run."""
    op = node.op
    if type(op) is not Block or node.shares_weights or node.name in sharers:
        return False
    return (len(node.inputs) >= 1 and len(node.outputs) == 1 and len(op.graph.outputs) == 1
            and graph.spec(node.inputs[0]) == node.outputs[0])


def repeated_runs(graph: Graph) -> list[tuple[str, ...]]:
    """The names of the nodes of each run of two or more calls of equal blocks (equal
    graphs, each with its own weights), each call reading the previous one's output
    (and the same further inputs as it) and nothing else reading it, in the graph's
    order: what ``fold_repeated_blocks`` folds (the explorer draws the same runs
    folded)."""
    sharers = {node.layer for node in graph.nodes if node.shares_weights}
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v.node, []).append(node.name)
    outputs = {v.node for v in graph.outputs}
    successor: dict[str, str] = {}
    for node in graph.nodes:
        if not _foldable(node, graph, sharers):
            continue
        previous = graph.node(node.inputs[0].node)
        if (_foldable(previous, graph, sharers) and previous.op.subgraph() == node.op.subgraph()
                and node.inputs[0] == Value(previous.name, 0) and node.inputs[1:] == previous.inputs[1:]
                and readers.get(previous.name) == [node.name] and previous.name not in outputs):
            successor[previous.name] = node.name
    runs = []
    for node in graph.nodes:
        if node.name in successor and node.name not in successor.values():
            run = [node.name]
            while run[-1] in successor:
                run.append(successor[run[-1]])
            runs.append(tuple(run))
    return runs


def fold_repeated_blocks(graph: Graph) -> Graph:
    """Requires: a verified graph. Ensures: every run of two or more calls of equal
    blocks (equal graphs, each with its own weights), each call reading the previous
    one's output and nothing else reading it, is one ``scan`` node named
    ``first..last`` at the place of the run's last call; the same inside blocks. Other
    nodes are left as they are.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import examples
      >>> block = examples.transformer_block(length=4, width=8, heads=2, mlp=16)
      >>> x = mg.Input(("batch", 4, 8), name="x")
      >>> h = block.as_block("b0")(x)
      >>> h = block.as_block("b1")(h)
      >>> folded = fold_repeated_blocks(mg.Graph(x, block.as_block("b2")(h)))
      >>> [(n.name, n.op.op_name) for n in folded.nodes]
      [('x', 'input'), ('b0..b2', 'scan')]
    """
    nodes = tuple(_fold_inside(node) for node in graph.nodes)
    if any(a is not b for a, b in zip(nodes, graph.nodes)):
        graph = graph.replace(nodes=nodes)
    found = repeated_runs(graph)
    if not found:
        return graph
    by_name = {node.name: node for node in graph.nodes}
    runs = {run[-1]: run for run in found}  # last member -> the run
    members = {name for run in found for name in run}
    renamed: dict[Value, Value] = {}
    folded = []
    for node in graph.nodes:
        node = node.replace(inputs=tuple(renamed.get(v, v) for v in node.inputs))
        if node.name not in members:
            folded.append(node)
            continue
        if node.name not in runs:
            continue
        blocks = [by_name[member] for member in runs[node.name]]
        first = blocks[0]
        body = first.op.subgraph()
        assert body is not None  # _foldable: a block
        name = f"{first.name}..{blocks[-1].name}"
        scan = Scan(body, tuple(n.name for n in blocks), name=name)
        inputs = tuple(renamed.get(v, v) for v in first.inputs)
        folded.append(Node(name, scan, inputs, node.outputs, name, first.source))
        renamed[Value(node.name, 0)] = Value(name, 0)
    outputs_after = tuple(renamed.get(v, v) for v in graph.outputs)
    return graph.replace(nodes=tuple(folded), outputs=outputs_after)


def _fold_inside(node: Node) -> Node:
    inner = node.op.subgraph()
    if inner is None:
        return node
    op = node.op.with_subgraph(fold_repeated_blocks(inner))
    return node if op is node.op else node.replace(op=op)


def unfold_scans(graph: Graph) -> Graph:
    """The inverse: every ``scan`` node back to the calls of its blocks, as the graph
    had them (``mg.save`` writes graphs this way, so files do not depend on compile
    options)."""
    nodes: list[Node] = []
    renamed: dict[Value, Value] = {}
    for node in graph.nodes:
        node = node.replace(inputs=tuple(renamed.get(v, v) for v in node.inputs))
        inner = node.op.subgraph()
        if inner is not None:
            op = node.op.with_subgraph(unfold_scans(inner))
            node = node if op is node.op else node.replace(op=op)
        if not isinstance(node.op, Scan):
            nodes.append(node)
            continue
        value = node.inputs[0]
        for name in node.op.names:
            nodes.append(Node(name, Block(node.op.graph, name=name), (value, *node.inputs[1:]),
                              node.outputs, name, node.source))
            value = Value(name, 0)
        renamed[Value(node.name, 0)] = value
    return graph.replace(nodes=tuple(nodes), outputs=tuple(renamed.get(v, v) for v in graph.outputs))
