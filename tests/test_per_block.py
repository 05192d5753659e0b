"""Frozen layers of a scanned run kept per block (``mlaxgraph.compiler.indexed``): the
Trainer's layout, steps equal to the stacked layout's and to the unscanned model's,
no per-block slice of the frozen kernels in the compiled step, the stacked and
unstacked conversions of a mixed tree, and bad input."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler import indexed

# n_embd 256: the MLP's kernels take 1 MiB a block, indexed.MIN_PER_BLOCK_BYTES
CONFIG = {"n_layer": 3, "n_embd": 256, "n_head": 4, "vocab_size": 64, "n_positions": 16}
BLOCKS = ("h.0", "h.1", "h.2")
RUN = "h.0..h.2"


@pytest.fixture(scope="module")
def adapted():
    g = mg.lora(mg.models.gpt2(CONFIG), "h.*/attn/qkv", rank=4, alpha=8)
    model = mg.compile(g, scan_blocks="always")
    trainer = mg.train.Trainer(model, optax.adam(1e-2), loss="softmax_cross_entropy",
                               trainable="**/*.lora_*")
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
    return g, model, trainer, ids


def _b_nonzero(ts):
    """The adapters' B drawn normal, so the adapted model differs from its base."""
    run = dict(ts.params[RUN])
    b = run["attn.qkv.lora_B"]["kernel"]
    run["attn.qkv.lora_B"] = {"kernel": 0.05 * jax.random.normal(jax.random.key(7), b.shape)}
    return ts.replace(params={**ts.params, RUN: run})


def _stacked_twin(trainer, model, ts):
    """A fresh train state holding ``ts``'s weights all stacked (the model's own layout)."""
    stacked = model.stack_weights(model.unstack_weights(ts.params)[0])[0]
    return trainer.init(jax.random.key(0), reuse=(stacked, ts.state)).replace(params=stacked)


def _steps_agree(trainer, ts, twin, ids, steps):
    """``steps`` train steps of both train states: equal losses, then equal adapters."""
    for _ in range(steps):
        ts, m1 = trainer.train_step(ts, ids, ids)
        twin, m2 = trainer.train_step(twin, ids, ids)
        np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(mg.lora_params(ts.params)),
                    jax.tree.leaves(mg.lora_params(twin.params))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    return ts


def test_the_trainer_keeps_a_scanned_runs_frozen_linear_layers_per_block(adapted):
    _, model, trainer, _ = adapted
    ts = trainer.init(jax.random.key(0))
    run = ts.params[RUN]
    assert sorted(run) == ["attn", "attn.qkv.lora_A", "attn.qkv.lora_B", "ln_1", "ln_2"]
    for name in BLOCKS:  # the MLP's Linear layers, under each block's own name
        assert sorted(ts.params[name]) == ["mlp.c_fc", "mlp.c_proj"]
        assert ts.params[name]["mlp.c_fc"]["kernel"].shape == (256, 1024)
    # the same weights init draws, stacked (to the last bit or two: the residual
    # projection's scaling is fused into another program, which may round it apart)
    init_key, _ = jax.random.split(jax.random.key(0))
    stacked, _ = model.init(init_key)
    for k, name in enumerate(BLOCKS):
        np.testing.assert_allclose(ts.params[name]["mlp.c_proj"]["kernel"],
                                   stacked[RUN]["mlp.c_proj"]["kernel"][k], rtol=1e-6, atol=0)
    # the optimizer's state is the adapters' alone
    assert sorted(leaf.shape for leaf in jax.tree.leaves(ts.opt_state[0].mu)) == [
        (3, 4, 768), (3, 256, 4)]


def test_steps_equal_the_stacked_layout_and_the_unscanned_model(adapted):
    g, model, trainer, ids = adapted
    ts = _b_nonzero(trainer.init(jax.random.key(0)))
    twin = _stacked_twin(trainer, model, ts)
    frozen = ts.params["h.1"]["mlp.c_fc"]["kernel"]
    # inference: the unscanned model (no scan, no switch) on the same weights
    flat = mg.compile(g)
    weights, state = model.unstack_weights(ts.params, ts.state)
    want, _ = flat.apply(weights, state, ids, inference_mode=True)
    got, _ = model.apply(ts.params, ts.state, ids, inference_mode=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ts = _steps_agree(trainer, ts, twin, ids, 3)
    assert ts.params["h.1"]["mlp.c_fc"]["kernel"] is frozen  # neither donated nor copied


def test_the_compiled_step_slices_no_frozen_kernel(adapted):
    _, model, trainer, ids = adapted
    ts = trainer.init(jax.random.key(0))
    per_block = trainer.train_step.lower(ts, ids, ids).compile()
    stacked = trainer.train_step.lower(_stacked_twin(trainer, model, ts), ids, ids).compile()

    def kernel_slices(compiled):  # a buffer of a kernel's shape written by a dynamic slice
        shape = re.compile(r"%(\S*dynamic-slice\S*) = f32\[(256,1024|1024,256)\]\{[0-9,]+\} fusion\(")
        return [line for line in compiled.as_text().splitlines() if shape.search(line)]

    assert kernel_slices(stacked), "the stacked layout slices the MLP's kernels"
    assert not kernel_slices(per_block)
    mem = per_block.memory_analysis().temp_size_in_bytes
    assert mem < stacked.memory_analysis().temp_size_in_bytes - 256 * 1024 * 4  # a kernel, at least


def test_differentiating_weights_given_per_block_names_the_layer(adapted):
    _, model, trainer, ids = adapted
    ts = trainer.init(jax.random.key(0))

    def loss(params):
        return jnp.sum(model.apply_fn(params, ts.state, ids, inference_mode=True)[0])

    with pytest.raises(mg.GraphError, match=r"layer 'h.0..h.2/mlp.c_fc': its weights are given "
                                            r"one block at a time.*model.stack_weights"):
        jax.grad(loss)(ts.params)
    # stacked, the same weights differentiate
    grads = jax.grad(loss)(model.stack_weights(model.unstack_weights(ts.params)[0])[0])
    assert grads[RUN]["mlp.c_fc"]["kernel"].shape == (3, 256, 1024)


def test_stack_unstack_and_merge_read_the_mixed_layout(adapted):
    g, model, trainer, ids = adapted
    ts = _b_nonzero(trainer.init(jax.random.key(0)))
    weights, _ = model.unstack_weights(ts.params)
    assert RUN not in weights
    assert sorted(weights["h.2"]) == ["attn", "attn.qkv.lora_A", "attn.qkv.lora_B", "ln_1", "ln_2",
                                      "mlp.c_fc", "mlp.c_proj"]
    again, _ = model.stack_weights(weights)
    assert sorted(again) == sorted(k for k in ts.params if k not in BLOCKS)
    assert again[RUN]["mlp.c_fc"]["kernel"].shape == (3, 256, 1024)
    merged_graph, merged = mg.merge_lora(g, weights)
    base, _ = mg.compile(merged_graph).apply(merged, ts.state, ids, inference_mode=True)
    adapted_out, _ = model.apply(ts.params, ts.state, ids, inference_mode=True)
    np.testing.assert_allclose(base, adapted_out, rtol=1e-4, atol=1e-5)


def test_qlora_keeps_its_quantized_frozen_layers_per_block(monkeypatch):
    monkeypatch.setattr(indexed, "MIN_PER_BLOCK_BYTES", 256 * 1024)  # 256 x 1024 int8
    g = mg.quantize(mg.models.gpt2(CONFIG), "int8_weight_only")
    model = mg.compile(mg.lora(g, "h.*/attn/qkv", rank=2), scan_blocks="always")
    # SGD: an Adam step's size is |g| / (|g| + eps) of the rate, which turns the rounding
    # of a gradient near eps (the two layouts sum in other orders) into a visible change
    trainer = mg.train.Trainer(model, optax.sgd(0.1), loss="softmax_cross_entropy",
                               trainable="**/*.lora_*")
    float_params, float_state = mg.compile(mg.models.gpt2(CONFIG)).init(jax.random.key(2))
    qparams, qstate = mg.quantize_weights(g, float_params, float_state)
    ts = _b_nonzero(trainer.init(jax.random.key(0), reuse=(qparams, qstate)))
    assert ts.params["h.1"]["mlp.c_fc"]["kernel"].dtype == jnp.int8
    twin = _stacked_twin(trainer, model, ts)
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
    _steps_agree(trainer, ts, twin, ids, 1)


def test_small_layers_stay_stacked_and_the_threshold_is_read(adapted, monkeypatch):
    _, model, _, _ = adapted

    def layout(**options):
        trainer = mg.train.Trainer(model, optax.adam(1e-2), loss="softmax_cross_entropy", **options)
        params = jax.eval_shape(trainer.init_fn, jax.random.key(0)).params  # no compile
        return {name: sorted(params[name]) for name in BLOCKS if name in params}

    monkeypatch.setattr(indexed, "MIN_PER_BLOCK_BYTES", 2 << 20)
    assert layout(trainable="**/*.lora_*") == {}
    monkeypatch.setattr(indexed, "MIN_PER_BLOCK_BYTES", 1)  # the LayerNorms are no Linear
    assert layout(trainable="**/*.lora_*") == {name: ["mlp.c_fc", "mlp.c_proj"] for name in BLOCKS}
    # a layer with a weight that trains stays stacked; every weight training: nothing per block
    assert layout(trainable=lambda path: ".lora_" in path or path.endswith("c_proj/bias")) == {
        name: ["mlp.c_fc"] for name in BLOCKS}
    assert layout() == {}


def test_other_backends_keep_the_stacked_layout(adapted, monkeypatch):
    """On GPU the switch over the blocks is slower and saves nothing
    (indexed.PER_BLOCK_BACKENDS): the Trainer keeps the model's stacked layout."""
    _, model, _, _ = adapted
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    trainer = mg.train.Trainer(model, optax.adam(1e-2), trainable="**/*.lora_*")
    params = jax.eval_shape(trainer.init_fn, jax.random.key(0)).params
    assert sorted(params) == [RUN, "ln_f", "wpe", "wte"]
    assert params[RUN]["mlp.c_fc"]["kernel"].shape == (3, 256, 1024)


def test_bad_per_block_weights_are_named(adapted):
    _, model, trainer, ids = adapted
    ts = trainer.init(jax.random.key(0))
    missing = {k: v for k, v in ts.params.items() if k != "h.2"}
    with pytest.raises(mg.GraphError, match="mlp.c_fc"):
        model.apply(missing, ts.state, ids, inference_mode=True)
    wrong = {**ts.params, "h.1": {**ts.params["h.1"], "mlp.c_fc": {
        "kernel": jnp.zeros((256, 512)), "bias": ts.params["h.1"]["mlp.c_fc"]["bias"]}}}
    with pytest.raises(mg.ShapeError, match=r"h.0..h.2/mlp.c_fc.*kernel has another shape"):
        model.apply(wrong, ts.state, ids, inference_mode=True)
    # a layer with state (BatchNorm) given per block
    x = mg.Input(("batch", 8), name="x")
    block = mg.Graph(x, ops.BatchNorm(name="bn")(ops.Linear(8, name="fc")(x)), name="block")
    h = x
    for i in range(2):
        h = block.as_block(f"b{i}")(h)
    bn_model = mg.compile(mg.Graph(x, h, name="stack"), scan_blocks="always")
    params, state = bn_model.init(jax.random.key(0))
    per_block, per_block_state = bn_model.unstack_weights(params, state)
    params = {"b0..b1": {"fc": params["b0..b1"]["fc"]},
              **{f"b{i}": {"bn": per_block[f"b{i}"]["bn"]} for i in range(2)}}
    with pytest.raises(mg.GraphError, match="without state"):
        bn_model.apply(params, state, jnp.ones((4, 8)), inference_mode=True)


def test_trainer_init_with_reuse_keeps_the_base_models_own_arrays_per_block(adapted):
    """Weights given one block at a time (the graph's layout, as load_state_dict gives
    them) are the train state's per-block frozen weights themselves, not slices of a stack
    made of them: no second copy of the base model."""
    _, model, trainer, ids = adapted
    params, state = mg.compile(mg.models.gpt2(CONFIG)).init(jax.random.key(2))
    ts = trainer.init(jax.random.key(0), reuse=(params, state))
    for name in BLOCKS:
        assert ts.params[name]["mlp.c_fc"]["kernel"] is params[name]["mlp.c_fc"]["kernel"]
    np.testing.assert_array_equal(ts.params[RUN]["ln_1"]["scale"],
                                  np.stack([params[b]["ln_1"]["scale"] for b in BLOCKS]))
    _steps_agree(trainer, _b_nonzero(ts), _stacked_twin(trainer, model, _b_nonzero(ts)), ids, 1)
