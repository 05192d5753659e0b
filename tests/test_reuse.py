"""init(key, reuse=(params, state)): only the new weights drawn (the values init gives
them), the kept ones the very arrays; weights given one block at a time stacked for a
scanning model; reuse keeping nothing, float weights for a quantized layer and arrays
deleted by a donation are errors naming the weight (init and apply)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler.lowering import make_init

CONFIG = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}
IDS = (np.arange(16, dtype=np.int32).reshape(2, 8) * 7) % 64


@pytest.fixture(scope="module")
def gpt2():
    g = mg.models.gpt2(CONFIG)
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    return g, model, params, state


def _paths(tree, prefix=""):
    if isinstance(tree, dict):
        return {p: v for k, w in tree.items() for p, v in _paths(w, f"{prefix}{k}/").items()}
    return {prefix[:-1]: tree}


def test_only_the_new_weights_are_drawn_with_the_values_init_gives_them(gpt2):
    g, _, params, state = gpt2
    adapted = mg.compile(mg.lora(g, "h.*/attn/qkv", rank=4))
    new = frozenset(adapted.reuse_report(params, state).new)
    assert len(new) == 4
    # The restricted init holds those weights alone.
    drawn = jax.eval_shape(make_init(adapted.program, np.float32, only=new), jax.random.key(0))
    assert set(_paths(drawn[0])) == new and not _paths(drawn[1])
    p2, _ = adapted.init(jax.random.key(1), reuse=(params, state))
    full, _ = adapted.init(jax.random.key(1))
    got, want, old = _paths(p2), _paths(full), _paths(params)
    assert list(got) == list(want)  # the model's own order
    for path, value in got.items():
        if path in new:
            np.testing.assert_array_equal(value, want[path])
        else:
            assert value is old[path]


def test_weights_of_the_graphs_own_layout_are_stacked_for_a_scanning_model(gpt2):
    g, model, params, state = gpt2
    scanned = mg.compile(mg.lora(g, "h.*/mlp.c_fc", rank=4), scan_blocks="always")
    report = scanned.reuse_report(params, state)
    assert (len(report.kept), report.new, report.dropped) == (
        len(_paths(scanned.stack_weights(params)[0])),
        ("h.0..h.1/mlp.c_fc.lora_A/kernel", "h.0..h.1/mlp.c_fc.lora_B/kernel"), ())
    p2, s2 = scanned.init(jax.random.key(1), reuse=(params, state))
    np.testing.assert_array_equal(p2["h.0..h.1"]["mlp.c_fc"]["kernel"],
                                  np.stack([params["h.0"]["mlp.c_fc"]["kernel"],
                                            params["h.1"]["mlp.c_fc"]["kernel"]]))
    # B starts at zero: the adapted model computes the base model's outputs.
    want, _ = model.apply(params, state, IDS, inference_mode=True)
    out, _ = scanned.apply(p2, s2, IDS, inference_mode=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_reuse_that_keeps_nothing_is_an_error_naming_a_weight(gpt2):
    g, _, _, _ = gpt2
    other = mg.models.gpt2({**CONFIG, "n_embd": 48})
    params, state = mg.compile(other).init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match=r"keeps no weight of the 36 in reuse: 36 are of "
                                            r"another shape or dtype \(such as h\.0/.*float32"):
        mg.compile(g).init(jax.random.key(1), reuse=(params, state))
    scanned = mg.compile(other, scan_blocks="always")
    stacked, stacked_state = scanned.init(jax.random.key(0))
    # unstacked into the blocks (below), then all of another shape
    with pytest.raises(mg.GraphError, match=r"keeps no weight of the 36 in reuse: 36 are of "
                                            r"another shape"):
        mg.compile(mg.models.gpt2({**CONFIG, "n_embd": 64})).init(
            jax.random.key(1), reuse=(stacked, stacked_state))


@pytest.mark.parametrize("scan", [False, "always"])
def test_a_scanned_models_stacked_weights_are_kept_per_block(scan):
    # they were dropped, and every block drawn again, without a word
    g = mg.models.gpt2({**CONFIG, "n_layer": 3})
    scanned = mg.compile(g, scan_blocks="always")
    stacked, stacked_state = scanned.init(jax.random.key(0))
    assert "h.0..h.2" in stacked
    per_block, per_block_state = scanned.unstack_weights(stacked, stacked_state)
    # h.0 adapted: a model that scans h.1..h.2 alone (scan), or none (unscanned)
    adapted = mg.compile(mg.lora(g, "h.0/mlp.c_fc", rank=4), scan_blocks=scan)
    report = adapted.reuse_report(stacked, stacked_state)
    assert not report.dropped and not report.changed and len(report.new) == 2
    params, state = adapted.init(jax.random.key(1), reuse=(stacked, stacked_state))
    ours = adapted.unstack_weights(params, state)[0] if scan else params
    for block in ("h.0", "h.1", "h.2"):
        np.testing.assert_array_equal(ours[block]["attn"]["query"]["kernel"],
                                      per_block[block]["attn"]["query"]["kernel"])
    want, _ = scanned.apply(stacked, stacked_state, IDS, inference_mode=True)
    out, _ = adapted.apply(params, state, IDS, inference_mode=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_float_weights_for_a_quantized_graph_are_an_error(gpt2):
    g, _, params, state = gpt2
    qlora = mg.compile(mg.lora(mg.quantize(g, "int8"), "h.*/mlp.c_fc", rank=4))
    with pytest.raises(mg.GraphError, match=r"weight .*kernel is int8.* \(a quantized layer's "
                                            r"stored weight\) and float32.*mg\.quantize_weights"):
        qlora.init(jax.random.key(1), reuse=(params, state))


def test_base_weights_a_full_fine_tuning_step_deleted_are_named_by_apply_and_reuse(gpt2):
    g, _, params, state = gpt2
    base = mg.compile(g)
    own = jax.tree.map(lambda w: w + 0, params)  # the base model's, not the fixture's
    adapted = mg.compile(mg.lora(g, "h.*/mlp.c_fc", rank=2))
    p2, s2 = adapted.init(jax.random.key(1), reuse=(own, state))
    trainer = mg.train.Trainer(adapted, optax.sgd(0.1))  # every weight trains: all donated
    trainer.train_step(trainer.init(jax.random.key(0)).replace(params=p2, state=s2), IDS, IDS)
    with pytest.raises(mg.GraphError, match=r"apply: params\['h\.0'\]\S+ was deleted: .*"
                                            r"Trainer\(trainable=\.\.\.\)"):
        base.apply(own, state, IDS, inference_mode=True)
    with pytest.raises(mg.GraphError, match=r"weight h\.0/.* of reuse was deleted"):
        adapted.init(jax.random.key(2), reuse=(own, state))
    out, _ = base.apply(params, state, IDS, inference_mode=True)  # arrays not donated: fine
    assert out.shape == (2, 8, 64)


def test_trainer_init_with_reuse_keeps_the_base_arrays_and_draws_the_adapters_as_init(gpt2):
    g, base, params, state = gpt2
    adapted = mg.compile(mg.lora(g, "h.*/mlp.c_fc", rank=2))
    trainer = mg.train.Trainer(adapted, optax.adam(1e-2), trainable="**/*.lora_*")
    ts = trainer.init(jax.random.key(3), reuse=(params, state))
    fresh = trainer.init(jax.random.key(3))
    init_key, _ = jax.random.split(jax.random.key(3))  # the Trainer's split of its key
    got, drawn = _paths(ts.params), _paths(adapted.init(init_key)[0])
    assert set(got) == set(drawn)
    for path, value in got.items():
        if ".lora_" in path:  # drawn as the model's init draws them
            np.testing.assert_array_equal(np.asarray(value), np.asarray(drawn[path]))
        else:                 # the base model's very arrays
            assert value is _paths(params)[path], path
    assert set(_paths(ts.opt_state[0].mu)) == {p for p in got if ".lora_" in p}
    assert int(ts.step) == 0 and np.array_equal(np.asarray(ts.rng), np.asarray(fresh.rng))
    ts, metrics = trainer.train_step(ts, IDS, IDS)
    assert np.isfinite(float(metrics["loss"]))
    # the frozen base weights were neither donated nor copied: the base model still runs
    out, _ = base.apply(params, state, IDS, inference_mode=True)
    assert np.isfinite(np.asarray(out)).all()
    with pytest.raises(mg.GraphError, match="keeps no weight"):
        trainer.init(jax.random.key(3), reuse=({"nothing": {"kernel": np.zeros(3)}}, {}))


def test_trainer_init_of_a_quantized_model_needs_its_stored_weights(gpt2):
    g, _, params, state = gpt2
    qg = mg.quantize(g, "int8_weight_only")
    qparams, qstate = mg.quantize_weights(qg, params, state)
    trainer = mg.train.Trainer(mg.compile(mg.lora(qg, "h.0/mlp.c_fc", rank=2)), optax.sgd(0.1),
                               trainable="**/*.lora_*")
    with pytest.raises(mg.GraphError, match=r"holds quantized weights \(\S+/kernel, \d+ in all\)"
                                            r".*draws as zeros.*reuse=\(qparams, qstate\)"):
        trainer.init(jax.random.key(0))
    ts = trainer.init(jax.random.key(0), reuse=(qparams, qstate))
    assert ts.params["h.0"]["mlp.c_fc"]["kernel"] is qparams["h.0"]["mlp.c_fc"]["kernel"]
    assert ts.params["h.0"]["mlp.c_fc"]["kernel"].dtype == np.int8


@pytest.mark.parametrize("scan", [False, True])
def test_a_scanned_models_weights_reach_the_blocks_left_after_one_is_removed(scan):
    """The stack h.0..h.2 holds three blocks by their numbers: after removing h.1, h.0 and
    h.2 keep theirs, one by one or stacked again (they were redrawn without a word)."""
    g = mg.models.gpt2({"n_layer": 3, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16})
    params, state = mg.compile(g, scan_blocks="always").init(jax.random.key(0))
    params["h.0..h.2"]["ln_1"]["scale"] = jnp.stack([jnp.full(32, v) for v in (5.0, 6.0, 7.0)])
    model = mg.compile(g.remove("h.1"), scan_blocks="always" if scan else False)
    kept, _ = model.init(jax.random.key(1), reuse=(params, state))
    scales = (kept["h.0..h.2"]["ln_1"]["scale"][:, 0] if scan else
              jnp.stack([kept["h.0"]["ln_1"]["scale"][0], kept["h.2"]["ln_1"]["scale"][0]]))
    np.testing.assert_array_equal(scales, [5.0, 7.0])
    report = model.reuse_report(params, state)
    assert all(path.startswith("h.1/") for path in report.dropped) and not report.new


def test_nested_scans_stack_unstack_and_reuse_at_both_levels():
    """Blocks of three sub-blocks, three times: scan_blocks="always" scans both levels,
    and the weights go both ways (the inner stacks were left as the outer's slices)."""
    def sub(name):
        x = mg.Input(("batch", 8), name="x")
        return mg.Graph(x, ops.relu(ops.Linear(8, name="fc")(x)) + x, name="sub").as_block(name=name)

    inner = mg.Input(("batch", 8), name="x")
    h = inner
    for i in range(3):
        h = sub(f"s{i}")(h)
    outer = mg.Graph(inner, h, name="outer")
    x = mg.Input(("batch", 8), name="x")
    y = x
    for j in range(3):
        y = outer.as_block(name=f"b{j}")(y)
    g = mg.Graph(x, y, name="nested")
    plain, scanned = mg.compile(g), mg.compile(g, scan_blocks="always")
    params, state = plain.init(jax.random.key(0))
    data = np.asarray(jax.random.normal(jax.random.key(2), (2, 8)))
    want = plain.apply(params, state, data)[0]
    stacked, stacked_state = scanned.stack_weights(params, state)
    assert stacked["b0..b2"]["s0..s2"]["fc"]["kernel"].shape == (3, 3, 8, 8)
    np.testing.assert_allclose(scanned.apply(stacked, stacked_state, data)[0], want, rtol=1e-6, atol=1e-6)
    back, _ = scanned.unstack_weights(stacked, stacked_state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    kept, _ = scanned.init(jax.random.key(7), reuse=(params, state))
    np.testing.assert_allclose(scanned.apply(kept, stacked_state, data)[0], want, rtol=1e-6, atol=1e-6)
    changed = scanned.graph.replace("b1/s1/relu", lambda layer, v: ops.tanh(v))
    report = mg.compile(changed, scan_blocks="always").reuse_report(stacked, stacked_state)
    assert not report.new and not report.dropped


def _bn_net():
    x = mg.Input(("batch", 8), name="x")
    h = ops.relu(ops.BatchNorm(name="bn")(ops.Linear(16, name="fc")(x)))
    return mg.compile(mg.Graph(x, ops.Linear(4, name="out")(h), name="net"))


def test_float_weights_in_another_float_dtype_are_kept_cast_not_redrawn():
    """A bfloat16 copy of a float32 model's weights (the BatchNorm state float32, so
    something else is kept) is kept cast to float32, as loading casts; the report
    says so."""
    model = _bn_net()
    params, state = model.init(jax.random.key(123))
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    report = model.reuse_report(half, state)
    assert len(report.cast) == 6 and not report.new and len(report.kept) == 8
    assert "6 kept cast to the model's dtype" in str(report) and "  cast: fc/kernel" in str(report)
    for reuse in (model.init, mg.train.Trainer(model, optax.sgd(0.1)).init):
        got = reuse(jax.random.key(0), reuse=(half, state))
        got = got if isinstance(got, tuple) else (got.params, got.state)
        for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(half)):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, np.asarray(b).astype(np.float32))
        assert got[1]["bn"]["mean"] is state["bn"]["mean"]


def test_a_weight_of_the_right_shape_in_a_dtype_that_cannot_be_cast_is_an_error():
    model = _bn_net()
    params, state = model.init(jax.random.key(0))
    wrong = dict(params, fc=dict(params["fc"], kernel=np.zeros((8, 16), np.int32)))
    with pytest.raises(mg.DTypeError, match=r"weight fc/kernel is float32\[8, 16\] here and "
                                             r"int32\[8, 16\] in reuse"):
        model.init(jax.random.key(1), reuse=(wrong, state))
    # another shape is a layer that changed: drawn new, as before
    other = dict(params, out={"kernel": np.zeros((16, 5), np.float32), "bias": np.zeros(5, np.float32)})
    report = model.reuse_report(other, state)
    assert set(report.changed) == {"out/bias", "out/kernel"}
