"""fold_repeated_blocks: runs of equal blocks become one ``scan`` node."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ...ir.block import Block
from ...ir.graph import Graph
from ...ir.node import Node, Value
from ...ir.rewrite import Rewrite, Rule, rewrite
from ...ir.scan import Scan, unfold_scans
from ...ops.spatial import CONVOLUTION_OPS

__all__ = ["fold_repeated_blocks", "unfold_scans", "repeated_runs", "scan_pays", "SCAN_MIN_RUN", "UNROLLED_OPS"]

#: The shortest run that ``scan_blocks=True`` folds (benchmarks/bench_scan_rule.py
#: measured the first train step, scanned against unscanned, over run lengths and
#: block sizes on a 2-core CPU; docs/deep_models.md, "When to scan").
SCAN_MIN_RUN = 6

#: Ops that keep a block unrolled under ``scan_blocks=True``: the convolutions
#: (``ops.spatial.CONVOLUTION_OPS``). On the CPU, XLA runs a convolution inside a loop
#: several times slower than unrolled (ResNet bottlenecks: the steady step 5 - 9x
#: slower scanned, benchmarks/bench_scan_rule.py).
UNROLLED_OPS = CONVOLUTION_OPS


def scan_pays(body: Graph, length: int) -> bool:
    """Whether folding a run of ``length`` calls of the block ``body`` into one scan
    pays: runs of ``SCAN_MIN_RUN`` or more blocks without a convolution. A shorter run
    compiles faster unrolled (the scan's own cost, its loop and the weights stacked and
    sliced, is not won back by compiling the block once instead of ``length`` times);
    a block with a convolution runs slower in a loop."""
    if length < SCAN_MIN_RUN:
        return False
    return not any(node.op.op_name in UNROLLED_OPS for _, node in body.walk())


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
    readers = graph.consumers()
    outputs = {v.node for v in graph.outputs}
    successor: dict[str, str] = {}
    for node in graph.nodes:
        if not _foldable(node, graph, sharers):
            continue
        previous = graph.node(node.inputs[0].node)
        if (_foldable(previous, graph, sharers) and previous.op.subgraph() == node.op.subgraph()
                and node.inputs[0] == Value(previous.name, 0) and node.inputs[1:] == previous.inputs[1:]
                and readers[previous.name] == (node,) and previous.name not in outputs):
            successor[previous.name] = node.name
    runs = []
    for node in graph.nodes:
        if node.name in successor and node.name not in successor.values():
            run = [node.name]
            while run[-1] in successor:
                run.append(successor[run[-1]])
            runs.append(tuple(run))
    return runs


@dataclasses.dataclass(frozen=True)
class _Fold(Rule):
    where: Callable[[Graph, int], bool] | None = None

    def prepare(self, graph: Graph):
        runs = repeated_runs(graph)
        if self.where is not None:
            runs = [run for run in runs if self.where(_body(graph, run), len(run))]
        return {run[-1]: run for run in runs}, {name for run in runs for name in run}

    def visit(self, node: Node, rewrite: Rewrite):
        last, members = rewrite.data
        if node.name not in members:
            return None
        if node.name not in last:
            return ()  # an earlier block of a run: the scan at the run's last block
        names = last[node.name]
        first = rewrite.graph.node(names[0])
        body = node.op.subgraph()  # folded inside already (the rewriter's recursion)
        assert body is not None  # _foldable: a block
        name = f"{first.name}..{node.name}"
        rewrite.names.add(name)
        return Node(name, Scan(body, names, name=name), tuple(rewrite.read(v) for v in first.inputs),
                    node.outputs, name, first.source)


def _body(graph: Graph, run: tuple[str, ...]) -> Graph:
    body = graph.node(run[0]).op.subgraph()
    assert body is not None  # _foldable: a block
    return body


def fold_repeated_blocks(graph: Graph, where: Callable[[Graph, int], bool] | None = None) -> Graph:
    """Requires: a verified graph. Ensures: every run of two or more calls of equal
    blocks (equal graphs, each with its own weights), each call reading the previous
    one's output and nothing else reading it, is one ``scan`` node named
    ``first..last`` at the place of the run's last call; the same inside blocks. Other
    nodes are left as they are. ``where(block, length)``: fold only the runs it
    accepts (``scan_pays``: where folding pays); None: every run.

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
    return rewrite(graph, _Fold(where))
