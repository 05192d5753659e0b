"""The rewriter: the one walker that transforms graphs.

``rewrite(graph, rule)`` visits the nodes in topological order and asks ``rule`` what
becomes of each one. It owns what every transformation would otherwise repeat:

- renaming: when a node is replaced, every later reader (and the graph's outputs)
  reads its replacement;
- re-inference: a node whose inputs changed spec, or whose op changed, gets its output
  specs inferred again (a failure names the node and shows its neighbours);
- recursion: a nested block's graph is rewritten first, with the rule that
  ``rule.nested(node)`` gives (itself by default; None leaves the block as it is);
- identity: when nothing changed, the very same graph object comes back, so callers
  can test ``result is graph`` and equal blocks stay one object;
- memoisation: results are kept on the (immutable) graph by rule, so a block called
  twelve times is rewritten once, and rewriting an unchanged graph again is free.

Rules are small: the compiler's passes (``insert_casts``, ``remove_redundant_casts``,
``eliminate_dead_nodes``, ``fold_repeated_blocks``, ``unfold_scans``) and the user's
surgery (``Graph.replace``, ``insert_after``, ...) are each one ``Rule``. A rule must
be hashable (a frozen dataclass): it is the memo's key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import GraphError, MlaxGraphError, node_message
from ..core.specs import TensorSpec
from .builder import infer_outputs
from .graph import Graph
from .node import Node, Value
from .op import Layer
from .printer import format_node

__all__ = ["Rule", "Rewrite", "rewrite"]


class Rule:
    """What becomes of each node. Subclasses are frozen dataclasses (hashable).

    ``visit`` returns one of:

    - ``None``: keep the node (its inputs renamed, its outputs re-inferred if needed);
    - a ``Node``: it takes the node's place; its outputs replace the node's by index;
    - a sequence of ``Value``: the node is dropped and its outputs are these values
      (``()`` for a node nothing reads any more).

    Before returning, a rule may add nodes with ``rewrite.emit`` (they come before
    whatever it returns) and keep the node itself with ``rewrite.keep``.
    """

    def prepare(self, graph: Graph) -> Any:
        """Per-graph facts the rule needs, computed once per graph rewritten (the
        rewrite's ``data``)."""
        return None

    def visit(self, node: Node, rewrite: Rewrite) -> None | Node | Sequence[Value]:
        return None

    def nested(self, node: Node) -> Rule | None:
        """The rule for the graph of block ``node`` (None: leave it untouched)."""
        return self

    def results(self, outputs: tuple[Value, ...], rewrite: Rewrite) -> tuple[Value, ...]:
        """The graph's outputs, renamed; a rule may change them (cast them, say)."""
        return outputs

    def inputs(self, names: tuple[str, ...], rewrite: Rewrite) -> tuple[str, ...]:
        """The names of the graph's input nodes, in order; a rule that emits input
        nodes adds them here (the decoder's positions)."""
        return names


class Rewrite:
    """The state of one graph's rewrite, handed to the rule at each node.

    Attributes:
      graph: the graph being rewritten (unchanged).
      data: what ``rule.prepare(graph)`` returned.
    """

    def __init__(self, graph: Graph, rule: Rule):
        self.graph = graph
        self.rule = rule
        self.data = rule.prepare(graph)
        self.nodes: list[Node] = []
        self.renamed: dict[Value, Value] = {}
        self.specs: dict[Value, TensorSpec] = {}
        self.names: set[str] = {node.name for node in graph.nodes}
        self.made: set[str] = set()  # the names of the nodes made so far
        self.suffixes: dict[str, int] = {}  # base -> the next suffix to try
        self.changed = False

    def spec(self, value: Value) -> TensorSpec:
        """The spec of a value of the graph being made."""
        return self.specs[value]

    def fresh(self, base: str) -> str:
        """A node name not yet used in the graph being made: ``base``, ``base_1``, ..."""
        n = self.suffixes.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.suffixes[base] = n + 1
        self.names.add(name)
        return name

    def emit(self, node: Node, *, infer: bool = False) -> Node:
        """Adds a new node (its name made unique by the caller, e.g. with ``fresh``);
        with ``infer`` (or no outputs given) its output specs are inferred from its
        inputs'."""
        self._check_inputs(node)
        if infer or not node.outputs:
            node = node.replace(outputs=self._infer(node))
        self.names.add(node.name)
        self._append(node)
        self.changed = True
        return node

    def keep(self, node: Node) -> Node:
        """Keeps a node of the graph (inputs already renamed, op possibly changed),
        re-inferring its outputs when its op or its inputs' specs changed."""
        self._check_inputs(node)
        original = self.graph._index.get(node.name)
        if node is not original:
            self.changed = True
        if original is None or node.op is not original.op or any(
                self.specs[v] != self.graph.spec(w) for v, w in zip(node.inputs, original.inputs)):
            outputs = self._infer(node)
            if outputs != node.outputs:
                node = node.replace(outputs=outputs)
        self._append(node)
        return node

    def read(self, value: Value) -> Value:
        """The value of the graph being made that stands for ``value`` of the old one."""
        return self.renamed.get(value, value)

    def _infer(self, node: Node) -> tuple[TensorSpec, ...]:
        specs = tuple(self.specs[v] for v in node.inputs)
        return infer_outputs(node.op, specs, node.name, node.source, lambda: self._context(node))

    def _context(self, node: Node) -> list[str]:
        """The printed lines around ``node`` in the graph being made (the rewrite's
        new nodes shown, the old ones that follow it after)."""
        made = {n.name for n in self.nodes}
        later = [n for n in self.graph.nodes if n.name not in made and n.name != node.name]
        at = len(self.nodes)
        nearby = self.nodes[max(0, at - 2):] + [node] + later[:2]
        lines = []
        for n in nearby:
            mark = ">" if n is node else " "
            where = f"  # {n.source}" if n.source is not None and n is node else ""
            lines.append(f"{mark} {format_node(n)}{where}")
        return lines

    def _append(self, node: Node) -> None:
        self._check_inputs(node)
        if node.name in self.made:
            raise GraphError(node_message(
                node.name, node.op.op_name, "a rule made a second node of this name (names are "
                "unique in a graph: rewrite.fresh(base) gives a free one)", source=node.source))
        self.made.add(node.name)
        self.nodes.append(node)
        for i, spec in enumerate(node.outputs):
            self.specs[node.value(i)] = spec

    def _check_inputs(self, node: Node) -> None:
        if not isinstance(node, Node) or not isinstance(node.op, Layer):
            what = f"node {node.name!r} holds {node.op!r}" if isinstance(node, Node) else repr(node)
            raise GraphError(f"{type(self.rule).__name__}: {what}, which is no layer; a node holds "
                             f"a layer object (node.replace(op=ops.Gelu()))")
        bad = [v for v in node.inputs if not isinstance(v, Value)]
        if bad:
            raise GraphError(node_message(
                node.name, node.op.op_name, f"reads {bad[0]!r}, which is no Value: a node's "
                f"inputs are Values (other.value(0), Value(name, index))", source=node.source))
        unknown = [v for v in node.inputs if v not in self.specs]
        if unknown:
            raise GraphError(node_message(
                node.name, node.op.op_name, f"reads {unknown[0]}, which no node before it makes "
                f"in the rewritten graph (a node a rule removed with () that it still reads, "
                f"an unknown name, or a later node's value)", source=node.source))

    def _alias(self, old: Node, values: Sequence[Value]) -> None:
        self.changed = True
        if not values:
            return
        if len(values) != len(old.outputs):
            raise GraphError(node_message(
                old.name, old.op.op_name,
                f"a rewrite gave {len(values)} values for this node's {len(old.outputs)} outputs",
                source=old.source))
        for i, value in enumerate(values):
            if not isinstance(value, Value) or value not in self.specs:
                raise GraphError(node_message(
                    old.name, old.op.op_name, f"a rewrite gave {value!r} for this node's output "
                    f"{i}, which is no value made before it in the rewritten graph",
                    source=old.source))
            self.renamed[old.value(i)] = value


#: The results of ``rewrite`` by graph and rule, kept on the graph (``Graph._memo``).
_MEMO_KEY = "rewrite"


def rewrite(graph: Graph, rule: Rule, *, memo: dict | None = None) -> Graph:
    """``graph`` transformed by ``rule`` (see ``Rule``): a new graph, or ``graph``
    itself when nothing changed. Memoised on the graph by rule; or, with ``memo``, in
    that dict for this rewrite alone (a rule holding a user's function, made anew for
    each call, would only fill the graph's memo).

    Example:
      >>> import dataclasses, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> @dataclasses.dataclass(frozen=True)
      ... class ReluToGelu(Rule):
      ...     def visit(self, node, rewrite):
      ...         if node.op.op_name == "relu":
      ...             return node.replace(op=ops.Gelu())
      >>> x = mg.Input(("batch", 4), name="x")
      >>> g = mg.Graph(x, ops.relu(ops.Linear(3, name="fc")(x)))
      >>> [n.op.op_name for n in rewrite(g, ReluToGelu()).nodes]
      ['input', 'linear', 'gelu']
      >>> rewrite(g, Rule()) is g
      True
    """
    if not isinstance(graph, Graph) or not isinstance(rule, Rule):
        raise GraphError(f"rewrite(graph, rule) takes a Graph and a Rule (a frozen dataclass "
                         f"subclassing mg.Rule, whose visit(node, rewrite) returns None, a "
                         f"Node or the node's new values), got {type(graph).__name__} and "
                         f"{type(rule).__name__}")
    table: dict = graph.memo(_MEMO_KEY) if memo is None else memo
    key: Any = rule if memo is None else (graph, rule)
    try:
        return table[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable rule: not memoised
        return _rewrite(graph, rule, memo)
    result = table[key] = _rewrite(graph, rule, memo)
    return result


def _rewrite(graph: Graph, rule: Rule, memo: dict | None) -> Graph:
    state = Rewrite(graph, rule)
    for node in graph.nodes:
        inputs = tuple(state.renamed.get(v, v) for v in node.inputs)
        op: Layer = node.op
        inner = op.subgraph()
        if inner is not None:
            inner_rule = rule.nested(node)
            if inner_rule is not None:
                try:
                    new_inner = rewrite(inner, inner_rule, memo=memo)
                except MlaxGraphError as e:  # say which block call, as paths do
                    raise type(e)(f"in block {node.name!r}: {e}") from None
                if new_inner is not inner:
                    op = op.with_subgraph(new_inner)
        current = node if (op is node.op and inputs == node.inputs) else node.replace(op=op, inputs=inputs)
        result = rule.visit(current, state)
        if result is None:
            state.keep(current)
        elif isinstance(result, Node):
            kept = state.keep(result)
            if kept.name != node.name:
                state.names.add(kept.name)
                state._alias(node, tuple(kept.value(i) for i in range(len(node.outputs))))
        elif isinstance(result, (tuple, list)):
            state._alias(node, tuple(result))
        else:
            raise GraphError(node_message(
                node.name, node.op.op_name, f"{type(rule).__name__}.visit returned a "
                f"{type(result).__name__}; it returns None (keep the node), a Node (node.replace"
                f"(op=...)) or a tuple of the values standing for the node's outputs",
                source=node.source))
    outputs = tuple(rule.results(tuple(state.renamed.get(v, v) for v in graph.outputs), state))
    bad = [v for v in outputs if not isinstance(v, Value) or v not in state.specs]
    if bad or (graph.outputs and not outputs):
        raise GraphError(f"{type(rule).__name__}.results gave the outputs {outputs!r} of graph "
                         f"{graph.name!r}: "
                         + (f"{bad[0]!r} is no value of the rewritten graph" if bad else "none")
                         + "; a graph returns one or more Values of its nodes")
    names = tuple(rule.inputs(graph.inputs, state))
    if (not state.changed and outputs == graph.outputs and names == graph.inputs
            and len(state.nodes) == len(graph.nodes)):
        return graph
    return graph.with_parts(nodes=tuple(state.nodes), inputs=names, outputs=outputs)

