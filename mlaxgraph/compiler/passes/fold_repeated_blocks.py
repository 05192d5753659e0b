"""fold_repeated_blocks: runs of equal blocks become one ``scan`` node."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ...core.specs import dtype_str
from ...ir.block import Block
from ...ir.graph import Graph
from ...ir.node import Node, Value
from ...ir.rewrite import Rewrite, Rule, rewrite
from ...ir.scan import Scan, unfold_scans
from ...ops.cast import Cast
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


def _foldable(node: Node, graph: Graph, sharers: set[str], casts: bool = False) -> bool:
    """A block call with weights of its own (not shared, not sharing) and one output of
    its first input's spec (so its output can feed the next one; with ``casts``, in
    another dtype too, which a cast after it gives back); further inputs (an attention
    mask) are the same for every block of a run."""
    op = node.op
    if type(op) is not Block or node.shares_weights or node.name in sharers:
        return False
    if not (len(node.inputs) >= 1 and len(node.outputs) == 1 and len(op.graph.outputs) == 1):
        return False
    given, out = graph.spec(node.inputs[0]), node.outputs[0]
    return given == out or (casts and given == out.with_dtype(given.dtype))


def _cast_after(node: Node, graph: Graph) -> Node | None:
    """The cast a policy put after the block ``node`` back to its input's spec (a
    block ending in a precision-sensitive layer, whose float32 output the next block
    reads in the compute dtype), when it is the one reader of the block's output."""
    readers = graph.consumers()[node.name]
    outputs = {v.node for v in graph.outputs}
    if len(readers) != 1 or node.name in outputs or node.outputs[0] == graph.spec(node.inputs[0]):
        return None
    cast = readers[0]
    if isinstance(cast.op, Cast) and cast.op.inserted and cast.outputs[0] == graph.spec(node.inputs[0]):
        return cast
    return None


def repeated_runs(graph: Graph, casts: bool = False) -> list[tuple[str, ...]]:
    """The names of the nodes of each run of two or more calls of equal blocks (equal
    graphs, each with its own weights), each call reading the previous one's output
    (and the same further inputs as it) and nothing else reading it, in the graph's
    order: what ``fold_repeated_blocks`` folds (the explorer draws the same runs
    folded). With ``casts``, also the runs whose blocks each read the previous one's
    output through the cast a policy put after it (``_cast_after``; the run's blocks
    alone are named, each followed by its cast)."""
    sharers = {node.layer for node in graph.nodes if node.shares_weights}
    readers = graph.consumers()
    outputs = {v.node for v in graph.outputs}
    successor: dict[str, str] = {}
    for node in graph.nodes:
        if not _foldable(node, graph, sharers, casts):
            continue
        link = graph.node(node.inputs[0].node)
        previous = link
        if casts and isinstance(link.op, Cast) and link.inputs:
            previous = graph.node(link.inputs[0].node)
            if not _foldable(previous, graph, sharers, casts) or _cast_after(previous, graph) is not link:
                continue
        elif not _foldable(previous, graph, sharers):  # read as it is: of its input's spec
            continue
        if (previous.op.subgraph() == node.op.subgraph()
                and node.inputs[0] == Value(link.name, 0) and node.inputs[1:] == previous.inputs[1:]
                and readers[link.name] == (node,) and link.name not in outputs
                and (link is previous or readers[previous.name] == (link,))):
            successor[previous.name] = node.name
    runs = []
    for node in graph.nodes:
        if node.name in successor and node.name not in successor.values():
            run = [node.name]
            while run[-1] in successor:
                run.append(successor[run[-1]])
            last = graph.node(run[-1])
            if last.outputs[0] != graph.spec(last.inputs[0]) and _cast_after(last, graph) is None:
                run.pop()  # its output read in its own dtype: the run's carry ends before it
            if len(run) >= 2:
                runs.append(tuple(run))
    return runs


@dataclasses.dataclass(frozen=True)
class _Fold(Rule):
    where: Callable[[Graph, int], bool] | None = None

    def prepare(self, graph: Graph):
        runs = repeated_runs(graph, casts=True)
        if self.where is not None:
            runs = [run for run in runs if self.where(_body(graph, run), len(run))]
        last: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        members: set[str] = set()
        for run in runs:
            casts = tuple(c.name for c in (_cast_after(graph.node(n), graph) for n in run) if c)
            members.update(run + casts)
            last[(casts or run)[-1]] = (run, casts)
        return last, members, {}

    def visit(self, node: Node, rewrite: Rewrite):
        last, members, bodies = rewrite.data
        if node.name not in members:
            return None
        if node.name not in last:
            if type(node.op) is Block:  # its graph folded inside already (the rewriter's
                bodies[node.name] = node.op.subgraph()  # recursion), for a cast's scan
            return ()  # an earlier node of a run: the scan at the run's last one
        names, casts = last[node.name]
        first = rewrite.graph.node(names[0])
        body = bodies[names[-1]] if casts else node.op.subgraph()
        assert body is not None  # _foldable: a block
        if casts:  # each block's cast back to its input's dtype, the body's last node
            taken = {n.name for n in body.nodes}
            cast_name = f"{body.outputs[0].node}_{dtype_str(node.outputs[0].dtype)}"
            while cast_name in taken:
                cast_name += "_"
            cast = Node(cast_name, node.op, body.outputs, node.outputs, cast_name, node.source)
            body = Graph.from_parts((*body.nodes, cast), body.inputs, (cast.value(),), body.name)
        name = f"{first.name}..{names[-1]}"
        rewrite.names.add(name)
        return Node(name, Scan(body, names, casts, name=name),
                    tuple(rewrite.read(v) for v in first.inputs), node.outputs, name, first.source)


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
