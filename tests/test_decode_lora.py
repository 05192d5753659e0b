"""Decoding with mg.lora's adapters unmerged (as PEFT generates with an adapter
attached): each adapted attention becomes a cached attention that adds its adapters'
outputs to the projections before caching the keys and values, and reads out the heads'
values for an adapter of the output projection. Prefill and steps follow the adapted
model's full forward; the merged model decodes the same."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import GPT2, LLAMA, _greedy_reference, _prefill_and_steps

import mlaxgraph as mg
from mlaxgraph import ops

TARGETS = {"qkv": "h.*/attn/qkv", "each_and_out": ["h.*/attn/query", "h.*/attn/value",
                                                    "h.*/attn/out", "h.*/mlp.c_fc"]}


def _adapted(make, targets, key=0):
    """The adapted graph and weights, the adapters' B random (B = 0 would make them add
    nothing) and the base's weights a little larger than init's (no near-ties)."""
    g = make()
    params, state = mg.compile(g).init(jax.random.key(key))
    params = jax.tree.map(lambda w: w * 3.0, params)
    adapted = mg.lora(g, targets, rank=2, alpha=4)
    aparams, _ = mg.compile(adapted).init(jax.random.key(key + 1), reuse=(params, state))
    keys = iter(jax.random.split(jax.random.key(key + 2), 64))
    aparams = jax.tree_util.tree_map_with_path(
        lambda path, w: jax.random.normal(next(keys), w.shape, w.dtype) * 0.5
        if "lora_B" in jax.tree_util.keystr(path) else w, aparams)
    return adapted, aparams, state


@pytest.mark.parametrize("name, targets, scan", [
    ("gpt2", "qkv", False), ("gpt2", "each_and_out", False), ("llama", "each_and_out", "always")])
def test_prefill_and_steps_equal_the_adapted_full_forward(name, targets, scan):
    if name == "gpt2":
        make, vocab, pattern = (lambda: mg.models.gpt2(GPT2)), 96, TARGETS[targets]
    else:  # grouped-query heads and RoPE
        make, vocab = (lambda: mg.models.llama(LLAMA)), 80
        pattern = ["model.layers.*/self_attn/query", "model.layers.*/self_attn/value",
                   "model.layers.*/self_attn/out"]
    adapted, params, state = _adapted(make, pattern)
    model = mg.compile(adapted, scan_blocks=scan)
    if scan:
        params, state = model.stack_weights(params, state)
    ids = jax.random.randint(jax.random.key(5), (2, 9), 0, vocab)
    full, _ = model.apply(params, state, ids, inference_mode=True)
    dec = mg.decoder(model, max_length=32)
    cached = [n.op for _, n in dec.model(2).graph.walk() if n.op.op_name == "cached_attention"]
    assert cached and all(op.adapters for op in cached)
    got = _prefill_and_steps(dec, params, state, ids, 4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), rtol=1e-4, atol=1e-4)
    # the adapters change the logits: with B = 0 the model is the base model
    zeroed = jax.tree_util.tree_map_with_path(
        lambda path, w: jnp.zeros_like(w) if "lora_B" in jax.tree_util.keystr(path) else w, params)
    base, _ = model.apply(zeroed, state, ids, inference_mode=True)
    assert not np.allclose(np.asarray(full), np.asarray(base), atol=1e-3)


def test_generate_with_the_adapter_equals_the_merged_model_and_the_greedy_argmax():
    adapted, params, state = _adapted(lambda: mg.models.gpt2(GPT2), TARGETS["each_and_out"], 3)
    model = mg.compile(adapted)
    prompt = np.asarray(jax.random.randint(jax.random.key(4), (2, 6), 0, 96))
    got = np.asarray(mg.generate(model, params, state, prompt, max_new_tokens=4))
    ids = _greedy_reference(model, params, state, prompt, 4)
    np.testing.assert_array_equal(got, ids)
    merged, merged_params = mg.merge_lora(adapted, params)
    np.testing.assert_array_equal(
        np.asarray(mg.generate(mg.compile(merged), merged_params, state, prompt, max_new_tokens=4)),
        got)


def test_a_quantized_model_with_adapters_decodes():
    """QLoRA: adapters on mg.quantize's graph, which merge_lora cannot fold into int8
    weights; the decoder runs them unmerged."""
    g = mg.models.gpt2(GPT2)
    params, state = mg.compile(g).init(jax.random.key(0))
    params = jax.tree.map(lambda w: w * 3.0, params)
    qg = mg.quantize(g, "int8")
    qparams, qstate = mg.quantize_weights(qg, params, state)
    adapted = mg.lora(qg, "h.*/attn/qkv", rank=2)
    aparams, _ = mg.compile(adapted).init(jax.random.key(1), reuse=(qparams, qstate))
    aparams = jax.tree_util.tree_map_with_path(
        lambda path, w: jnp.full(w.shape, 0.3, w.dtype) if "lora_B" in jax.tree_util.keystr(path)
        else w, aparams)
    model = mg.compile(adapted)
    ids = jax.random.randint(jax.random.key(5), (2, 8), 0, 96)
    full, _ = model.apply(aparams, qstate, ids, inference_mode=True)
    dec = mg.decoder(model, max_length=16)
    assert {n.op.op_name for _, n in dec.model(2).graph.walk()} >= {"quantized_cached_attention"}
    got = _prefill_and_steps(dec, aparams, qstate, ids, 3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), rtol=1e-4, atol=1e-4)


def test_adapter_inputs_are_checked():
    x = mg.Input((2, "seq", 32))
    pos, index, mask = mg.Input((2, "seq"), "int32"), mg.Input((), "int32"), mg.Input((2, 16), "bool")
    op = ops.CachedAttention(4, 8, 32, max_length=16, batch=2, adapters=("qkv", "out"))
    out, context = op(x, pos, index, mask, mg.Input((2, "seq", 96)))
    assert context.shape == (2, out.shape[1], 32)
    with pytest.raises(mg.ShapeError, match="adapter input of the qkv projection"):
        op(x, pos, index, mask, mg.Input((2, "seq", 64)))
    with pytest.raises(mg.ShapeError, match="and the adapter outputs of qkv"):
        op(x, pos, index, mask)
    with pytest.raises(mg.ConfigError, match=r"cached_attention.*adapters must be .* in that order"):
        ops.CachedAttention(4, 8, 32, max_length=16, batch=2, adapters=("out", "qkv"))


def test_the_flops_rule_counts_the_adapters_adds_as_xla():
    adapted, _, _ = _adapted(lambda: mg.models.gpt2(GPT2), TARGETS["each_and_out"])
    dec = mg.decoder(adapted, max_length=16)
    for batch, seq in ((2, 1), (1, 1), (2, 5)):
        rows = [r for r in dec.model(batch).cost_table(batch=batch, seq=seq, inference_mode=True)
                if r.op == "cached_attention"]
        assert rows
        for row in rows:  # exact for a step; a prefill: XLA's add of the index per token
            assert row.xla_flops - row.flops == (0 if seq == 1 else seq), row
