"""Decoding a quantized model (mg.quantize, then mg.decoder or mg.generate): each
attention becomes a quantized_cached_attention over the stored weights, and the logits
of prefill and steps follow the quantized model's full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from test_decode import _greedy_reference, _prefill_and_steps

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 96, "n_positions": 128}
LLAMA = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500.0}
SCHEMES = [("int8", {}), ("int8_weight_only", {}), ("int4_weight_only", {"group_size": 16}),
           ("float8", {})]


def _quantized(make, scheme, kw, key=0):
    g = make()
    params, state = mg.compile(g).init(jax.random.key(key))
    params = jax.tree.map(lambda w: w * 3.0, params)  # larger than init's: no near-ties
    qg = mg.quantize(g, scheme, **kw)
    qparams, qstate = mg.quantize_weights(qg, params, state)
    return qg, qparams, qstate


@pytest.mark.parametrize("name, scan, scheme, kw",
                         [("gpt2", False, s, kw) for s, kw in SCHEMES]
                         + [("llama", "always", s, kw) for s, kw in (SCHEMES[0], SCHEMES[2])],
                         ids=[f"gpt2-{s}" for s, _ in SCHEMES] + ["llama-scanned-int8",
                                                                  "llama-scanned-int4"])
def test_prefill_and_steps_equal_the_quantized_full_forward(name, scan, scheme, kw):
    make, vocab = ((lambda: mg.models.gpt2(GPT2)), 96) if name == "gpt2" else \
        ((lambda: mg.models.llama(LLAMA)), 80)
    qg, qparams, qstate = _quantized(make, scheme, kw)
    model = mg.compile(qg, scan_blocks=scan)
    if scan:
        qparams, qstate = model.stack_weights(qparams, qstate)
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, vocab)
    full, _ = model.apply(qparams, qstate, ids, inference_mode=True)
    dec = mg.decoder(model, max_length=32)
    graph = dec.model(2).graph
    inner = [n.op for _, n in graph.walk() if n.op.op_name.endswith("cached_attention")]
    assert inner and all(op.op_name == "quantized_cached_attention" and op.scheme == scheme
                         for op in inner)
    got = _prefill_and_steps(dec, qparams, qstate, ids, 5)
    # the same per-token quantization of the same activations: equal but for the order
    # of float sums (an int8 rounding at a boundary may move one step)
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), rtol=1e-4, atol=1e-4)


def test_generate_of_a_quantized_model_is_the_greedy_argmax_of_its_full_forward():
    qg, qparams, qstate = _quantized(lambda: mg.models.gpt2(GPT2), "int8", {}, key=3)
    model = mg.compile(qg)
    prompt = np.asarray(jax.random.randint(jax.random.key(4), (2, 6), 0, 96))
    got = np.asarray(mg.generate(model, qparams, qstate, prompt, max_new_tokens=4))
    ids = _greedy_reference(model, qparams, qstate, prompt, 4)
    np.testing.assert_array_equal(got, ids)


def test_the_decoder_reads_the_stored_weights_at_their_paths():
    qg, qparams, qstate = _quantized(lambda: mg.models.gpt2(GPT2), "int4_weight_only",
                                     {"group_size": 16})
    dec = mg.decoder(qg, max_length=16)
    params, state = dec.model(1).init(jax.random.key(9))
    assert jax.tree.structure(params) == jax.tree.structure(qparams)
    jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail(
        f"{a.shape} {a.dtype} != {b.shape} {b.dtype}"), params, qparams)
    assert qparams["h.0"]["attn"]["query"]["kernel"].dtype == np.uint8  # packed int4
    assert set(state["h.0"]["attn"]) == {"key", "value"}


@pytest.mark.parametrize("scheme, kw", SCHEMES, ids=[s for s, _ in SCHEMES])
def test_quantized_cached_attention_flops_rule_matches_xla(scheme, kw):
    qg, _, _ = _quantized(lambda: mg.models.llama(LLAMA), scheme, kw)
    dec = mg.decoder(qg, max_length=16)
    for batch, seq in ((3, 1), (1, 1), (3, 5)):
        table = dec.model(batch).cost_table(batch=batch, seq=seq, inference_mode=True)
        rows = [row for row in table if row.op == "quantized_cached_attention"]
        assert rows
        for row in rows:  # as the float cached attention's rule (tests/test_decode.py)
            assert row.xla_flops - row.flops == (0 if seq == 1 else seq), row
