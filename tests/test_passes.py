"""Compiler passes on small hand-built graphs, checked against golden printed IR."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ir import Node, Value
from mlaxgraph.compiler.passes import (eliminate_dead_nodes, infer_shapes, insert_casts,
                              remove_redundant_casts, run_passes, verify)

BF16 = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")


def golden(text: str) -> str:
    return textwrap.dedent(text).strip()


def mlp3():
    x = mg.Input(("batch", 8), name="x")
    h = ops.relu(ops.Linear(16, name="fc1")(x))
    h = ops.relu(ops.Linear(16, name="fc2")(h))
    return mg.Graph(x, ops.Linear(4, name="fc3")(h), name="mlp3")


def test_insert_casts_on_an_mlp():
    g = mg.compile(mlp3(), BF16).graph
    assert str(g) == golden("""
        graph mlp3(%x: f32[batch,8]) {
          %x_bf16: bf16[batch,8] = cast[dtype=bf16, inserted=True](%x)
          %fc1: bf16[batch,16] = linear[features=16](%x_bf16)
          %relu: bf16[batch,16] = relu(%fc1)
          %fc2: bf16[batch,16] = linear[features=16](%relu)
          %relu_1: bf16[batch,16] = relu(%fc2)
          %fc3: bf16[batch,4] = linear[features=4](%relu_1)
          %fc3_f32: f32[batch,4] = cast[dtype=f32, inserted=True](%fc3)
          return %fc3_f32
        }""")


def test_precision_sensitive_layers_run_in_float32_islands():
    x = mg.Input(("batch", 4, 4, 3), name="x")
    h = ops.BatchNorm(name="bn")(ops.Conv(8, (3, 3), padding="SAME", name="conv")(x))
    y = ops.softmax(ops.Linear(5, name="fc")(ops.Flatten()(ops.relu(h))))
    model = mg.compile(mg.Graph(x, y, name="net"), BF16)
    assert str(model.graph) == golden("""
        graph net(%x: f32[batch,4,4,3]) {
          %x_bf16: bf16[batch,4,4,3] = cast[dtype=bf16, inserted=True](%x)
          %conv: bf16[batch,4,4,8] = conv[features=8, kernel_size=(3, 3), padding='SAME'](%x_bf16)
          %conv_f32: f32[batch,4,4,8] = cast[dtype=f32, inserted=True](%conv)
          %bn: f32[batch,4,4,8] = batch_norm(%conv_f32)
          %bn_bf16: bf16[batch,4,4,8] = cast[dtype=bf16, inserted=True](%bn)
          %relu: bf16[batch,4,4,8] = relu(%bn_bf16)
          %flatten: bf16[batch,128] = flatten(%relu)
          %fc: bf16[batch,5] = linear[features=5](%flatten)
          %fc_f32: f32[batch,5] = cast[dtype=f32, inserted=True](%fc)
          %softmax: f32[batch,5] = softmax(%fc_f32)
          return %softmax
        }""")
    params, state = model.init(jax.random.key(0))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves((params, state)))
    out, new_state = model.apply(params, state, jnp.ones((2, 4, 4, 3)))
    assert out.dtype == jnp.float32
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(new_state))
    # The BatchNorm equations themselves compute in float32: the mean's reduction is f32.
    jaxpr = model.jaxpr(batch=2)
    reductions = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "reduce_sum"]
    assert reductions and all(e.outvars[0].aval.dtype == jnp.float32 for e in reductions)


def test_overrides_run_a_named_layer_in_another_dtype():
    policy = mg.Policy(compute_dtype="bfloat16", overrides={"fc3": "float32"})
    g = mg.compile(mlp3(), policy).graph
    assert g.node("fc3").outputs[0].dtype == np.dtype("float32")
    assert g.node("fc2").outputs[0].dtype == jnp.bfloat16
    # Output dtype defaults to the compute dtype, so float32 logits are cast back.
    assert g.output_specs[0].dtype == jnp.bfloat16


def count_activation_round_trips(closed_jaxpr) -> int:
    """converts whose input is itself a convert from the dtype they convert to."""
    producer = {}
    for eqn in closed_jaxpr.jaxpr.eqns:
        for v in eqn.outvars:
            producer[v] = eqn
    trips = 0
    for eqn in closed_jaxpr.jaxpr.eqns:
        if eqn.primitive.name != "convert_element_type":
            continue
        source = producer.get(eqn.invars[0])
        if source is not None and source.primitive.name == "convert_element_type":
            if source.invars[0].aval.dtype == eqn.outvars[0].aval.dtype:
                trips += 1
    return trips


def test_bf16_mlp_has_no_convert_round_trips_and_float32_params():
    model = mg.compile(mlp3(), BF16)
    jaxpr = model.jaxpr(batch=8)
    assert count_activation_round_trips(jaxpr) == 0
    converts = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "convert_element_type"]
    # the input, six weights (kernel and bias of three layers) and the output
    assert len(converts) == 8
    params, _ = model.init(jax.random.key(0))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    out, _ = model.apply(params, {}, jnp.ones((8, 8)))
    assert out.dtype == jnp.float32


def test_the_round_trip_counter_sees_a_round_trip():
    x = mg.Input(("batch", 4))
    y = ops.relu(ops.cast(ops.cast(x, "bfloat16"), "float32"))
    jaxpr = mg.compile(mg.Graph(x, y)).jaxpr(batch=2)
    assert count_activation_round_trips(jaxpr) == 1  # user casts are kept as written


def test_recompiling_a_compiled_graph_folds_the_policy_casts():
    once = mg.compile(mlp3(), BF16).graph
    back = mg.compile(once, mg.Policy()).graph
    # f32 input -> (bf16 -> f32) round trip folds away; bf16 -> f32 output cast then
    # f32 again folds to one cast.
    assert [n.name for n in back.nodes if n.op.op_name == "cast"] == []
    assert all(s.dtype == np.dtype("float32") for s in back.output_specs)


def test_remove_redundant_casts_merges_and_drops():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.relu(x), name="g")
    cast = lambda dtype: ops.Cast(dtype, inserted=True)
    xn, relu = g.node("x"), g.node("relu")
    spec = xn.outputs[0]
    nodes = (
        xn,
        Node("c1", cast("bfloat16"), (Value("x"),), (spec.with_dtype("bfloat16"),), "c1"),
        Node("c2", cast("bfloat16"), (Value("x"),), (spec.with_dtype("bfloat16"),), "c2"),
        Node("c3", cast("float32"), (Value("c2"),), (spec,), "c3"),
        Node("same", cast("float32"), (Value("x"),), (spec,), "same"),
        Node("add", ops.Add(), (Value("c1"), Value("c2")), (spec.with_dtype("bfloat16"),), "add"),
        relu.replace(inputs=(Value("c3"),)),
    )
    hand = g.with_parts(nodes=nodes, outputs=(Value("relu"), Value("add"), Value("same")))
    verify(infer_shapes(hand))
    out = eliminate_dead_nodes(remove_redundant_casts(hand))
    assert str(out) == golden("""
        graph g(%x: f32[batch,4]) {
          %c1: bf16[batch,4] = cast[dtype=bf16, inserted=True](%x)
          %add: bf16[batch,4] = add(%c1, %c1)
          %relu: f32[batch,4] = relu(%x)
          return %relu, %add, %x
        }""")


def test_eliminate_dead_nodes_keeps_inputs_and_live_nodes():
    x = mg.Input(("batch", 4), name="x")
    live = ops.relu(x)
    dead = ops.Linear(3, name="unused")(live)
    g = mg.Graph(x, [live, dead])
    pruned = eliminate_dead_nodes(g.with_parts(outputs=(g.outputs[0],)))
    assert [n.name for n in pruned.nodes] == ["x", "relu"]
    assert eliminate_dead_nodes(g) is g


def test_a_pass_that_breaks_the_graph_is_named():
    def drop_first_layer(graph):
        return graph.with_parts(nodes=graph.nodes[:1] + graph.nodes[2:])

    with pytest.raises(mg.GraphError, match="pass 'drop_first_layer' produced an invalid graph"):
        run_passes(mlp3(), [("drop_first_layer", drop_first_layer)])


def test_passes_are_pure():
    g = mlp3()
    text = str(g)
    mg.compile(g, BF16)
    assert str(g) == text and g == mlp3()


def test_nested_blocks_get_casts_inside():
    inner = mg.Input(("batch", 4), name="x")
    block = mg.Graph(inner, ops.BatchNorm(name="bn")(ops.Linear(4, name="fc")(inner)), name="blk")
    x = mg.Input(("batch", 4), name="x")
    g = mg.compile(mg.Graph(x, block(x)), BF16).graph
    inner_graph = g.node("blk").op.graph
    assert inner_graph.input_specs[0].dtype == jnp.bfloat16
    assert inner_graph.node("bn").outputs[0].dtype == np.dtype("float32")
    # The block returns BatchNorm's float32 output, already the output dtype: no cast.
    assert [p for p, n in g.walk() if n.op.op_name == "cast"] == ["x_bf16", "blk/fc_f32"]


def test_mixed_dtypes_in_graph_inputs_are_unified_by_the_policy():
    a = mg.Input(("batch", 3), "float32", name="a")
    b = mg.Input(("batch", 3), "bfloat16", name="b")
    g = mg.Graph([a, b], ops.add(ops.relu(a), ops.cast(b, "float32")))
    model = mg.compile(g, mg.Policy(compute_dtype="bfloat16"))
    (out, _) = model.apply({}, {}, jnp.ones((2, 3)), jnp.ones((2, 3), jnp.bfloat16))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), 2.0)


def test_without_a_policy_no_casts_are_inserted():
    x = mg.Input(("batch", 4), "bfloat16", name="x")
    g = mg.Graph(x, ops.softmax(ops.Linear(3, name="fc")(x)))
    model = mg.compile(g)
    assert model.graph == g and model.policy is None
    params, _ = model.init(jax.random.key(0))
    assert params["fc"]["kernel"].dtype == jnp.float32  # weights float32, cast in the layer
    out, _ = model.apply(params, {}, jnp.ones((2, 4), jnp.bfloat16))
    assert out.dtype == jnp.bfloat16


def test_an_override_naming_a_block_sets_its_layers_dtype():
    inner = mg.Input(("batch", 8), name="x")
    blk = mg.Graph(inner, ops.relu(ops.Linear(8, name="fc")(inner)), name="blk")
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.Linear(2, name="head")(blk(x)))
    model = mg.compile(g, mg.Policy(compute_dtype="bfloat16", overrides={"blk": "float32"}))
    inner_graph = model.graph.node("blk").op.graph
    assert all(s.dtype == np.dtype("float32") for _, n in inner_graph.walk() for s in n.outputs)
    assert model.graph.node("head").outputs[0].dtype == jnp.bfloat16


def test_an_override_naming_no_layer_is_a_graph_error():
    with pytest.raises(mg.GraphError, match="'fc33'.*did you mean 'fc3'"):
        mg.compile(mlp3(), mg.Policy(compute_dtype="bfloat16", overrides={"fc33": "float32"}))
