"""The rewriter on small hand-built graphs: what each kind of rule answer does, the
same graph back when nothing changes, memoisation across equal blocks, re-inference
and its errors, the use-def index."""

import dataclasses

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ir.node import Node, Value
from mlaxgraph.ir.rewrite import Rule, rewrite


def small():
    x = mg.Input(("batch", 4), name="x")
    h = ops.relu(ops.Linear(3, name="fc")(x))
    return mg.Graph(x, ops.Linear(2, name="out")(h), name="small")


def stacked(n=6):
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Input(("batch", 4), name="h")
    block = mg.Graph(inner, ops.relu(ops.Linear(4, name="fc")(inner)), name="block")
    h = x
    for i in range(n):
        h = block.as_block(f"b{i}")(h)
    return mg.Graph(x, h, name="stack")


@dataclasses.dataclass(frozen=True)
class Counting(Rule):
    """Turns relu into tanh; counts the nodes it sees (by rule object identity)."""

    seen: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def visit(self, node, rewrite):
        self.seen.append(node.name)
        if node.op.op_name == "relu":
            return node.replace(op=ops.Tanh())
        return None


def test_nothing_changed_gives_the_same_graph():
    g = small()
    assert rewrite(g, Rule()) is g
    assert rewrite(stacked(), Rule()) is not None


def test_a_node_answer_takes_the_place_and_others_are_kept():
    g = small()
    out = rewrite(g, Counting())
    assert [n.op.op_name for n in out.nodes] == ["input", "linear", "tanh", "linear"]
    assert out.node("out") is g.node("out")  # its inputs' specs did not change
    assert str(out).count("tanh") == 1


def test_equal_blocks_are_rewritten_once_and_stay_one_graph():
    g = stacked(6)
    rule = Counting()
    out = rewrite(g, rule)
    assert rule.seen.count("relu") == 1  # the block's graph, once for six calls
    graphs = {id(out.node(f"b{i}").op.graph) for i in range(6)}
    assert len(graphs) == 1
    assert rewrite(g, rule) is out  # memoised on the graph
    assert rule.seen.count("relu") == 1


@dataclasses.dataclass(frozen=True)
class DropRelu(Rule):
    def visit(self, node, rewrite):
        return node.inputs[:1] if node.op.op_name == "relu" else None


@dataclasses.dataclass(frozen=True)
class WidenFc(Rule):
    """Replaces fc by a wider Linear: the readers after it are re-inferred."""

    def visit(self, node, rewrite):
        if node.name == "fc":
            return node.replace(op=ops.Linear(5, name="fc"))
        return None


def test_values_answer_renames_readers_and_re_inference_follows():
    g = small()
    dropped = rewrite(g, DropRelu())
    assert [n.name for n in dropped.nodes] == ["x", "fc", "out"]
    assert dropped.node("out").inputs == (Value("fc"),)
    wide = rewrite(g, WidenFc())
    assert str(wide.node("relu").outputs[0]) == "f32[batch,5]"
    assert wide.node("out").outputs == g.node("out").outputs


@dataclasses.dataclass(frozen=True)
class Breaks(Rule):
    def visit(self, node, rewrite):
        if node.name == "relu":
            name = rewrite.fresh("extra")
            rewrite.emit(Node(name, ops.Linear(7), (node.inputs[0],), (), name), infer=True)
            return (Value(name),)
        return None


def test_emitted_nodes_and_a_break_in_a_block_names_the_block():
    g = small()
    out = rewrite(g, Breaks())
    assert [n.name for n in out.nodes] == ["x", "fc", "extra", "out"]
    x = mg.Input(("batch", 3), name="x")
    inner = mg.Input(("batch", 3), name="h")
    block = mg.Graph(inner, ops.relu(inner) + inner, name="blk")
    outer = mg.Graph(x, block.as_block("b0")(x))
    with pytest.raises(mg.ShapeError, match="in block 'b0': layer 'add'") as info:
        rewrite(outer, Breaks())
    assert "> %add" in str(info.value)  # the graph being made, the new node shown
    assert "%extra: f32[batch,7]" in str(info.value)


def test_consumers_is_the_use_def_index():
    g = small()
    index = g.consumers()
    assert [n.name for n in index["x"]] == ["fc"]
    assert [n.name for n in index["relu"]] == ["out"]
    assert index["out"] == ()
    assert g.consumers() is index  # computed once


def _rule(fn):
    @dataclasses.dataclass(frozen=True)
    class Visit(Rule):
        def visit(self, node, rewrite):
            return fn(node, rewrite)

    return Visit()


def test_what_a_rule_gives_wrong_is_named_at_the_node():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.Linear(2, name="fc2")(ops.relu(ops.Linear(3, name="fc1")(x))))
    with pytest.raises(mg.GraphError, match=r"'relu'.*Visit.visit returned a Relu; it returns None"):
        rewrite(g, _rule(lambda n, rw: ops.Relu() if n.name == "relu" else None))
    with pytest.raises(mg.GraphError, match=r"'relu'.*reads %fc1, which no node before it makes"):
        rewrite(g, _rule(lambda n, rw: () if n.name == "fc1" else None))
    with pytest.raises(mg.GraphError, match=r"gave Value\(node='nope', index=0\) for this node's output 0"):
        rewrite(g, _rule(lambda n, rw: (Value("nope"),) if n.name == "relu" else None))
    with pytest.raises(mg.GraphError, match=r"'fc2'.*a second node of this name"):
        rewrite(g, _rule(lambda n, rw: n.replace(name="fc2") if n.name == "fc1" else None))
    with pytest.raises(mg.GraphError, match=r"takes a Graph and a Rule .* got Graph and function"):
        rewrite(g, lambda n, rw: None)


def test_a_node_renamed_by_a_rule_takes_its_weights_along():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.Linear(2, name="fc2")(ops.relu(ops.Linear(3, name="fc1")(x))))
    renamed = rewrite(g, _rule(lambda n, rw: n.replace(name="dense") if n.name == "fc1" else None))
    assert renamed.node("dense").layer == "dense" and renamed.select() == ["dense", "relu", "fc2"]
    params, state = mg.compile(g).init(jax.random.key(0))
    moved = {"dense": params["fc1"], "fc2": params["fc2"]}
    np.testing.assert_array_equal(mg.compile(renamed).apply(moved, state, np.ones((2, 4), np.float32))[0],
                                  mg.compile(g).apply(params, state, np.ones((2, 4), np.float32))[0])


@dataclasses.dataclass(frozen=True)
class _Answers(Rule):
    """Gives, at the relu, what ``answer(node, rewrite)`` makes; the graph's outputs
    what ``outputs(outputs)`` makes."""

    answer: object = None
    outputs: object = None

    def visit(self, node, rewrite):
        return self.answer(node, rewrite) if self.answer and node.op.op_name == "relu" else None

    def results(self, outputs, rewrite):
        return self.outputs(outputs) if self.outputs else outputs


@pytest.mark.parametrize("answer, message", [
    (lambda node, rw: node.replace(op="gelu"), r"_Answers: node 'relu' holds 'gelu', which is no layer"),
    (lambda node, rw: node.replace(op=jax.nn.gelu), r"node 'relu' holds <function gelu.*which is no layer"),
    (lambda node, rw: (rw.emit(Node("z", ops.Tanh(), ("fc",), (), "z")).value(),),
     r"layer 'z' \(op tanh\): reads 'fc', which is no Value"),
    (lambda node, rw: (rw.emit(Node("z", ops.Tanh(), (Value("out", 0),), (), "z")).value(),),
     r"layer 'z' \(op tanh\): reads %out, which no node before it makes"),
])
def test_a_node_a_rule_makes_wrong_is_an_error_naming_it(answer, message):
    with pytest.raises(mg.GraphError, match=message):
        rewrite(small(), _Answers(answer))


@pytest.mark.parametrize("outputs, message", [
    (lambda outs: ("out",), r"_Answers.results gave the outputs \('out',\) of graph 'small': 'out' is no value"),
    (lambda outs: (Value("gone", 0),), r"Value\(node='gone', index=0\) is no value of the rewritten graph"),
    (lambda outs: (), r"gave the outputs \(\) of graph 'small': none"),
])
def test_outputs_a_rule_gives_wrong_are_an_error_at_the_rewrite(outputs, message):
    with pytest.raises(mg.GraphError, match=message):
        rewrite(small(), _Answers(outputs=outputs))
    # a list of the graph's values is fine
    out = rewrite(small(), _Answers(outputs=lambda outs: [Value("fc", 0)]))
    assert out.outputs == (Value("fc", 0),)
