"""``Program``: what a flattened graph offers the code that walks it -- the specs of any
node (a block's, an input's, one inside a scan's body), every path and every step (a
scan's body's included), the steps that own weights, the trees of weights shaped as
init's, and ``get_in``/``set_in`` on nested dicts."""

from __future__ import annotations

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.compiler.flatten import flatten
from mlaxgraph.compiler.program import get_in, set_in


def specs(items) -> list[str]:
    return [str(s) for s in items]


def node_specs(program, path) -> tuple[list[str], list[str]]:
    inputs, outputs = program.node_specs(path)
    return specs(inputs), specs(outputs)


def two_level() -> mg.Graph:
    """x (batch, 6, 4, 3) -> res (a residual block on symbolic spatial dims) -> pool ->
    flatten -> logits; and a second output: relu of x."""
    x = mg.Input(("batch", 6, 4, 3), name="x")
    h = examples.residual_block(3, "res").as_block("res")(x)
    y = ops.Linear(2, name="logits")(ops.Flatten()(ops.MaxPool((2, 2))(h)))
    return mg.Graph(x, [y, ops.relu(x)], name="two_level")


@pytest.fixture(scope="module")
def program():
    return flatten(two_level())


@pytest.fixture(scope="module")
def scanned():
    lm = examples.transformer_lm(vocab=16, length=8, depth=2, width=16, heads=2)
    return flatten(mg.compile(lm, scan_blocks="always").graph)


# --- node_specs ------------------------------------------------------------------------


def test_node_specs_of_layers_blocks_and_inputs(program):
    assert node_specs(program, "x") == ([], ["f32[batch,6,4,3]"])
    assert node_specs(program, "logits") == (["f32[batch,18]"], ["f32[batch,2]"])
    assert node_specs(program, "max_pool") == (["f32[batch,6,4,3]"], ["f32[batch,3,2,3]"])
    # A block: what it reads and what its inner layers give back.
    assert node_specs(program, "res") == (["f32[batch,6,4,3]"], ["f32[batch,6,4,3]"])


def test_node_specs_inside_a_block_are_bound_to_the_graphs_dims(program):
    # The block is built on (batch, height, width, 3): inside, its specs are bound.
    assert node_specs(program, "res/x") == ([], ["f32[batch,6,4,3]"])
    assert node_specs(program, "res/conv_a") == (["f32[batch,6,4,3]"], ["f32[batch,6,4,3]"])
    assert node_specs(program, "res/add") == (["f32[batch,6,4,3]"] * 2, ["f32[batch,6,4,3]"])


def test_node_specs_inside_a_scans_body(scanned):
    assert node_specs(scanned, "block0..block1") == (["f32[batch,8,16]"], ["f32[batch,8,16]"])
    assert node_specs(scanned, "block0..block1/x") == ([], ["f32[batch,8,16]"])
    assert node_specs(scanned, "block0..block1/attention") == (
        ["f32[batch,8,16]", "f32[batch,8,16]", "bool[8,8]"], ["f32[batch,8,16]"])
    assert node_specs(scanned, "tokens") == ([], ["i32[batch,8]"])


def test_node_specs_of_an_unknown_path_is_a_key_error(program, scanned):
    with pytest.raises(KeyError):
        program.node_specs("nope")
    with pytest.raises(KeyError):
        scanned.node_specs("block0..block1/nope")


# --- paths and steps -------------------------------------------------------------------


def test_all_paths_without_a_scan_are_the_nodes(program):
    assert list(program.all_paths()) == list(program.nodes)
    assert list(program.nodes) == [
        "x", "res", "res/x", "res/conv_a", "res/bn_a", "res/relu", "res/conv_b", "res/bn_b",
        "res/add", "res/relu_1", "max_pool", "flatten", "logits", "relu"]


def test_all_paths_and_all_steps_include_a_scans_body(scanned):
    body = [f"block0..block1/{n}" for n in ("ln_attention", "causal_mask", "attention", "add",
                                             "ln_mlp", "mlp_in", "gelu", "mlp_out", "add_1")]
    assert list(scanned.all_paths()) == ["tokens", "embed", "block0..block1", "ln_final",
                                         "logits", "block0..block1/x", *body]
    # A scan's body's steps come right after the scan's.
    assert [s.path for s in scanned.all_steps()] == ["embed", "block0..block1", *body, "ln_final",
                                                     "logits"]
    assert [s.path for s in scanned] == ["embed", "block0..block1", "ln_final", "logits"]


def test_iterating_a_program_gives_its_steps(program):
    assert list(program) == list(program.steps)
    assert list(program.all_steps()) == list(program.steps)


def test_inputs_and_outputs(program):
    assert program.inputs == ("x",)
    assert specs(program.input_specs) == ["f32[batch,6,4,3]"]
    assert program.outputs == (("logits", 0), ("relu", 0))


# --- owners and weights ----------------------------------------------------------------


def test_owners_are_the_first_steps_of_layers_with_weights():
    block = examples.residual_block(3, "res").as_block("res")
    x = mg.Input(("batch", 4, 4, 3), name="x")
    h = block(block(x))  # the second call shares the first's weights
    program = flatten(mg.Graph(x, ops.BatchNorm(name="bn")(h)))
    assert [s.path for s in program.owners()] == ["res/conv_a", "res/bn_a", "res/conv_b",
                                                  "res/bn_b", "bn"]
    assert all(s.owns_weights for s in program.owners())


def test_weight_tree_is_shaped_as_inits_params_and_state(program):
    leaf = lambda step, path, spec: (step.path, path, tuple(spec.shape))
    assert program.weight_tree("params", leaf) == {
        "res": {"conv_a": {"kernel": ("res/conv_a", "kernel", (3, 3, 3, 3))},
                "bn_a": {"scale": ("res/bn_a", "scale", (3,)), "bias": ("res/bn_a", "bias", (3,))},
                "conv_b": {"kernel": ("res/conv_b", "kernel", (3, 3, 3, 3))},
                "bn_b": {"scale": ("res/bn_b", "scale", (3,)), "bias": ("res/bn_b", "bias", (3,))}},
        "logits": {"kernel": ("logits", "kernel", (18, 2)), "bias": ("logits", "bias", (2,))}}
    assert program.weight_tree("state", leaf) == {
        "res": {"bn_a": {"mean": ("res/bn_a", "mean", (3,)), "var": ("res/bn_a", "var", (3,))},
                "bn_b": {"mean": ("res/bn_b", "mean", (3,)), "var": ("res/bn_b", "var", (3,))}}}


def test_weight_tree_of_nested_weights_passes_their_paths():
    x = mg.Input(("batch", 5, 8), name="x")
    program = flatten(mg.Graph(x, ops.MultiHeadAttention(2, 4, name="mha")(x)))
    tree = program.weight_tree("params", lambda step, path, spec: path)
    assert tree == {"mha": {part: {"kernel": f"{part}/kernel", "bias": f"{part}/bias"}
                            for part in ("query", "key", "value", "out")}}
    assert program.weight_tree("state", lambda step, path, spec: path) == {}


def test_weight_tree_of_a_scan_stacks_its_blocks_weights(scanned):
    tree = scanned.weight_tree("params", lambda step, path, spec: tuple(spec.shape))
    assert list(tree) == ["embed", "block0..block1", "ln_final", "logits"]
    assert tree["block0..block1"]["ln_attention"] == {"scale": (2, 16), "bias": (2, 16)}
    assert tree["block0..block1"]["attention"]["query"]["kernel"] == (2, 16, 2, 8)
    assert tree["logits"] == {"kernel": (16, 16), "bias": (16,)}


# --- get_in / set_in -------------------------------------------------------------------


def test_get_in():
    tree = {"a": {"b": {"c": 1}}, "d": 2}
    assert get_in(tree, ("a", "b", "c")) == 1
    assert get_in(tree, ("a",)) == {"b": {"c": 1}}
    assert get_in(tree, ()) is tree
    with pytest.raises(KeyError):
        get_in(tree, ("a", "x"))
    with pytest.raises(TypeError):
        get_in(tree, ("d", "x"))  # a leaf where a dict should be


def test_set_in_copies_the_dicts_along_the_way_and_shares_the_rest():
    other = {"kept": [1]}
    tree = {"a": {"b": {"c": 1}, "other": other}, "d": 2}
    new = set_in(tree, ("a", "b", "c"), 5)
    assert new == {"a": {"b": {"c": 5}, "other": {"kept": [1]}}, "d": 2}
    assert tree == {"a": {"b": {"c": 1}, "other": other}, "d": 2}  # untouched
    assert new is not tree and new["a"] is not tree["a"] and new["a"]["b"] is not tree["a"]["b"]
    assert new["a"]["other"] is other


def test_set_in_makes_missing_levels_and_replaces_leaves_in_the_way():
    assert set_in({}, ("a", "b"), 1) == {"a": {"b": 1}}
    assert set_in({"a": 3}, ("a", "b"), 1) == {"a": {"b": 1}}
    assert set_in({"a": {"x": 0}}, ("a",), 1) == {"a": 1}
