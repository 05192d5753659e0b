"""LoRA as a graph rewrite: adapters beside Linear and Embedding layers, checked against
NumPy references; merging, scanning, training only the adapters, and bad input."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

CONFIG = {"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}


@pytest.fixture(scope="module")
def gpt2():
    g = mg.models.gpt2(CONFIG)
    params, state = mg.compile(g).init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, 64)
    return g, params, state, ids


def _randomize_adapters(params, key):
    """Every adapter weight drawn normal (B nonzero, an Embedding's A nonzero)."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(key, len(leaves))
    out = [0.1 * jax.random.normal(k, w.shape, w.dtype) if ".lora_" in jax.tree_util.keystr(p) else w
           for k, (p, w) in zip(keys, leaves)]
    return jax.tree.unflatten(tree, out)


def _linear_graph(**lora_kwargs):
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.Linear(3, name="head")(ops.Linear(16, name="fc")(x)), name="two")
    return g, mg.lora(g, "fc", **lora_kwargs)


def test_nodes_are_named_after_the_target_and_base_weights_keep_their_paths(gpt2):
    g, params, state, _ = gpt2
    g2 = mg.lora(g, "h.*/mlp.c_fc", rank=4)
    assert g2.select("h.3/mlp.c_fc*") == ["h.3/mlp.c_fc", "h.3/mlp.c_fc.lora_A",
                                          "h.3/mlp.c_fc.lora_B", "h.3/mlp.c_fc.lora_scale",
                                          "h.3/mlp.c_fc.lora"]
    report = mg.compile(g2).reuse_report(params, state)
    assert not report.dropped and not report.changed
    assert sorted(report.new) == sorted(f"h.{i}/mlp.c_fc.lora_{ab}/kernel"
                                        for i in range(4) for ab in "AB")
    p2, _ = mg.compile(g2).init(jax.random.key(1), reuse=(params, state))
    assert p2["h.2"]["mlp.c_fc"]["kernel"] is params["h.2"]["mlp.c_fc"]["kernel"]
    assert not np.any(np.asarray(p2["h.2"]["mlp.c_fc.lora_B"]["kernel"]))
    a = np.asarray(p2["h.2"]["mlp.c_fc.lora_A"]["kernel"])
    assert a.shape == (32, 4) and np.abs(a).max() <= 1 / np.sqrt(32) and a.std() > 0.05


def test_zero_b_equals_the_base_model_bit_for_bit(gpt2):
    g, params, state, ids = gpt2
    base, _ = mg.compile(g).apply(params, state, ids, inference_mode=True)
    model = mg.compile(mg.lora(g, "h.*/mlp.c_fc", rank=4, alpha=16))
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    out, _ = model.apply(p2, s2, ids, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(base))
    # Elsewhere the adapter adds exact zeros too; XLA may fuse the program otherwise
    # (a last-bit difference downstream), so these are compared closely.
    model = mg.compile(mg.lora(g, ["h.*/mlp.c_proj", "wte"], rank=2))
    p3, s3 = model.init(jax.random.key(1), reuse=(params, state))
    out, _ = model.apply(p3, s3, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(base), atol=1e-4)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_adapted_linear_equals_numpy(use_rslora):
    g, g2 = _linear_graph(rank=2, alpha=3.0, use_rslora=use_rslora)
    model = mg.compile(g2)
    params, state = model.init(jax.random.key(0))
    params = _randomize_adapters(params, jax.random.key(1))
    x = np.asarray(jax.random.normal(jax.random.key(2), (5, 8)))
    out, _ = model.apply(params, state, x)
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    scale = 3.0 / (np.sqrt(2) if use_rslora else 2)
    h = (x @ p["fc"]["kernel"] + p["fc"]["bias"]
         + scale * (x @ p["fc.lora_A"]["kernel"]) @ p["fc.lora_B"]["kernel"])
    want = h @ p["head"]["kernel"] + p["head"]["bias"]
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_adapted_embedding_equals_numpy():
    ids = mg.Input(("batch", 5), "int32", name="ids")
    g = mg.Graph(ids, ops.Embedding(10, 6, name="emb")(ids))
    model = mg.compile(mg.lora(g, "emb", rank=3, alpha=6))
    params, state = model.init(jax.random.key(0))
    assert not np.any(np.asarray(params["emb.lora_A"]["embedding"]))   # A starts at zero
    params = _randomize_adapters(params, jax.random.key(1))
    x = np.array([[0, 3, 9, 3, 1], [2, 2, 5, 7, 8]], np.int32)
    out, _ = model.apply(params, state, x)
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    want = p["emb"]["embedding"][x] + 2.0 * p["emb.lora_A"]["embedding"][x] @ p["emb.lora_B"]["kernel"]
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)


def test_dropout_applies_to_the_adapters_input_in_training():
    _, g2 = _linear_graph(rank=2, dropout=0.5)
    assert "fc.lora_dropout" in g2.select("fc*")
    model = mg.compile(g2)
    params, state = model.init(jax.random.key(0))
    params = _randomize_adapters(params, jax.random.key(1))
    x = jnp.ones((4, 8))
    a, _ = model.apply(params, state, x, rng=jax.random.key(3))
    b, _ = model.apply(params, state, x, inference_mode=True)
    assert not np.allclose(np.asarray(a), np.asarray(b))


def test_merged_equals_unmerged_and_gives_the_base_graph_back(gpt2):
    g, params, state, ids = gpt2
    g2 = mg.lora(g, ["h.*/mlp.c_fc", "h.1/mlp.c_proj", "wpe"], rank=4, alpha=8)
    model = mg.compile(g2)
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    p2 = _randomize_adapters(p2, jax.random.key(4))
    adapted, _ = model.apply(p2, s2, ids, inference_mode=True)
    merged_graph, merged = mg.merge_lora(g2, p2)
    assert merged_graph == g
    assert jax.tree.structure(merged) == jax.tree.structure(params)
    assert not mg.lora_params(merged)
    out, _ = mg.compile(merged_graph).apply(merged, state, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(adapted), rtol=1e-4, atol=1e-4)
    assert not np.allclose(np.asarray(out), np.asarray(
        mg.compile(g).apply(params, state, ids, inference_mode=True)[0]))
    # The merged kernel is W + scale * A @ B, checked in NumPy.
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), p2["h.1"])
    want = p["mlp.c_proj"]["kernel"] + 2.0 * p["mlp.c_proj.lora_A"]["kernel"] @ p["mlp.c_proj.lora_B"]["kernel"]
    np.testing.assert_allclose(np.asarray(merged["h.1"]["mlp.c_proj"]["kernel"]), want, rtol=1e-5, atol=1e-6)


def test_merge_lora_given_the_base_params_names_the_adapter_and_the_init(gpt2):
    g, params, state, _ = gpt2
    for targets, adapter in (("h.*/mlp.c_fc", "h.0/mlp.c_fc.lora_A/kernel"),
                             ("h.*/attn/qkv", "h.0/attn.qkv.lora_A/kernel")):
        with pytest.raises(mg.GraphError, match=rf"merge_lora: params have no adapter weight "
                                                rf"'{adapter}' .*model.init\(key, "
                                                rf"reuse=\(base_params, base_state\)\)"):
            mg.merge_lora(mg.lora(g, targets, rank=2), params)
    g2 = mg.lora(g, "h.*/mlp.c_fc", rank=2)
    stacked = mg.compile(g2, scan_blocks="always").init(jax.random.key(0), reuse=(params, state))[0]
    with pytest.raises(mg.GraphError, match=r"params have no weight 'h.0/mlp.c_fc/kernel' of "
                                            r"'h.0/mlp.c_fc' \(give the adapted graph's params, "
                                            r"unscanned: model.unstack_weights gives them\)"):
        mg.merge_lora(g2, stacked)


def test_a_tied_embedding_is_not_merged(gpt2):
    g, params, state, _ = gpt2
    g2 = mg.lora(g, "wte", rank=2)
    p2, _ = mg.compile(g2).init(jax.random.key(1), reuse=(params, state))
    with pytest.raises(mg.GraphError, match="'wte'.*tied"):
        mg.merge_lora(g2, p2)


def test_scanned_equals_unscanned(gpt2):
    g, params, state, ids = gpt2
    g2 = mg.lora(g, "h.*/mlp.c_fc", rank=4)
    flat = mg.compile(g2)
    p2, s2 = flat.init(jax.random.key(1), reuse=(params, state))
    p2 = _randomize_adapters(p2, jax.random.key(4))
    want, _ = flat.apply(p2, s2, ids, inference_mode=True)
    scanned = mg.compile(g2, scan_blocks="always")
    assert [n.name for n in scanned.graph.nodes if n.name.startswith("h.")] == ["h.0..h.3"]
    stacked, stacked_state = scanned.stack_weights(p2, s2)
    adapters = mg.lora_params(stacked)
    assert jax.tree.map(jnp.shape, adapters) == {"h.0..h.3": {
        "mlp.c_fc.lora_A": {"kernel": (4, 32, 4)}, "mlp.c_fc.lora_B": {"kernel": (4, 4, 128)}}}
    out, _ = scanned.apply(stacked, stacked_state, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_lora_params_keeps_only_the_adapters(gpt2):
    g, _, _, _ = gpt2
    params, _ = mg.compile(mg.lora(g, ["h.0/mlp.c_fc", "wpe"], rank=2)).init(jax.random.key(0))
    assert jax.tree.map(jnp.shape, mg.lora_params(params)) == {
        "h.0": {"mlp.c_fc.lora_A": {"kernel": (32, 2)}, "mlp.c_fc.lora_B": {"kernel": (2, 128)}},
        "wpe.lora_A": {"embedding": (16, 2)}, "wpe.lora_B": {"kernel": (2, 32)}}


@pytest.mark.parametrize("trainable", ["**/*.lora_*", lambda path: ".lora_" in path])
def test_trainer_trains_only_the_adapters(trainable):
    x = mg.Input(("batch", 8), name="x")
    h = ops.Linear(16, name="fc")(x)
    y = mg.Input(("batch", 16), name="y")
    block = mg.Graph(y, ops.Linear(16, name="inner")(y), name="block")
    g = mg.Graph(x, ops.Linear(3, name="head")(block(h)))
    model = mg.compile(mg.lora(g, ["fc", "block/inner"], rank=2))
    trainer = mg.train.Trainer(model, optax.adam(1e-2), trainable=trainable)
    ts = trainer.init(jax.random.key(0))
    # B = 0 would leave A's gradient zero in the first step.
    ts = ts.replace(params=_randomize_adapters(ts.params, jax.random.key(4)))
    before = jax.tree.map(np.asarray, ts.params)
    inputs = jax.random.normal(jax.random.key(5), (6, 8))
    ts, metrics = trainer.train_step(ts, inputs, jnp.arange(6) % 3)
    assert np.isfinite(float(metrics["loss"]))
    flat_before = dict(jax.tree_util.tree_flatten_with_path(before)[0])
    for path, value in jax.tree_util.tree_flatten_with_path(ts.params)[0]:
        if ".lora_" in jax.tree_util.keystr(path):
            assert not np.array_equal(np.asarray(value), flat_before[path]), path
        else:
            np.testing.assert_array_equal(np.asarray(value), flat_before[path])
    # Adam's moments mirror the adapters alone.
    adapters = {jax.tree_util.keystr(p) for p, _ in
                jax.tree_util.tree_flatten_with_path(mg.lora_params(before))[0]}
    assert len(adapters) == 4
    for moments in (ts.opt_state[0].mu, ts.opt_state[0].nu):
        assert {jax.tree_util.keystr(p) for p, _ in
                jax.tree_util.tree_flatten_with_path(moments)[0]} == adapters


def test_training_the_adapters_keeps_the_reused_base_weights():
    """init(reuse=) shares the base model's arrays; the step donates only what trains,
    so the base model still runs, and the adapters' step equals optax's by hand."""
    g, g2 = _linear_graph(rank=2)
    base = mg.compile(g)
    params, state = base.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(5), (6, 8))
    y = jnp.arange(6) % 3
    before, _ = base.apply(params, state, x)
    adapted = mg.compile(g2)
    p2, s2 = adapted.init(jax.random.key(1), reuse=(params, state))
    p2 = _randomize_adapters(p2, jax.random.key(3))
    tx = optax.adam(1e-2)
    trainer = mg.train.Trainer(adapted, tx, trainable="*/lora_*")
    ts = trainer.init(jax.random.key(0)).replace(params=p2, state=s2)

    def loss(adapters):  # the reference: jax.grad and optax on the adapters alone
        logits, _ = adapted.apply_fn({**p2, **adapters}, s2, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    adapters = {k: v for k, v in p2.items() if ".lora_" in k}
    with jax.numpy_dtype_promotion("standard"):  # optax mixes floats and int counters
        updates, _ = tx.update(jax.grad(loss)(adapters), tx.init(adapters), adapters)
    wanted = optax.apply_updates(adapters, updates)
    ts, _ = trainer.train_step(ts, x, y)
    kernel = ts.params["fc"]["kernel"]
    assert kernel is params["fc"]["kernel"] and not kernel.is_deleted()
    for name, value in wanted.items():
        np.testing.assert_allclose(ts.params[name]["kernel"], value["kernel"], rtol=1e-5,
                                   atol=1e-6)
    ts, _ = trainer.train_steps(ts, x[None], y[None])
    assert ts.params["head"]["kernel"] is params["head"]["kernel"]
    after, _ = base.apply(params, state, x)
    np.testing.assert_array_equal(after, before)


def _scan_outputs(jaxpr):
    """The shapes of every array a ``scan`` in ``jaxpr`` (nested ones included) returns."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            shapes += [tuple(v.aval.shape) for v in eqn.outvars]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                    shapes += _scan_outputs(getattr(sub, "jaxpr", sub))
    return shapes


@pytest.mark.parametrize("scheme", [None, "int8_weight_only", "int4_weight_only"])
def test_a_scanned_step_keeps_no_stacked_copy_of_the_frozen_kernels(gpt2, scheme):
    """The adapters' gradient through a scan over blocks needs each block's frozen
    kernels in the backward loop: they are read from the stack the model holds, never
    returned by the forward loop as a second stack (the base weights restacked; with
    QLoRA, dequantized to float)."""
    g, _, _, ids = gpt2
    if scheme is not None:
        g = mg.quantize(g, scheme, **({"group_size": 16} if scheme.startswith("int4") else {}))
    model = mg.compile(mg.lora(g, ["h.*/attn/qkv", "h.*/mlp.c_fc"], rank=2), scan_blocks="always")
    trainer = mg.train.Trainer(model, optax.adam(1e-2), loss="softmax_cross_entropy",
                               trainable="**/*.lora_*")
    ts = jax.eval_shape(trainer.init_fn, jax.random.key(0))  # shapes: nothing drawn
    stacked = {s for s in _scan_outputs(jax.make_jaxpr(trainer.train_step)(ts, ids, ids).jaxpr)
               if len(s) > 1 and s[0] == CONFIG["n_layer"]}
    d, hidden = CONFIG["n_embd"], 4 * CONFIG["n_embd"]
    kernels = {(CONFIG["n_layer"],) + k for k in [(d, d), (d, 3 * d), (d, hidden), (hidden, d),
                                                  (d, CONFIG["n_head"], d // CONFIG["n_head"]),
                                                  (CONFIG["n_head"], d // CONFIG["n_head"], d)]}
    assert stacked, "the forward loop returns its activations for the backward"
    assert not stacked & kernels, sorted(stacked & kernels)


def test_trainable_matching_nothing_lists_weight_paths():
    g, _ = _linear_graph(rank=2)
    with pytest.raises(mg.GraphError, match="matches no weight.*such as fc/"):
        mg.train.Trainer(mg.compile(g), optax.sgd(0.1), trainable="fc.lora_*")
    with pytest.raises(mg.GraphError, match="glob over weight paths"):
        mg.train.Trainer(mg.compile(g), optax.sgd(0.1), trainable=3)
    # a block folded into a scanned run: its path is the run's (surgery and capture take h.1)
    scanned = mg.compile(mg.models.gpt2(CONFIG), scan_blocks="always")
    with pytest.raises(mg.GraphError, match=r"block 'h.1' is folded into the scan 'h.0..h.3', "
                                            r"whose weights are stacked"):
        mg.train.Trainer(scanned, optax.sgd(0.1), trainable="h.1/*")


def test_trainable_names_adapters_as_parts_of_their_targets():
    x = mg.Input(("batch", 8), name="x")
    y = mg.Input(("batch", 16), name="y")
    block = mg.Graph(y, ops.Linear(16, name="inner")(y), name="block")
    g = mg.Graph(x, ops.Linear(3, name="head")(block(ops.Linear(16, name="fc")(x))))
    model = mg.compile(mg.lora(g, ["fc", "block/inner"], rank=2))
    every = {"block/inner.lora_A/kernel", "block/inner.lora_B/kernel", "fc.lora_A/kernel",
             "fc.lora_B/kernel"}
    # A pattern matches at any depth (as PEFT's target_modules), anchored by a leading /.
    for pattern, chosen in [("**/lora_*", every), ("**/*.lora_*", every), ("*/lora_*", every),
                            ("lora_A", {"block/inner.lora_A/kernel", "fc.lora_A/kernel"}),
                            ("/*/lora_*", {"fc.lora_A/kernel", "fc.lora_B/kernel"}),
                            ("inner/lora_B", {"block/inner.lora_B/kernel"}),
                            ("block/*/lora_B", {"block/inner.lora_B/kernel"})]:
        assert mg.train.Trainer(model, optax.sgd(0.1), trainable=pattern).trainable == chosen
    # A pattern matching nothing says how the adapters are named.
    with pytest.raises(mg.GraphError, match=r'adapters.*trainable="\*/lora_\*"'):
        mg.train.Trainer(model, optax.sgd(0.1), trainable="layers.*/lora_*")


def test_bad_input_is_an_error_naming_it(gpt2):
    g, _, _, _ = gpt2
    with pytest.raises(mg.GraphError, match="matches no layer.*near names: .*h.0/mlp.c_fc"):
        mg.lora(g, "h.*/mlp.c_fcc", rank=2)
    with pytest.raises(mg.GraphError, match="has no layer 'h.9/mlp.c_fc'"):
        mg.lora(g, "h.9/mlp.c_fc", rank=2)
    for kwargs, word in (({"rank": 0}, "rank"), ({"rank": -1}, "rank"), ({"rank": 2.0}, "rank"),
                         ({"rank": 2, "alpha": 0}, "alpha"), ({"rank": 2, "alpha": -1.0}, "alpha"),
                         ({"rank": 2, "dropout": 1.0}, "dropout"),
                         ({"rank": 2, "dropout": -0.1}, "dropout")):
        with pytest.raises(mg.ConfigError, match=f"lora: {word} must"):
            mg.lora(g, "h.0/mlp.c_fc", **kwargs)
    with pytest.raises(mg.ConfigError, match=r"lora got unexpected keyword argument 'r' "
                                             r"\(PEFT's r is rank=\)"):
        mg.lora(g, "h.0/mlp.c_fc", r=2)   # PEFT's spelling alone: named, not a TypeError
    with pytest.raises(mg.ConfigError, match=r"lora needs targets \(PEFT's target_modules\) and "
                                             r"rank= \(PEFT's r\); it takes lora\(graph, targets"):
        mg.lora(g)
    assert mg.lora(g, "h.0/mlp.c_fc", rank=np.int64(2)) == mg.lora(g, "h.0/mlp.c_fc", rank=2)
    with pytest.raises(mg.ConfigError, match="'h.0/ln_1'.*does not adapt op 'layer_norm'"):
        mg.lora(g, "h.*/ln_1", rank=2)
    with pytest.raises(mg.ConfigError, match="adapter already"):
        mg.lora(mg.lora(g, "h.0/mlp.c_fc", rank=2), "h.0/mlp.c_fc", rank=2)
    adapted = mg.lora(g, ["h.0/mlp.c_fc", "h.0/attn/qkv"], rank=2)
    for pattern, own, base in (("h.0/mlp.*.lora_A", "h.0/mlp.c_fc.lora_A", "h.0/mlp.c_fc"),
                               ("h.0/attn.*.lora_B", "h.0/attn.qkv.lora_B", "h.0/attn/qkv")):
        with pytest.raises(mg.ConfigError) as e:
            mg.lora(adapted, pattern, rank=2)
        assert str(e.value).startswith(f"layer {own!r} (op linear): this is a LoRA adapter's own "
                                       f"layer, not a layer of the model; select the layer it "
                                       f"adapts ({base!r})"), e.value
    with pytest.raises(mg.ConfigError, match="'h.0/attn.qkv.lora_A' .* a LoRA adapter's own"):
        mg.lora(adapted, "**/*.lora_A", rank=2)
    with pytest.raises(mg.GraphError, match="merge_lora: graph 'gpt2' has no LoRA adapters"):
        mg.merge_lora(g, mg.compile(g).init(jax.random.key(0))[0])  # the base graph, by mistake
    params, state = mg.compile(adapted).init(jax.random.key(0))
    usage = r"merge_lora\(graph, params\) takes the adapted graph and its params and returns"
    with pytest.raises(mg.ConfigError, match=usage + r".*1 more positional argument\(s\) "
                                             r"\(merging changes no state"):
        mg.merge_lora(adapted, params, state)   # as apply takes them: named, not a TypeError
    with pytest.raises(mg.ConfigError, match=usage + r".*'param' \(did you mean params\?\)"):
        mg.merge_lora(adapted, param=params)


# --- Conv -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet():
    g = mg.models.resnet18(10, image_size=32, width=8)
    params, state = mg.compile(g).init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(2), (2, 32, 32, 3))
    return g, params, state, x


def _conv(x, kernel, strides, padding):
    """An independent reference: NHWC input, OHWI kernel."""
    return jax.lax.conv_general_dilated(x, kernel, strides, padding,
                                        dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                        precision=jax.lax.Precision.HIGHEST)


def test_conv_adapter_nodes_shapes_and_init(resnet):
    g, params, state, x = resnet
    g2 = mg.lora(g, "layer2.0/conv1", rank=3)
    assert g2.select("layer2.0/conv1*") == ["layer2.0/conv1", "layer2.0/conv1.lora_A",
                                            "layer2.0/conv1.lora_B", "layer2.0/conv1.lora_scale",
                                            "layer2.0/conv1.lora"]
    p2, _ = mg.compile(g2).init(jax.random.key(1), reuse=(params, state))
    adapters = mg.lora_params(p2)["layer2.0"]
    a, b = (np.asarray(adapters[f"conv1.lora_{ab}"]["kernel"]) for ab in "AB")
    base = p2["layer2.0"]["conv1"]["kernel"]
    assert a.shape == (3, 3, 3, base.shape[-1]) and b.shape == (base.shape[0], 1, 1, 3)
    assert not np.any(b)
    bound = 1 / np.sqrt(base.shape[-1] * 9)
    assert np.abs(a).max() <= bound and a.std() > 0.4 * bound
    assert p2["layer2.0"]["conv1"]["kernel"] is params["layer2.0"]["conv1"]["kernel"]


def test_conv_zero_b_equals_the_base_model_bit_for_bit(resnet):
    g, params, state, x = resnet
    base, _ = mg.compile(g).apply(params, state, x, inference_mode=True)
    model = mg.compile(mg.lora(g, ["layer1.*/conv*", "layer2.0/conv1", "conv1"], rank=4, alpha=8))
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    out, _ = model.apply(p2, s2, x, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(base))


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_adapted_conv_equals_a_reference(data_format):
    # A strided, padded, dilated conv: the adapter's output is
    # scale * conv(conv(x, A), B) with A sharing the base conv's window.
    shape = ("batch", 9, 11, 5) if data_format == "NHWC" else ("batch", 5, 9, 11)
    x_in = mg.Input(shape, name="x")
    conv = ops.Conv(6, (3, 2), strides=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2),
                    data_format=data_format, name="c")
    g = mg.Graph(x_in, conv(x_in))
    model = mg.compile(mg.lora(g, "c", rank=2, alpha=3.0))
    params, state = model.init(jax.random.key(0))
    params = _randomize_adapters(params, jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (2, 9, 11, 5))
    to_data = (lambda t: t) if data_format == "NHWC" else (lambda t: jnp.transpose(t, (0, 3, 1, 2)))
    to_ohwi = (lambda k: k) if data_format == "NHWC" else (lambda k: jnp.transpose(k, (0, 2, 3, 1)))
    out, _ = model.apply(params, state, to_data(x))
    k = {name: to_ohwi(params[name]["kernel"]) for name in ("c", "c.lora_A", "c.lora_B")}
    pad = ((1, 2), (0, 1))

    def window(x, kernel):
        return jax.lax.conv_general_dilated(x, kernel, (2, 1), pad, rhs_dilation=(1, 2),
                                            dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                            precision=jax.lax.Precision.HIGHEST)
    want = (window(x, k["c"]) + params["c"]["bias"]
            + 1.5 * _conv(window(x, k["c.lora_A"]), k["c.lora_B"], (1, 1), "VALID"))
    np.testing.assert_allclose(np.asarray(out), np.asarray(to_data(want)), rtol=1e-5, atol=1e-5)


def test_adapted_resnet_conv_equals_a_reference(resnet):
    # layer2.0/conv1: 3x3, stride 2, padding 1, reading layer1.1's output.
    g, params, state, x = resnet
    model = mg.compile(mg.lora(g, "layer2.0/conv1", rank=4, alpha=2))
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    p2 = _randomize_adapters(p2, jax.random.key(3))
    _, _, got = model.apply(p2, s2, x, inference_mode=True,
                            capture=["layer1.1", "layer2.0/conv1", "layer2.0/conv1.lora"])
    k = {name: p2["layer2.0"][name]["kernel"] for name in ("conv1", "conv1.lora_A", "conv1.lora_B")}
    h, pad = got["layer1.1"], ((1, 1), (1, 1))
    base = _conv(h, k["conv1"], (2, 2), pad)
    np.testing.assert_allclose(np.asarray(got["layer2.0/conv1"]), np.asarray(base), rtol=1e-5, atol=1e-5)
    delta = 0.5 * _conv(_conv(h, k["conv1.lora_A"], (2, 2), pad), k["conv1.lora_B"], (1, 1), "VALID")
    assert float(jnp.abs(delta).max()) > 0.1
    np.testing.assert_allclose(np.asarray(got["layer2.0/conv1.lora"]), np.asarray(base + delta),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_conv_merged_equals_unmerged(data_format):
    g = mg.models.resnet18(10, data_format, image_size=32, width=8)
    params, state = mg.compile(g).init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(2), (2, 32, 32, 3))
    if data_format == "NCHW":
        x = jnp.transpose(x, (0, 3, 1, 2))
    g2 = mg.lora(g, ["conv1", "layer1.0/conv1", "layer2.0/conv2", "layer3.0/downsample.0"],
                 rank=4, alpha=8)
    model = mg.compile(g2)
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    p2 = _randomize_adapters(p2, jax.random.key(4))
    adapted, _ = model.apply(p2, s2, x, inference_mode=True)
    merged_graph, merged = mg.merge_lora(g2, p2)
    assert merged_graph == g and not mg.lora_params(merged)
    assert jax.tree.structure(merged) == jax.tree.structure(params)
    out, _ = mg.compile(merged_graph).apply(merged, state, x, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(adapted), rtol=1e-4, atol=1e-4)
    base, _ = mg.compile(g).apply(params, state, x, inference_mode=True)
    assert not np.allclose(np.asarray(out), np.asarray(base))
    # The merged kernel is W + scale * sum_r B[o, r] A[r, ...], checked in NumPy.
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), p2["layer1.0"])
    a, b = p["conv1.lora_A"]["kernel"], p["conv1.lora_B"]["kernel"]
    b = b.reshape(b.shape[0], a.shape[0])
    want = p["conv1"]["kernel"] + 2.0 * np.einsum("or,r...->o...", b, a)
    np.testing.assert_allclose(np.asarray(merged["layer1.0"]["conv1"]["kernel"]), want,
                               rtol=1e-5, atol=1e-6)


def test_a_grouped_convs_adapter_has_b_grouped_as_peft_and_an_activated_conv_is_refused():
    # PEFT's adapter of a grouped conv: A a full conv to rank channels, B a 1x1 conv
    # grouped as the target (rank divisible by the groups); not merged
    x = mg.Input(("batch", 8, 8, 4), name="x")
    h = ops.Conv(6, (3, 3), padding="SAME", groups=2, name="grouped")(x)
    g = mg.Graph(x, ops.Conv(4, (1, 1), activation="relu", name="fused")(h))
    with pytest.raises(mg.ConfigError, match="'grouped'.*groups=2.*rank must be divisible by 2, got rank=3"):
        mg.lora(g, "grouped", rank=3)
    with pytest.raises(mg.ConfigError, match="'fused'.*applies 'relu'"):
        mg.lora(g, "fused", rank=2)
    adapted = mg.lora(g, "grouped", rank=4, alpha=2)
    model = mg.compile(adapted)
    params, state = model.init(jax.random.key(0))
    params = _randomize_adapters(params, jax.random.key(1))
    k = {name: params[name]["kernel"] for name in ("grouped", "grouped.lora_A", "grouped.lora_B")}
    assert k["grouped.lora_A"].shape == (4, 3, 3, 4) and k["grouped.lora_B"].shape == (6, 1, 1, 2)
    xs = jax.random.normal(jax.random.key(2), (2, 8, 8, 4))
    _, _, got = model.apply(params, state, xs, inference_mode=True, capture=["grouped.lora"])

    def conv(x, kernel, groups):
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", feature_group_count=groups,
                                            dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                            precision=jax.lax.Precision.HIGHEST)
    want = (conv(xs, k["grouped"], 2) + params["grouped"]["bias"]
            + 0.5 * conv(conv(xs, k["grouped.lora_A"], 1), k["grouped.lora_B"], 2))
    np.testing.assert_allclose(np.asarray(got["grouped.lora"]), np.asarray(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(mg.GraphError, match="'grouped' is a grouped Conv \\(groups=2\\).*keep the "
                                            "adapter unmerged"):
        mg.merge_lora(adapted, params)


def test_what_lora_cannot_adapt_as_asked_is_named():
    q = mg.Input(("batch", 6, 12), name="q")
    kv = mg.Input(("batch", 6, 12), name="kv")
    cross = mg.Graph([q, kv], ops.MultiHeadAttention(4, 5, name="att")(q, kv), name="cross")
    # the fused adapter would read the queries for the keys and values too
    with pytest.raises(mg.ConfigError, match="'att'.*a fused qkv adapter reads one sequence.*"
                                             "cross-attention"):
        mg.lora(cross, "att/qkv", rank=3)
    adapted = mg.lora(cross, ["att/query", "att/key", "att/value"], rank=3)
    assert [v.node for v in adapted.node("att.key.lora_A").inputs] == ["kv"]
    x = mg.Input(("batch", 8), name="x")
    fc = ops.Linear(8, name="fc")
    twice = mg.Graph(x, ops.Linear(3, name="head")(fc(ops.relu(fc(x)))))
    with pytest.raises(mg.ConfigError, match=r"'fc'.*called 2 times \(fc, fc@1\)"):
        mg.lora(twice, "fc", rank=2)
    with pytest.raises(mg.ConfigError, match=r"rank and the rest by keyword: lora\(graph, targets, "
                                             r"rank=2"):
        mg.lora(twice, "head", 2)
    adapted = mg.lora(twice, "head", rank=2, alpha=np.float32(4), dropout=jnp.float32(0.1))
    assert float(adapted.node("head.lora_scale").op.constant) == 2.0
    with pytest.raises(mg.ConfigError, match="alpha must be finite"):
        mg.lora(twice, "head", rank=2, alpha=float("nan"))
    model = mg.compile(adapted)
    with pytest.raises(mg.GraphError, match=r"calls a predicate as f\(path\) -> bool"):
        mg.Trainer(model, optax.sgd(0.1), trainable=lambda path, leaf: True)


def test_merge_lora_refuses_adapters_of_another_rank():
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.Linear(6, name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    two, four = mg.lora(g, "fc", rank=2, alpha=8), mg.lora(g, "fc", rank=4, alpha=8)
    p4, _ = mg.compile(four).init(jax.random.key(1), reuse=(params, state))
    with pytest.raises(mg.ShapeError, match=r"adapter weight fc.lora_A/kernel has the shape \(8, 4\), "
                                            r"and graph 'graph' takes \(8, 2\)"):
        mg.merge_lora(two, p4)


def test_a_pattern_over_a_quantized_graph_adapts_its_layers_not_their_quantize_nodes(gpt2):
    qg = mg.quantize(gpt2[0], "int8")
    adapted = mg.lora(qg, "h.*/mlp.c_*", rank=2)
    names = [n.name for n in adapted.node("h.0").op.subgraph().nodes]
    assert "mlp.c_fc.lora_A" in names and "mlp.c_proj.lora_A" in names
    assert not any(".quantize.lora" in n or ".dequantize.lora" in n for n in names)


def test_a_pattern_matching_only_the_fused_projection_says_to_name_it(gpt2):
    with pytest.raises(mg.GraphError, match=r"'qk\*' matches no projection .* but the fused qkv, "
                                            r"which a pattern does not select.*name it, h\.\*/attn/qkv"):
        mg.lora(gpt2[0], "h.*/attn/qk*", rank=2)
