"""``flatten``: a graph becomes a Program of steps, its nested blocks resolved once.

Checked on small hand-built graphs: the steps' paths and weight paths through nested
blocks, a block's inputs and outputs as plain references to the values around it, a
block called twice (its layers twice, the weights of the first), the dims a block built
on symbolic spatial dims is bound to, a scan (a run of equal blocks) as one step with
the program of one block as its body, and the checkpoint regions."""

from __future__ import annotations

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.compiler.flatten import flatten
from mlaxgraph.compiler.program import Checkpoint, ScanStep


def specs(items) -> list[str]:
    return [str(s) for s in items]


def mlp_block(width: int, name: str) -> mg.Graph:
    """x -> fc -> relu, a block on ``(batch, width)``."""
    x = mg.Input(("batch", width), name="x")
    return mg.Graph(x, ops.relu(ops.Linear(width, name="fc")(x)), name=name)


def nested() -> mg.Graph:
    """head(mid(x)), where mid is core (a block) then a Linear ``out``."""
    x = mg.Input(("batch", 4), name="x")
    h = mlp_block(4, "core").as_block("core")(x)
    middle = mg.Graph(x, ops.Linear(6, name="out")(h), name="middle")
    y = mg.Input(("batch", 4), name="y")
    return mg.Graph(y, ops.Linear(2, name="head")(middle.as_block("mid")(y)), name="outer")


def shared_twice() -> mg.Graph:
    """One block layer called twice in a row: the second call reuses the first's weights."""
    block = mlp_block(4, "inner").as_block("shared")
    x = mg.Input(("batch", 4), name="x")
    return mg.Graph(x, block(block(x)), name="twice")


# --- paths -----------------------------------------------------------------------------


def test_the_steps_of_nested_blocks_are_named_by_their_paths():
    program = flatten(nested())
    assert [s.path for s in program.steps] == ["mid/core/fc", "mid/core/relu", "mid/out", "head"]
    assert [s.weights for s in program.steps] == [
        ("mid", "core", "fc"), ("mid", "core", "relu"), ("mid", "out"), ("head",)]
    assert [s.weights_path for s in program.steps] == ["mid/core/fc", "mid/core/relu", "mid/out",
                                                      "head"]
    assert [s.node.name for s in program.steps] == ["fc", "relu", "out", "head"]
    assert [s.op.op_name for s in program.steps] == ["linear", "relu", "linear", "linear"]
    # Blocks have no step of their own; every node of every level has a path.
    assert list(program.nodes) == ["y", "mid", "mid/x", "mid/core", "mid/core/x", "mid/core/fc",
                                   "mid/core/relu", "mid/out", "head"]


def test_the_example_cnn_starts_with_its_stem_then_its_block():
    program = flatten(examples.residual_cnn(8, channels=4))
    assert [s.path for s in program.steps] == [
        "stem", "stem_bn", "relu", "res1/conv_a", "res1/bn_a", "res1/relu", "res1/conv_b",
        "res1/bn_b", "res1/add", "res1/relu_1", "max_pool", "flatten", "dropout", "logits"]


def test_a_blocks_inputs_and_outputs_are_the_values_around_it():
    program = flatten(nested())
    steps = {s.path: s for s in program.steps}
    assert program.inputs == ("y",)
    # The innermost layer reads the graph's input directly: no step copies it in.
    assert steps["mid/core/fc"].inputs == (("y", 0),)
    assert steps["mid/core/relu"].inputs == (("mid/core/fc", 0),)
    assert steps["mid/out"].inputs == (("mid/core/relu", 0),)  # the inner block's output
    assert steps["head"].inputs == (("mid/out", 0),)
    assert program.outputs == (("head", 0),)
    # A block's values are its inner layers'; an inner input's, what it was called with.
    assert program.values["mid/x"] == (("y", 0),)
    assert program.values["mid/core/x"] == (("y", 0),)
    assert program.values["mid/core"] == (("mid/core/relu", 0),)
    assert program.values["mid"] == (("mid/out", 0),)
    assert all(s.outputs == ((s.path, 0),) for s in program.steps)


def test_a_prefix_is_put_before_every_path():
    program = flatten(mlp_block(3, "b"), prefix=("outer", "b"))
    assert program.inputs == ("outer/b/x",)
    assert [s.path for s in program.steps] == ["outer/b/fc", "outer/b/relu"]
    assert program.steps[0].inputs == (("outer/b/x", 0),)
    assert program.outputs == (("outer/b/relu", 0),)
    # The keys a body's steps derive are its own: the prefix is not folded in.
    assert [s.rng_path for s in program.steps] == [("fc",), ("relu",)]


def test_specs_are_the_ops_own():
    program = flatten(nested())
    fc, _, out, head = program.steps
    assert specs(fc.input_specs) == ["f32[batch,4]"] and specs(fc.output_specs) == ["f32[batch,4]"]
    assert specs(out.output_specs) == ["f32[batch,6]"]
    assert specs(head.input_specs) == ["f32[batch,6]"] and specs(head.output_specs) == ["f32[batch,2]"]
    assert {name: spec.shape for name, spec in head.param_specs.items()} == {"kernel": (6, 2),
                                                                            "bias": (2,)}
    assert dict(head.state_specs) == {}
    assert [s.random for s in program.steps] == [False] * 4


def test_random_steps_and_their_key_paths():
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Graph(x, ops.Dropout(0.5, name="drop")(ops.Linear(4, name="fc")(x)), name="inner")
    y = mg.Input(("batch", 4), name="y")
    program = flatten(mg.Graph(y, ops.Dropout(0.2, name="top")(inner.as_block("blk")(y))))
    assert [(s.path, s.random, s.rng_path) for s in program.steps] == [
        ("blk/fc", False, ("blk", "fc")), ("blk/drop", True, ("blk", "drop")),
        ("top", True, ("top",))]
    assert program.random_paths() == ["blk/drop", "top"]


# --- a block called twice --------------------------------------------------------------


def test_a_block_called_twice_gives_its_layers_twice_with_the_first_calls_weights():
    program = flatten(shared_twice())
    assert [s.path for s in program.steps] == ["shared/fc", "shared/relu", "shared@1/fc",
                                               "shared@1/relu"]
    assert [s.weights for s in program.steps] == [("shared", "fc"), ("shared", "relu")] * 2
    assert [s.owns_weights for s in program.steps] == [True, True, False, False]
    # Each call reads the previous one's output, and has keys of its own.
    assert program.steps[2].inputs == (("shared/relu", 0),)
    assert [s.rng_path for s in program.steps] == [("shared", "fc"), ("shared", "relu"),
                                                   ("shared@1", "fc"), ("shared@1", "relu")]
    assert program.outputs == (("shared@1/relu", 0),)


def test_two_blocks_of_one_graph_have_weights_of_their_own():
    x = mg.Input(("batch", 4), name="x")
    g = mlp_block(4, "inner")
    program = flatten(mg.Graph(x, g.as_block("b")(g.as_block("a")(x))))
    assert [s.weights for s in program.steps] == [("a", "fc"), ("a", "relu"), ("b", "fc"),
                                                  ("b", "relu")]
    assert all(s.owns_weights for s in program.steps)


# --- dims ------------------------------------------------------------------------------


def test_a_block_on_symbolic_spatial_dims_is_bound_to_the_dims_it_is_called_with():
    block = examples.residual_block(4, "res")  # on (batch, height, width, 4)
    assert str(block.input_specs[0]) == "f32[batch,height,width,4]"
    x = mg.Input(("batch", 8, 6, 4), name="x")
    program = flatten(mg.Graph(x, block.as_block("blk")(x)))
    assert [s.path for s in program.steps][:2] == ["blk/conv_a", "blk/bn_a"]
    for step in program.steps:
        assert set(specs(step.input_specs)) == {"f32[batch,8,6,4]"}, step.path
        assert specs(step.output_specs) == ["f32[batch,8,6,4]"], step.path
        assert {k: v for k, v in step.dims.items() if k != "batch"} == {"height": 8, "width": 6}
        assert str(step.dims["batch"]) == "batch"  # the graph's own symbolic batch
        # The step's graph is the block's: its specs stay symbolic there.
        assert step.graph is block


def test_one_block_called_at_two_sizes_has_steps_of_each_size():
    block = examples.residual_block(4, "res").as_block("blk")
    big = mg.Input(("batch", 8, 8, 4), name="big")
    small = mg.Input(("batch", 4, 2, 4), name="small")
    program = flatten(mg.Graph([big, small], [block(big), block(small)]))
    first = [s for s in program.steps if s.path.startswith("blk/")]
    second = [s for s in program.steps if s.path.startswith("blk@1/")]
    assert len(first) == len(second) == 7
    assert {(s.dims["height"], s.dims["width"]) for s in first} == {(8, 8)}
    assert {(s.dims["height"], s.dims["width"]) for s in second} == {(4, 2)}
    assert specs(second[0].output_specs) == ["f32[batch,4,2,4]"]
    # One set of weights: the conv kernels do not depend on the spatial size.
    assert [s.owns_weights for s in second] == [False] * 7


def test_top_level_steps_have_no_block_dims():
    program = flatten(examples.mlp(4, (3,), 2))
    assert all(dict(s.dims) == {} for s in program.steps)


# --- scan ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scanned():
    """A 3-block language model with dropout, compiled with scan_blocks: its graph holds
    one scan node for the three blocks."""
    lm = examples.transformer_lm(vocab=16, length=8, depth=3, width=16, heads=2, dropout=0.1)
    return mg.compile(lm, scan_blocks="always").graph


def test_a_scan_is_one_step_whose_body_is_the_program_of_one_block(scanned):
    program = flatten(scanned)
    assert [s.path for s in program.steps] == ["embed", "block0..block2", "ln_final", "logits"]
    scan = program.steps[1]
    assert scan.op.op_name == "scan" and scan.op.names == ("block0", "block1", "block2")
    assert [s.body for s in program.steps if s is not scan] == [None] * 3
    body = scan.body
    assert body is not None
    # The body's paths are under the scan's; its weights are one block's, relative to
    # the scan's (stacked) weights.
    assert body.inputs == ("block0..block2/x",)
    assert [s.path for s in body.steps] == [
        f"block0..block2/{name}" for name in ("ln_attention", "causal_mask", "attention",
                                              "attention_dropout", "add", "ln_mlp", "mlp_in",
                                              "gelu", "mlp_out", "mlp_dropout", "add_1")]
    assert body.steps[0].weights == ("ln_attention",)
    assert scan.weights == ("block0..block2",)
    assert body.outputs == (("block0..block2/add_1", 0),)
    assert program.steps[2].inputs == (("block0..block2", 0),)


def test_a_scans_keys_are_its_parents_and_its_bodys_are_its_own(scanned):
    program = flatten(scanned)
    scan = program.steps[1]
    assert scan.random  # its body has dropout
    assert scan.rng_path == ()  # at the top level: each block then folds in its name
    randoms = [(s.path, s.rng_path) for s in scan.body.steps if s.random]
    assert randoms == [("block0..block2/attention_dropout", ("attention_dropout",)),
                       ("block0..block2/mlp_dropout", ("mlp_dropout",))]


def test_scan_specs_are_bound(scanned):
    program = flatten(scanned)
    scan = program.steps[1]
    assert specs(scan.input_specs) == ["f32[batch,8,16]"]
    assert specs(scan.output_specs) == ["f32[batch,8,16]"]
    assert specs(scan.body.steps[-1].output_specs) == ["f32[batch,8,16]"]


# --- remat -----------------------------------------------------------------------------


def lm3():
    return examples.transformer_lm(vocab=16, length=8, depth=3, width=16, heads=2)


def regions(program):
    """(path, policy, step paths) of each checkpoint region of the schedule."""
    return [(u.path, u.policy, [s.path for s in u.steps]) for u in program.schedule
            if isinstance(u, Checkpoint)]


def test_without_remat_no_step_is_rematerialized():
    program = flatten(lm3())
    assert {s.remat for s in program.steps} == {None}
    assert list(program.schedule) == list(program.steps) and regions(program) == []


def test_a_remat_block_is_one_checkpoint_region():
    program = flatten(lm3(), remat={"block1": "full"})
    block1 = [s.path for s in program.steps if s.path.startswith("block1/")]
    assert regions(program) == [("block1", "full", block1)]
    assert {s.path for s in program.steps if s.remat} == set(block1)
    # the schedule holds every step once, in order
    flat = [s.path for u in program.schedule
            for s in (u.steps if isinstance(u, Checkpoint) else (u,))]
    assert flat == [s.path for s in program.steps]


def test_remat_of_single_layers_and_of_a_layer_in_a_block():
    program = flatten(lm3(), remat={"logits": "dots", "block0/attention": "full"})
    assert sorted(regions(program)) == [("block0/attention", "full", ["block0/attention"]),
                                        ("logits", "dots", ["logits"])]
    assert program.checkpoints() == {"block0/attention": "full", "logits": "dots"}


def test_a_remat_scan_is_rematerialized_block_by_block(scanned):
    program = flatten(scanned, remat={"block0..block2": "dots"})
    scan = program.steps[1]
    assert isinstance(scan, ScanStep) and scan.remat == "dots"
    assert regions(program) == []  # its blocks are checkpointed one by one, inside the scan
    assert all(s.remat is None for s in program.steps if s is not scan)
