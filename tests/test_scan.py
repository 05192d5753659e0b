"""Deep models: runs of equal blocks folded into one scan (``scan_blocks="always"``),
stacked weights, rematerialization. A scanned model must compute what the unscanned
one computes: outputs, gradients, BatchNorm updates and Trainer steps, compared here
with the unscanned model (itself checked against NumPy and plain JAX elsewhere)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.compiler.passes import fold_repeated_blocks, unfold_scans
from test_property import reference  # the NumPy reference interpreter

RTOL = 1e-5


def assert_trees_close(a, b, rtol=RTOL, atol=1e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def chain(block: mg.Graph, spec, depth: int, head=None) -> mg.Graph:
    x = mg.Input(spec, name="x")
    h = x
    for i in range(depth):
        h = block.as_block(f"block{i}")(h)
    return mg.Graph(x, head(h) if head else h, name="chain")


def resnet_stage(depth=3, channels=4):
    return chain(examples.residual_block(channels, "basic_block"), ("batch", 6, 6, channels), depth,
                 lambda h: ops.Linear(3, name="head")(ops.GlobalAvgPool()(h)))


def compile_both(graph, **options):
    return mg.compile(graph, **options), mg.compile(graph, scan_blocks="always", **options)


def test_a_run_of_equal_blocks_becomes_one_scan_node():
    lm = examples.transformer_lm(vocab=16, length=8, depth=4, width=16, heads=2)
    model = mg.compile(lm, scan_blocks="always")
    assert [n.name for n in model.graph.nodes] == ["tokens", "embed", "block0..block3", "ln_final",
                                                  "logits"]
    scan = model.graph.node("block0..block3").op
    assert scan.op_name == "scan" and scan.names == ("block0", "block1", "block2", "block3")
    assert "block0 … block3: transformer_block × 4" in model.summary()
    assert "%block0..block3: f32[batch,8,16] = scan" in str(model.graph)
    assert unfold_scans(model.graph) == mg.compile(lm).graph


def test_scanned_transformer_lm_equals_unscanned_outputs_gradients_and_init():
    lm = examples.transformer_lm(vocab=16, length=8, depth=3, width=16, heads=2, dropout=0.1)
    flat, scan = compile_both(lm)
    params, state = flat.init(jax.random.key(0))
    stacked, stacked_state = scan.init(jax.random.key(0))
    # init draws the same values, stacked on a leading axis
    assert_trees_close(scan.stack_weights(params, state)[0], stacked, rtol=0, atol=0)
    assert stacked["block0..block2"]["attention"]["query"]["kernel"].shape == (3, 16, 2, 8)
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 16)
    for inference_mode in (True, False):  # dropout: each block its own key, as unscanned
        rng = None if inference_mode else jax.random.key(2)
        out, _ = flat.apply(params, state, tokens, rng=rng, inference_mode=inference_mode)
        out_s, _ = scan.apply(stacked, stacked_state, tokens, rng=rng, inference_mode=inference_mode)
        np.testing.assert_allclose(out_s, out, rtol=RTOL, atol=1e-5)

    def loss(model, p, s):
        return model.apply(p, s, tokens, rng=jax.random.key(3))[0].astype(jnp.float32).sum()

    grads = jax.grad(lambda p: loss(flat, p, state))(params)
    grads_s = jax.grad(lambda p: loss(scan, p, stacked_state))(stacked)
    assert_trees_close(scan.unstack_weights(grads_s)[0], grads, atol=1e-4)


def test_a_resnet_stage_with_batchnorm_updates_its_state_as_unscanned():
    stage = resnet_stage()
    flat, scan = compile_both(stage)
    assert [n.name for n in scan.graph.nodes][1] == "block0..block2"
    params, state = flat.init(jax.random.key(0))
    stacked, stacked_state = scan.stack_weights(params, state)
    x = jax.random.normal(jax.random.key(1), (4, 6, 6, 4))
    out, new_state = flat.apply(params, state, x)
    out_s, new_state_s = scan.apply(stacked, stacked_state, x)
    np.testing.assert_allclose(out_s, out, rtol=RTOL, atol=1e-5)
    assert_trees_close(scan.unstack_weights(None, new_state_s)[1], new_state)
    # the statistics moved: the state is not passed through unchanged
    assert not np.allclose(new_state["block1"]["bn_a"]["mean"], state["block1"]["bn_a"]["mean"])


def test_trainer_steps_agree_and_checkpoint_layouts_convert(tmp_path):
    stage = resnet_stage()
    flat, scan = compile_both(stage)
    x = jax.random.normal(jax.random.key(1), (8, 6, 6, 4))
    y = jax.random.randint(jax.random.key(2), (8,), 0, 3)
    trainers = [mg.train.Trainer(m, optax.adam(1e-2), loss="softmax_cross_entropy") for m in (flat, scan)]
    states = [t.init(jax.random.key(0)) for t in trainers]
    for _ in range(3):
        states = [t.train_step(s, x, y)[0] for t, s in zip(trainers, states)]
    params_s, state_s = scan.unstack_weights(states[1].params, states[1].state)
    assert_trees_close(params_s, states[0].params, atol=1e-5)
    assert_trees_close(state_s, states[0].state, atol=1e-5)
    # the optimizer's moments are found and unstacked too
    opt = scan.unstack_weights(states[1].opt_state)[0]
    assert_trees_close(opt, states[0].opt_state, atol=1e-5)


def test_stack_and_unstack_round_trip_exactly_and_files_do_not_depend_on_scanning(tmp_path):
    stage = resnet_stage()
    flat, scan = compile_both(stage)
    params, state = flat.init(jax.random.key(5))
    stacked = scan.stack_weights(params, state)
    assert_trees_close(scan.unstack_weights(*stacked), (params, state), rtol=0, atol=0)
    assert_trees_close(scan.stack_weights(*scan.unstack_weights(*stacked)), stacked, rtol=0, atol=0)
    path = tmp_path / "stage.mlg"
    mg.save(path, scan.graph, *stacked)  # the scanned graph and layout...
    graph, loaded, loaded_state = mg.load(path)
    assert graph == flat.graph  # ... are written as the blocks' calls with their own weights
    assert_trees_close((loaded, loaded_state), (params, state), rtol=0, atol=0)


def test_blocks_that_differ_or_share_or_are_interrupted_are_not_folded():
    block = examples.transformer_block(length=4, width=8, heads=2, mlp=16)
    wider = examples.transformer_block(length=4, width=8, heads=2, mlp=32)
    x = mg.Input(("batch", 4, 8), name="x")
    h = block.as_block("a0")(x)
    h = wider.as_block("b0")(h)            # another width: not equal to a0
    shared = block.as_block("s")
    h = shared(shared(h))                  # one block called twice shares its weights
    h = block.as_block("c0")(h)
    h = block.as_block("c1")(h)
    h = ops.relu(h)                        # interrupts the run: two runs
    h = block.as_block("d0")(h)
    h = block.as_block("d1")(h)
    folded = fold_repeated_blocks(mg.Graph(x, h))
    names = [n.name for n in folded.nodes if n.name != "x"]
    assert names == ["a0", "b0", "s", "s@1", "c0..c1", "relu", "d0..d1"], names


def test_a_block_read_elsewhere_ends_its_run():
    block = examples.transformer_block(length=4, width=8, heads=2, mlp=16)
    x = mg.Input(("batch", 4, 8), name="x")
    a = block.as_block("b0")(x)
    b = block.as_block("b1")(a)
    c = block.as_block("b2")(b)
    folded = fold_repeated_blocks(mg.Graph(x, [ops.add(a, c)]))
    assert [n.name for n in folded.nodes] == ["x", "b0", "b1..b2", "add"]


@pytest.mark.parametrize("remat", ["full", "dots", {"block1": "full", "head": "dots"}])
@pytest.mark.parametrize("scan_blocks", [False, "always"])
def test_remat_gives_the_same_gradients(remat, scan_blocks):
    stage = resnet_stage()
    base = mg.compile(stage)
    model = mg.compile(stage, scan_blocks=scan_blocks, remat=remat)
    params, state = base.init(jax.random.key(0))
    p, s = model.stack_weights(params, state)
    x = jax.random.normal(jax.random.key(1), (2, 6, 6, 4))
    grads = jax.grad(lambda q: base.apply(q, state, x)[0].sum())(params)
    jaxpr = jax.make_jaxpr(jax.grad(lambda q: model.apply(q, s, x)[0].sum()))(p)
    assert "remat" in str(jaxpr)  # jax.checkpoint is in the program
    got = jax.grad(lambda q: model.apply(q, s, x)[0].sum())(p)
    assert_trees_close(model.unstack_weights(got)[0], grads, atol=1e-5)
    assert "remat:" in model.summary()


def test_remat_naming_no_layer_is_an_error():
    with pytest.raises(mg.GraphError, match="remat names 'blokc1'.*did you mean 'block1'"):
        mg.compile(resnet_stage(), remat={"blokc1": "full"})
    with pytest.raises(mg.GraphError, match="remat must be one of"):
        mg.compile(resnet_stage(), remat="sometimes")


def test_scanned_models_in_the_cost_table_and_hlo_by_layer():
    lm = examples.transformer_lm(vocab=16, length=8, depth=3, width=16, heads=2)
    flat, scan = compile_both(lm)
    table, flat_table = scan.cost_table(batch=2), flat.cost_table(batch=2, xla=False)
    assert table.flops == flat_table.flops and table.params == flat_table.params
    assert table["block0..block2"].flops == 3 * sum(r.flops for r in table if r.within)
    per_block = table["block0..block2/mlp_in"]
    assert per_block.within == "block0..block2" and per_block.flops == per_block.xla_flops
    by_layer = scan.hlo_by_layer(batch=2)
    assert any("dot" in (op.opcode,) + op.fused for op in by_layer["block0..block2/mlp_in"])


def test_a_scanned_model_exports_and_shards_on_a_mesh():
    lm = examples.transformer_lm(vocab=16, length=8, depth=2, width=16, heads=2)
    mesh = jax.make_mesh((1,), ("data",))
    model = mg.compile(lm, scan_blocks="always", mesh=mesh, rules={"batch": "data"})
    params, state = model.init(jax.random.key(0))
    kernel = model.sharding.params["block0..block1"]["mlp_in"]["kernel"]
    assert kernel.spec[0] is None  # the stacked axis "layers" is replicated: no rule maps it
    tokens = jnp.zeros((2, 8), jnp.int32)
    out, _ = model.apply(params, state, tokens)
    exported = mg.compile(lm, scan_blocks="always").export()
    again, _ = exported.call(params, state, tokens)
    np.testing.assert_allclose(again, out, rtol=RTOL, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(depth=st.integers(2, 4), width=st.sampled_from([4, 8]), activation=st.sampled_from(["relu", "tanh"]),
       second=st.booleans(), split=st.integers(0, 4))
def test_random_chains_of_equal_blocks_scanned_match_the_reference_interpreter(depth, width, activation,
                                                                               second, split):
    x = mg.Input(("batch", width), name="x")
    h = ops.Linear(width, name="fc")(x)
    h = getattr(ops, activation)(h)
    if second:
        h = ops.Linear(width, name="fc2")(h)
    block = mg.Graph(x, ops.add(x, h), name="res")
    y = mg.Input(("batch", width), name="y")
    h = y
    for i in range(depth):
        if i == split:
            h = ops.sigmoid(h)
        h = block.as_block(f"b{i}")(h)
    graph = mg.Graph(y, h, name="random_chain")
    flat, scan = compile_both(graph)
    params, state = flat.init(jax.random.key(depth))
    xs = jax.random.normal(jax.random.key(width), (3, width))
    (want,), _ = reference(flat.graph, params, state, (np.asarray(xs),), False, set())
    runs = [split, depth - split] if split < depth else [depth]  # the sigmoid splits the chain
    assert ("scan" in [n.op.op_name for n in scan.graph.nodes]) == any(r >= 2 for r in runs)
    out, _ = scan.apply(*scan.stack_weights(params, state), xs, inference_mode=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_the_memory_planner_fits_its_budget_as_xla_measures_it():
    lm = examples.transformer_lm(vocab=32, length=16, depth=4, width=32, heads=2)
    unplanned = mg.compile(lm, scan_blocks="always", memory_budget=2**40, dims={"batch": 4})
    plan = unplanned.memory_plan()
    # any choice fits: the planner keeps the fastest of the plans it timed
    assert plan.measured_peak <= plan.baseline_peak and set(plan.choice.values()) <= {"dots", "full"}
    budget = int(plan.baseline_peak * 0.6)
    model = mg.compile(lm, scan_blocks="always", memory_budget=budget, dims={"batch": 4})
    plan = model.memory_plan()
    assert plan.choice and plan.measured_peak <= budget < plan.baseline_peak, str(plan)
    # the measurement is XLA's: compile the gradient step again and read it back
    from mlaxgraph.compiler.memory import _peak, gradient_step
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((4, 16), jnp.int32)
    assert _peak(gradient_step(model.apply_fn, params, state, (tokens,))) == plan.measured_peak
    assert "remat:" in model.summary()
    with pytest.raises(mg.GraphError, match="cannot be met"):
        mg.compile(lm, scan_blocks="always", memory_budget=10_000, dims={"batch": 4})
    with pytest.raises(mg.GraphError, match="pass dims="):
        mg.compile(lm, memory_budget="1GiB")
    with pytest.raises(mg.GraphError, match="compiled without memory_budget"):
        mg.compile(lm).memory_plan()


def test_remat_shows_in_the_rendering_and_policies_fold_with_their_casts():
    stage = resnet_stage()
    model = mg.compile(stage, remat={"block1": "full"})
    assert model.remat == {"block1": "full"}
    assert "remat full" in model.to_dot()
    policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    flat, scan = compile_both(stage, policy=policy)
    assert "block0..block2" in [n.name for n in scan.graph.nodes]
    assert "cast" in [n.op.op_name for n in scan.graph.node("block0..block2").op.graph.nodes]
    params, state = flat.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 6, 6, 4))
    out, _ = flat.apply(params, state, x)
    out_s, _ = scan.apply(*scan.stack_weights(params, state), x)
    np.testing.assert_allclose(out_s, out, rtol=1e-2, atol=1e-2)  # bfloat16: the same casts
    assert out_s.dtype == np.float32


def test_fused_steps_and_checkpoints_of_a_scanned_model(tmp_path):
    stage = resnet_stage()
    flat, scan = compile_both(stage)
    xs = jax.random.normal(jax.random.key(1), (2, 4, 6, 6, 4))
    ys = jax.random.randint(jax.random.key(2), (2, 4), 0, 3)
    trainers = [mg.train.Trainer(m, optax.sgd(1e-2), loss="softmax_cross_entropy") for m in (flat, scan)]
    states = [t.train_steps(t.init(jax.random.key(0)), xs, ys)[0] for t in trainers]
    assert_trees_close(scan.unstack_weights(states[1].params)[0], states[0].params, atol=1e-5)
    manager = mg.train.CheckpointManager(tmp_path)
    manager.save(states[1])
    restored = manager.restore(trainers[1].init(jax.random.key(9)))
    assert_trees_close(restored.params, states[1].params, rtol=0, atol=0)


def test_the_explorer_draws_a_scanned_run_with_its_block_inside():
    lm = examples.transformer_lm(vocab=16, length=8, depth=3, width=16, heads=2)
    page = mg.compile(lm, scan_blocks="always").to_html(batch=2)
    assert "block0..block2/attention" in page and '"op":"scan"' in page.replace(" ", "")


def post_norm_chain(depth=3, width=8):
    """Blocks ending in a LayerNorm (BERT's post-norm): under a half-precision policy
    each block's output is float32, cast back to bfloat16 for the next block."""
    x = mg.Input(("batch", width), name="x")
    h = ops.LayerNorm(name="norm")(x + ops.Linear(width, activation="gelu", name="fc")(x))
    block = mg.Graph(x, h, name="post_norm")
    return chain(block, ("batch", width), depth, lambda h: ops.Linear(3, name="head")(h))


def test_post_norm_blocks_fold_under_a_policy_with_the_cast_after_each_block():
    g = post_norm_chain()
    flat, scan = compile_both(g, policy="mixed_bfloat16")
    scan_node = scan.graph.node("block0..block2")
    assert scan_node.op.casts == ("block0_bf16", "block1_bf16", "block2_bf16")
    assert [n.name for n in scan.graph.nodes] == ["x", "x_bf16", "block0..block2", "head"]
    assert unfold_scans(scan.graph) == flat.graph   # the casts back where they were
    params, state = flat.init(jax.random.key(0))
    assert_trees_close(scan.unstack_weights(*scan.init(jax.random.key(0)))[0], params, rtol=0, atol=0)
    x = jax.random.normal(jax.random.key(1), (4, 8))
    out, _ = flat.apply(params, state, x)
    # NumPy, in the policy's dtypes: each block computes in bfloat16, its norm in float32
    def bf16(a):
        return np.asarray(jnp.asarray(a, jnp.bfloat16))

    h = bf16(x)
    for i in range(3):
        p = params[f"block{i}"]
        pre = jnp.asarray(h, jnp.bfloat16) @ jnp.asarray(p["fc"]["kernel"], jnp.bfloat16) \
            + jnp.asarray(p["fc"]["bias"], jnp.bfloat16)
        s = (jnp.asarray(h, jnp.bfloat16) + jax.nn.gelu(pre, approximate=False)).astype(np.float32)
        s = np.asarray(s, np.float64)
        normed = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-6)
        h = bf16(normed * np.asarray(p["norm"]["scale"]) + np.asarray(p["norm"]["bias"]))
    np.testing.assert_allclose(np.asarray(out, np.float64),
                               bf16(h) @ bf16(params["head"]["kernel"]).astype(np.float64)
                               + bf16(params["head"]["bias"]), rtol=3e-2, atol=3e-2)
    out_s, _ = scan.apply(params, state, x)
    np.testing.assert_array_equal(out_s, out)
    for path in ("block1", "block1_bf16", "block1/norm"):   # captured as unscanned
        want = flat.apply(params, state, x, capture=path)[2][path]
        got = scan.apply(params, state, x, capture=path)[2][path]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    halved = scan.apply(params, state, x, intervene={"block1": lambda v: v / 2})[0]
    np.testing.assert_array_equal(halved, flat.apply(params, state, x, intervene={"block1": lambda v: v / 2})[0])
    stacked, stacked_state = scan.stack_weights(params, state)
    grad = jax.grad(lambda p: jnp.sum(flat.apply(p, state, x)[0].astype(np.float32)))(params)
    grad_s = jax.grad(lambda p: jnp.sum(scan.apply(p, stacked_state, x)[0].astype(np.float32)))(stacked)
    assert_trees_close(scan.unstack_weights(grad_s)[0], grad, rtol=2e-2, atol=1e-2)  # bfloat16 sums


def test_a_post_norm_run_whose_last_output_stays_float32_folds_without_its_last_block():
    x = mg.Input(("batch", 8), name="x")
    block = mg.Graph(x, ops.LayerNorm(name="norm")(ops.Linear(8, name="fc")(x)), name="post_norm")
    h = x
    for i in range(3):
        h = block.as_block(f"block{i}")(h)
    g = mg.Graph(x, ops.LayerNorm(name="final")(h))    # reads block2's float32 output as it is
    flat, scan = compile_both(g, policy="mixed_bfloat16")
    assert [n.name for n in scan.graph.nodes] == ["x", "x_bf16", "block0..block1", "block2", "final",
                                                  "final_bf16"]
    params, state = flat.init(jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (2, 8))
    np.testing.assert_array_equal(scan.apply(params, state, xs)[0], flat.apply(params, state, xs)[0])
