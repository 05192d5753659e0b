"""networkx export and import: round trips, the documented attributes, edits, errors."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.render.networkx import graph_from_networkx, graph_to_networkx

EXAMPLES = {
    "mlp": examples.mlp,
    "residual_cnn": examples.residual_cnn,
    "transformer_block": examples.transformer_block,
    "lstm_classifier": examples.lstm_classifier,
}
POLICIES = {
    "f32": None,
    "bf16": mg.Policy(compute_dtype="bfloat16", output_dtype="float32"),
    "f16": mg.Policy(compute_dtype="float16"),
}


def shared_and_nested() -> mg.Graph:
    """Weight sharing, a block called twice, a multi-output op and a user cast."""
    x = mg.Input(("batch", 8), name="x")
    fc = ops.Linear(8, name="fc")
    a, b = ops.split(fc(x), 2)
    inner_x = mg.Input(("batch", 4), name="ix")
    inner = mg.Graph(inner_x, ops.gelu(ops.Linear(4, name="inner_fc")(inner_x)), name="inner")
    a, b = inner(a), inner(b)
    h = fc(ops.concat([a, b]))
    return mg.Graph(x, [ops.cast(h, "bfloat16"), b], name="shared_and_nested")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(EXAMPLES) + ["shared_and_nested"])
def test_round_trip_gives_an_equal_graph(name, policy):
    g = EXAMPLES.get(name, shared_and_nested)()
    if POLICIES[policy] is not None:
        g = mg.compile(g, POLICIES[policy]).graph
    nxg = g.to_networkx()
    assert isinstance(nxg, nx.MultiDiGraph)
    back = mg.Graph.from_networkx(nxg)
    assert back == g and hash(back) == hash(g)
    assert str(back) == str(g)
    assert back.summary() == g.summary()
    assert [n.source for n in back.nodes] == [n.source for n in g.nodes]
    assert graph_from_networkx(graph_to_networkx(back)) == g


def test_graph_attributes():
    g = shared_and_nested()
    nxg = g.to_networkx()
    assert nxg.graph == {"name": "shared_and_nested", "inputs": ["x"],
                         "outputs": [("cast", 0), ("inner@1", 0)]}
    assert list(nxg.nodes) == [n.name for n in g.nodes]


def test_node_attributes():
    g = examples.residual_cnn()
    nxg = g.to_networkx()
    stem = nxg.nodes["stem"]
    assert stem["op"] == "conv"
    assert stem["attrs"] == g.node("stem").op.attrs()
    assert stem["attrs"]["features"] == 16 and stem["attrs"]["padding"] == "SAME"
    assert stem["shape"] == ("batch", "8", "8", "16") and stem["dtype"] == "float32"
    assert stem["shapes"] == [("batch", "8", "8", "16")] and stem["dtypes"] == ["float32"]
    assert (stem["params"], stem["trainable_params"], stem["non_trainable_params"]) == (160, 160, 0)
    assert stem["layer"] == "stem" and stem["shares_weights"] is False
    assert stem["order"] == 1 and stem["source"] == g.node("stem").source
    assert nxg.nodes["stem_bn"]["params"] == 64 and nxg.nodes["stem_bn"]["non_trainable_params"] == 32
    assert nxg.nodes["image"]["op"] == "input"
    assert nxg.nodes["image"]["attrs"]["dtype"] == np.dtype("float32")
    assert nxg.nodes["relu"]["attrs"] == {}
    # the attrs are a copy: editing them cannot touch the graph
    stem["attrs"]["features"] = 3
    assert g.node("stem").op.features == 16
    # params add up to the summary's totals
    assert sum(d["params"] for _, d in nxg.nodes(data=True)) == 7530


def test_nested_blocks_keep_their_graph_and_a_networkx_subgraph():
    g = examples.residual_cnn()
    res1 = g.to_networkx().nodes["res1"]
    assert res1["op"] == "block" and res1["attrs"] == {"graph": g.node("res1").op.graph}
    sub = res1["subgraph"]
    assert isinstance(sub, nx.MultiDiGraph) and sub.graph["name"] == "res1"
    assert list(sub.nodes) == [n.name for n in g.node("res1").op.graph.nodes]
    assert sub.nodes["conv_a"]["shape"] == ("batch", "height", "width", "16")
    assert res1["params"] == 4736


def test_shared_layers_and_multi_outputs():
    nxg = shared_and_nested().to_networkx()
    assert nxg.nodes["fc@1"]["layer"] == "fc" and nxg.nodes["fc@1"]["shares_weights"]
    assert nxg.nodes["fc@1"]["params"] == 0 and nxg.nodes["fc"]["params"] == 72
    assert nxg.nodes["inner@1"]["layer"] == "inner"
    split = nxg.nodes["split"]
    assert split["shapes"] == [("batch", "4"), ("batch", "4")] and split["shape"] == ("batch", "4")
    assert nxg.nodes["cast"]["dtype"] == "bfloat16"


def test_edge_attributes():
    nxg = examples.lstm_classifier().to_networkx()
    assert list(nxg.edges("lstm", keys=True, data=True)) == [("lstm", "logits", 0, {"output": 1, "slot": 0})]
    # self-attention: one tensor into slots 0 and 1, two parallel edges
    tb = examples.transformer_block().to_networkx()
    assert sorted(tb.get_edge_data("ln_attention", "attention").items()) == [
        (0, {"output": 0, "slot": 0}), (1, {"output": 0, "slot": 1})]
    assert tb.get_edge_data("x", "add") == {0: {"output": 0, "slot": 0}}
    assert tb.get_edge_data("attention", "add") == {1: {"output": 0, "slot": 1}}


def test_an_edited_networkx_graph_rebuilds_the_edited_graph():
    nxg = examples.residual_cnn().to_networkx()
    nxg.nodes["logits"]["attrs"]["features"] = 5
    edited = mg.Graph.from_networkx(nxg)
    assert edited == examples.residual_cnn(classes=5)
    assert edited.output_specs == (mg.TensorSpec.of(("batch", 5), "float32"),)

    nxg = examples.mlp().to_networkx()  # remove relu: wire dense straight to logits
    nxg.add_edge("dense", "dense_1", key=0, output=0, slot=0)
    nxg.remove_node("relu")
    g = mg.Graph.from_networkx(nxg)
    assert [n.name for n in g.nodes] == ["x", "dense", "dense_1", "relu_1", "logits"]
    assert g.node("dense_1").inputs == (mg.Value("dense"),)


def test_an_edit_inside_a_block_goes_through_its_subgraph():
    nxg = examples.residual_cnn().to_networkx()
    res1 = nxg.nodes["res1"]
    res1["subgraph"].nodes["bn_a"]["attrs"]["epsilon"] = 1e-3
    with pytest.raises(mg.GraphError, match="'subgraph' and attrs\\['graph'\\] describe different"):
        mg.Graph.from_networkx(nxg)
    del res1["attrs"]["graph"]
    g = mg.Graph.from_networkx(nxg)
    assert g.node("res1").op.graph.node("bn_a").op.epsilon == 1e-3
    assert g != examples.residual_cnn()
    # without the networkx subgraph, attrs["graph"] is used
    nxg = examples.residual_cnn().to_networkx()
    del nxg.nodes["res1"]["subgraph"]
    assert mg.Graph.from_networkx(nxg) == examples.residual_cnn()


def test_a_cycle_raises_graph_error():
    nxg = examples.mlp().to_networkx()
    nxg.add_edge("logits", "dense", key=1, output=0, slot=1)
    with pytest.raises(mg.GraphError, match="cycle: .*dense.*logits"):
        mg.Graph.from_networkx(nxg)


def test_order_is_deterministic_without_the_order_attribute():
    g = examples.transformer_block()
    nxg = g.to_networkx()
    for _, data in nxg.nodes(data=True):
        del data["order"]
    shuffled = nx.MultiDiGraph(**nxg.graph)
    shuffled.add_nodes_from(sorted(nxg.nodes(data=True), reverse=True))
    shuffled.add_edges_from(nxg.edges(keys=True, data=True))
    a, b = graph_from_networkx(nxg), graph_from_networkx(shuffled)
    assert a == b and str(a) == str(b)
    names = [n.name for n in a.nodes]
    assert names == list(nx.lexicographical_topological_sort(nxg))
    assert a == g  # here the sorted topological order happens to be the creation order


def test_defaults_for_missing_graph_attributes():
    nxg = examples.mlp().to_networkx()
    nxg.graph.clear()
    g = mg.Graph.from_networkx(nxg)
    assert g.name == "graph" and g.inputs == ("x",) and g.outputs == (mg.Value("logits"),)
    assert g.with_parts(name="mlp") == examples.mlp()


def test_bad_networkx_graphs_raise_graph_error():
    def edited(change):
        nxg = examples.mlp().to_networkx()
        change(nxg)
        return nxg

    cases = {
        "unknown op 'linear_v2'": lambda n: n.nodes["logits"].update(op="linear_v2"),
        "does not take these attrs": lambda n: n.nodes["logits"]["attrs"].update(width=3),
        "two edges feed input slot 0": lambda n: n.add_edge("x", "dense_1", key=5, output=0, slot=0),
        "input slots must be 0..1": lambda n: n.add_edge("x", "dense_1", key=5, output=0, slot=2),
        "reads output 3 of 'dense'": lambda n: n.edges["dense", "relu", 0].update(output=3),
        "node keys must be non-empty strings": lambda n: n.add_node(7),
        "not a node": lambda n: n.graph.update(inputs=["nope"]),
    }
    for message, change in cases.items():
        with pytest.raises(mg.GraphError, match=message):
            mg.Graph.from_networkx(edited(change))
    with pytest.raises(mg.GraphError, match="DiGraph"):
        mg.Graph.from_networkx(nx.Graph())


def test_edits_propagate_shapes_and_bad_ones_name_the_layer():
    nxg = examples.residual_cnn().to_networkx()
    nxg.nodes["image"]["attrs"]["shape"] = ("batch", 10, 10, 1)
    g = mg.Graph.from_networkx(nxg)  # the stored shapes are not trusted: re-inferred
    assert g == examples.residual_cnn(size=10)
    assert str(g.node("flatten").outputs[0]) == "f32[batch,400]"

    x = mg.Input(("batch", 4), name="x")
    y = ops.add(ops.Linear(4, name="a")(x), ops.Linear(4, name="b")(x))
    nxg = mg.Graph(x, y, name="adder").to_networkx()
    nxg.nodes["b"]["attrs"]["features"] = 5
    with pytest.raises(mg.ShapeError, match="layer 'add'"):
        mg.Graph.from_networkx(nxg)
