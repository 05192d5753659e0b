"""A decoder's prefill and step exported with ``jax.export`` for any batch (and prompt
length): serialized, read back, and run at several sizes, equal to the decoder's
jitted functions and to the model's full forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

import mlaxgraph as mg
from mlaxgraph.decode import cache_arrays, cache_from_arrays, export_prefill, export_step

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 96, "n_positions": 64}
LLAMA = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500.0}
MAX_LENGTH = 32


def _shipped(exported):
    """What a user ships and reads back: the serialized artifact."""
    return jax_export.deserialize(exported.serialize())


@pytest.mark.parametrize("name", ["gpt2", "llama_scanned"])
def test_exported_prefill_and_step_equal_the_jitted_ones_for_any_batch_and_length(name):
    if name == "gpt2":
        graph, vocab = mg.models.gpt2(GPT2), 96
        model = mg.compile(graph)
    else:  # grouped-query heads, rotary positions, the blocks on lax.scan
        graph, vocab = mg.models.llama(LLAMA), 80
        model = mg.compile(graph, scan_blocks=True)
    params, state = model.init(jax.random.key(0))
    dec = mg.decoder(model, max_length=MAX_LENGTH)
    prefill, step = _shipped(export_prefill(dec)), _shipped(export_step(dec))
    assert str(prefill.in_avals[-1]) == "bool[batch,seq]"
    assert str(step.in_avals[-1]) == "int32[batch,1]"
    for batch, seq in ((1, 5), (3, 9)) if name == "gpt2" else ((3, 9),):
        ids = jax.random.randint(jax.random.key(batch), (batch, seq + 2), 0, vocab, jnp.int32)
        mask = jnp.ones((batch, seq), bool)
        logits, cache = prefill.call(params, state, ids[:, :seq], mask)
        want, want_cache = jax.jit(dec.prefill_fn(batch))(params, state, dec.empty_cache(batch),
                                                           ids[:, :seq], mask)
        np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
        outs = [logits]
        for i in range(seq, seq + 2):
            logits, cache = step.call(params, state, cache, ids[:, i:i + 1])
            want, want_cache = jax.jit(dec.step_fn(batch))(params, state, want_cache, ids[:, i:i + 1])
            np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
            outs.append(logits)
        for got, expected in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_arrays(want_cache))):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        assert int(cache["index"]) == seq + 2
        # and the model's own forward pass over the whole sequence, at every position
        full, _ = model.apply(params, state, ids, inference_mode=True)
        np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=2e-5, atol=2e-5)


def test_an_exported_step_takes_several_tokens_and_its_cache_goes_back_to_the_decoder():
    graph = mg.models.gpt2(GPT2)
    params, state = mg.compile(graph).init(jax.random.key(1))
    dec = mg.decoder(graph, max_length=MAX_LENGTH)
    step = _shipped(export_step(dec, batch=2, seq="n"))
    assert str(step.in_avals[-1]) == "int32[2,n]"
    ids = jax.random.randint(jax.random.key(2), (2, 9), 0, 96, jnp.int32)
    logits, cache = dec.prefill(params, state, ids[:, :4], room=MAX_LENGTH - 4)
    filled = cache.filled
    logits, arrays = step.call(params, state, cache_arrays(cache), ids[:, 4:7])  # 3 tokens
    assert logits.shape == (2, 3, 96)
    # the decoder continues from the exported step's cache
    last, _ = dec.step(params, state, cache_from_arrays(arrays, filled + 3), ids[:, 7:9])
    full, _ = mg.compile(graph).apply(params, state, ids, inference_mode=True)
    np.testing.assert_allclose(logits, full[:, 4:7], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(last, full[:, 7:9], rtol=2e-5, atol=2e-5)


def test_export_refuses_a_prompt_past_the_cache_and_a_decoder_on_a_mesh():
    graph = mg.models.gpt2(GPT2)
    dec = mg.decoder(graph, max_length=MAX_LENGTH)
    with pytest.raises(mg.ShapeError, match="max_length=32"):
        export_prefill(dec, seq=MAX_LENGTH + 1)
    with pytest.raises(mg.ShapeError, match="batch must be a positive int"):
        export_step(dec, batch=0)
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(mg.GraphError, match="without a mesh"):
        export_step(mg.decoder(graph, max_length=MAX_LENGTH, mesh=mesh, rules={"batch": "data"}))
