"""Decoding derived from the graph: prefill + step against the full forward, greedy
generation against a NumPy KV-cache decoder written here, left padding, samplers,
recompiles and bad input."""

import importlib
import inspect
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 96, "n_positions": 256}
LLAMA = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500.0}


def _line(offset=0):
    return inspect.currentframe().f_back.f_lineno + offset


def _user_model():
    """A causal language model composed from ops (not the zoo): learned positions,
    attention masked by ops.causal_mask, a rotary one with causal=True, a SwiGLU."""
    ids = mg.Input(("batch", "seq"), "int32", name="tokens")
    h = ops.Embedding(50, 16, name="tok")(ids) + ops.Embedding(64, 16, name="pos")(ops.arange(ids.shape[1]))
    a = ops.MultiHeadAttention(2, 8, name="attn")(h, mask=ops.causal_mask(h))
    h = ops.RMSNorm(name="norm")(h + a)
    r = ops.MultiHeadAttention(4, 4, num_kv_heads=1, rope=True, causal=True, use_bias=False,
                               name="rope_attn")(h)
    h = ops.LayerNorm(name="ln")(h + r)
    m = ops.Linear(32, name="up")(h)
    m = ops.Linear(16, name="down")(ops.silu(m) * ops.Linear(32, name="gate")(h))
    return mg.Graph(ids, ops.Linear(50, name="head")(h + m), name="user_lm")


def _greedy_reference(model, params, state, prompt, new_tokens):
    """Greedy decoding without a cache: the whole sequence again for each token."""
    ids = np.asarray(prompt)
    for _ in range(new_tokens):
        logits, _ = model.apply(params, state, jnp.asarray(ids), inference_mode=True)
        ids = np.concatenate([ids, np.argmax(np.asarray(logits[:, -1]), -1)[:, None]], axis=1)
    return ids


def _prefill_and_steps(dec, params, state, ids, split):
    logits, cache = dec.prefill(params, state, ids[:, :split])
    outs = [logits]
    for i in range(split, ids.shape[1]):
        logits, cache = dec.step(params, state, cache, ids[:, i])
        outs.append(logits)
    return jnp.concatenate(outs, axis=1)


CASES = {
    "gpt2": (lambda: mg.models.gpt2(GPT2), 96),
    "llama_gqa_rope": (lambda: mg.models.llama(LLAMA), 80),
    "user_composed": (_user_model, 50),
    # Llama 3's scaled rotary frequencies and Mistral's sliding window (4 of the 9 tokens)
    "llama3_scaling_window": (lambda: mg.models.llama(dict(
        LLAMA, sliding_window=4, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8})), 80),
    # Qwen2: biases on the query, key and value projections, none on the output's
    "qwen2": (lambda: mg.models.qwen2(dict(LLAMA, tie_word_embeddings=True)), 80),
    # YaRN: the frequencies ramped, cos and sin scaled by the attention factor
    "qwen2_yarn": (lambda: mg.models.qwen2(dict(LLAMA, rope_theta=100.0, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})), 80),
}


@pytest.fixture(scope="module")
def gpt2():
    """GPT-2 with weights a little larger than init's, so that greedy choices are not
    near-ties; one compiled model shared by the generation tests (and its decoders)."""
    model = mg.compile(mg.models.gpt2(GPT2))
    params, state = model.init(jax.random.key(3))
    params = jax.tree.map(lambda w: w * 3.0, params)
    ids = np.asarray(jax.random.randint(jax.random.key(4), (2, 6), 0, 96))
    return model, params, state, ids


@pytest.mark.parametrize("name, scan", [("gpt2", False), ("llama_gqa_rope", False),
                                        ("llama_gqa_rope", "always"), ("user_composed", False),
                                        ("llama3_scaling_window", False), ("qwen2", "always"),
                                        ("qwen2_yarn", False)])
def test_prefill_and_steps_equal_the_full_forward_at_every_position(name, scan):
    make, vocab = CASES[name]
    g = make()
    model = mg.compile(g, scan_blocks=scan)
    params, state = model.init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, vocab)
    full, _ = model.apply(params, state, ids, inference_mode=True)
    dec = mg.decoder(model, max_length=80)
    got = _prefill_and_steps(dec, params, state, ids, 5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), rtol=1e-4, atol=1e-4)
    if scan and name != "user_composed":
        assert any(n.op.op_name == "scan" for n in dec.model(2).graph.nodes)


def test_bfloat16_policy_prefill_and_steps_follow_the_full_forward():
    g = mg.models.llama(LLAMA)
    model = mg.compile(g, policy=mg.Policy(compute_dtype="bfloat16", output_dtype="float32"))
    params, state = model.init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, 80)
    full, _ = model.apply(params, state, ids, inference_mode=True)
    dec = mg.decoder(model, max_length=80)
    assert jax.tree.leaves(dec.empty_cache(2).layers)[0].dtype == jnp.bfloat16
    got = _prefill_and_steps(dec, params, state, ids, 4)
    assert got.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(full)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), atol=0.03 * scale)


# --- an independent NumPy decoder of GPT-2, with its own key/value cache ----------------


def _layer_norm(x, p, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


class NumpyGPT2:
    """GPT-2 one token at a time in float64, caching each layer's keys and values in
    Python lists: the textbook decoder."""

    def __init__(self, params, n_layer):
        self.p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
        self.n_layer = n_layer

    def logits(self, token, position, cache):
        p = self.p
        x = p["wte"]["embedding"][token] + p["wpe"]["embedding"][position]
        for i in range(self.n_layer):
            b = p[f"h.{i}"]
            a = b["attn"]
            h = _layer_norm(x, b["ln_1"])
            q = np.einsum("d,dhk->hk", h, a["query"]["kernel"]) + a["query"]["bias"]
            k = np.einsum("d,dhk->hk", h, a["key"]["kernel"]) + a["key"]["bias"]
            v = np.einsum("d,dhk->hk", h, a["value"]["kernel"]) + a["value"]["bias"]
            cache[i][0].append(k)
            cache[i][1].append(v)
            keys, values = np.stack(cache[i][0]), np.stack(cache[i][1])  # (t, h, k)
            scores = np.einsum("hk,thk->ht", q, keys) / np.sqrt(q.shape[-1])
            w = np.exp(scores - scores.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            att = np.einsum("ht,thk->hk", w, values)
            x = x + np.einsum("hk,hko->o", att, a["out"]["kernel"]) + a["out"]["bias"]
            h = _layer_norm(x, b["ln_2"])
            m = _gelu_tanh(h @ b["mlp.c_fc"]["kernel"] + b["mlp.c_fc"]["bias"])
            x = x + m @ b["mlp.c_proj"]["kernel"] + b["mlp.c_proj"]["bias"]
        return _layer_norm(x, p["ln_f"]) @ p["wte"]["embedding"].T

    def generate(self, prompt, new):
        cache = [([], []) for _ in range(self.n_layer)]
        tokens, margins = list(prompt), []
        for position, token in enumerate(prompt[:-1]):
            self.logits(token, position, cache)
        for _ in range(new):
            logits = self.logits(tokens[-1], len(tokens) - 1, cache)
            top = np.sort(logits)[-2:]
            margins.append(top[1] - top[0])
            tokens.append(int(np.argmax(logits)))
        return tokens, min(margins)


def test_greedy_generation_is_token_exact_against_a_numpy_decoder(gpt2):
    model, params, state, prompts = gpt2
    out = np.asarray(mg.generate(model, params, state, prompts, max_new_tokens=12))
    reference = NumpyGPT2(params, GPT2["n_layer"])
    for row in range(2):
        tokens, margin = reference.generate(list(prompts[row]), 12)
        assert margin > 1e-3, "ill-posed: a near-tie between the two top logits"
        assert out[row].tolist() == tokens


@pytest.mark.parametrize("lengths", [(60, 21), (40, 1), (17, 16)],
                         ids=["first_piece_from_column_0", "three_pieces", "two_and_one"])
def test_a_prefill_in_pieces_is_token_exact_against_a_numpy_decoder(gpt2, lengths):
    # generate's prefill runs the pieces of PREFILL_CHUNK tokens holding a token; rows of
    # other lengths, left-padded in the 64-token bucket, each against the NumPy decoder
    model, params, state, _ = gpt2
    rows = [np.asarray(jax.random.randint(jax.random.key(n), (n,), 0, 96)) for n in lengths]
    width = max(lengths)
    ids = np.array([[0] * (width - len(r)) + r.tolist() for r in rows], np.int32)
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int32)
    out = np.asarray(mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=4))
    reference = NumpyGPT2(params, GPT2["n_layer"])
    for row, prompt in enumerate(rows):
        tokens, margin = reference.generate(prompt.tolist(), 4)
        assert margin > 1e-3, "ill-posed: a near-tie between the two top logits"
        assert out[row, width - len(prompt):].tolist() == tokens


def test_left_padded_rows_equal_each_row_generated_alone():
    g = mg.models.llama(LLAMA)
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    params = jax.tree.map(lambda w: w * 3.0, params)
    a = [5, 17, 3, 60, 22, 9, 41]
    b = [8, 30, 2]
    ids = np.array([a, [0] * 4 + b], np.int32)
    mask = np.array([[1] * 7, [0] * 4 + [1] * 3], np.int32)
    both = np.asarray(mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=8))
    alone_a = np.asarray(mg.generate(model, params, state, np.array([a]), max_new_tokens=8))
    alone_b = np.asarray(mg.generate(model, params, state, np.array([b]), max_new_tokens=8))
    assert both[0].tolist() == alone_a[0].tolist()
    assert both[1, 4:].tolist() == alone_b[0].tolist()
    assert both[1, :4].tolist() == [0] * 4  # the padding is given back as it came


def test_eos_stops_each_row_and_pads_after_it(gpt2):
    model, params, state, ids = gpt2
    free = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=10))
    eos = int(free[0, 8])  # row 0's third new token
    out = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=10, eos_token_id=eos,
                                 pad_token_id=95))
    for row in range(2):
        new = free[row, 6:].tolist()
        stop = new.index(eos) + 1 if eos in new else len(new)
        assert out[row, 6:6 + stop].tolist() == new[:stop]
        assert out[row, 6 + stop:].tolist() == [95] * (10 - stop)
    streamed = np.stack(list(mg.generate_stream(model, params, state, ids, max_new_tokens=10,
                                                eos_token_id=eos, pad_token_id=95)), 1)
    assert streamed.tolist() == out[:, 6:6 + streamed.shape[1]].tolist()


def test_sampling_is_reproducible_and_top_k_1_is_greedy(gpt2):
    model, params, state, ids = gpt2
    sampler = mg.sampling.Temperature(8.0) + mg.sampling.TopK(20) + mg.sampling.TopP(0.95)
    one = mg.generate(model, params, state, ids, max_new_tokens=10, sampler=sampler, key=jax.random.key(7))
    two = mg.generate(model, params, state, ids, max_new_tokens=10, sampler=sampler, key=jax.random.key(7))
    other = mg.generate(model, params, state, ids, max_new_tokens=10, sampler=sampler, key=jax.random.key(8))
    assert np.array_equal(one, two) and not np.array_equal(one, other)
    streamed = np.stack(list(mg.generate_stream(model, params, state, ids, max_new_tokens=10,
                                                sampler=sampler, key=jax.random.key(7))), 1)
    assert np.array_equal(streamed, np.asarray(one)[:, 6:])
    greedy = mg.generate(model, params, state, ids, max_new_tokens=10)
    top1 = mg.generate(model, params, state, ids, max_new_tokens=10, sampler=mg.sampling.TopK(1),
                       key=jax.random.key(7))
    assert np.array_equal(greedy, top1)


def test_prompts_as_python_lists_of_several_lengths_or_none_are_named(gpt2):
    model, params, state, _ = gpt2
    with pytest.raises(mg.ShapeError, match="rows of 2 to 3 tokens; pad them"):
        mg.generate(model, params, state, [[11, 42, 7], [5, 6]], max_new_tokens=2)
    with pytest.raises(mg.ShapeError, match="the prompt is empty"):
        mg.generate(model, params, state, [[]], max_new_tokens=2)
    out = mg.generate(model, params, state, [[11, 42, 7]], max_new_tokens=2)  # a list works
    assert np.asarray(out).shape == (1, 5)


def test_sampler_numbers_of_numpy_and_jax_are_taken_and_none_is_named():
    # a JAX scalar made the compiled loop's cache lookup fail (unhashable); None reached
    # float(); a NumPy int was refused by TopK
    t = mg.sampling.Temperature(jnp.linspace(0.5, 1.0, 3)[0])
    assert t == mg.sampling.Temperature(0.5) and hash(t) == hash(mg.sampling.Temperature(0.5))
    assert mg.sampling.TopP(jnp.float32(0.5)).p == 0.5 and mg.sampling.TopK(np.int64(4)).k == 4
    for make in (lambda: mg.sampling.Temperature(None), lambda: mg.sampling.TopP(None),
                 lambda: mg.sampling.Temperature(jnp.ones(2))):
        with pytest.raises(mg.ConfigError, match="must be a number"):
            make()


def test_samplers_against_numpy():
    logits = jnp.array([[2.0, 1.0, 0.5, -1.0, 3.0]])
    low = float(jnp.finfo(jnp.float32).min)
    np.testing.assert_array_equal(mg.sampling.TopK(2).process(logits),
                                  [[2.0, low, low, low, 3.0]])
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()  # sorted: 3.0, 2.0, 1.0, ...
    order = np.argsort(-probs)
    keep = np.cumsum(probs[order]) - probs[order] < 0.8
    want = np.full(5, low)
    want[order[keep]] = np.asarray(logits[0])[order[keep]]
    np.testing.assert_array_equal(mg.sampling.TopP(0.8).process(logits)[0], want)
    np.testing.assert_allclose(mg.sampling.Temperature(2.0).process(logits), logits / 2.0)
    draws = jax.vmap(lambda k: mg.sampling.TopK(2)(logits, k))(jax.random.split(jax.random.key(0), 2000))
    share = float(jnp.mean(draws == 4))
    assert set(np.unique(draws).tolist()) == {0, 4}
    assert abs(share - 1 / (1 + np.exp(-1.0))) < 0.04  # p(3.0) among {2.0, 3.0}


def test_prompts_of_one_bucket_do_not_recompile(gpt2):
    model, params, state, _ = gpt2
    dec = mg.decoder(model, max_length=128)
    mg.generate(dec, params, state, np.ones((2, 5), np.int32), max_new_tokens=16)
    before = dec.compile_count
    assert before == 1
    for length in range(6, 61, 6):
        mg.generate(dec, params, state, np.ones((2, length), np.int32), max_new_tokens=16 + length % 3)
    assert dec.compile_count == before


class _Compiles:
    """Counts XLA's compiles of any function (eager operations' too) while active."""

    def __init__(self):
        self.count = 0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event, duration, **_):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __enter__(self):
        self.count, self.active = 0, True
        return self

    def __exit__(self, *exc):
        self.active = False


def test_streaming_and_stop_lists_of_one_bucket_compile_nothing_more(gpt2):
    model, params, state, _ = gpt2
    dec = mg.decoder(model, max_length=128)
    penalty = [mg.sampling.RepetitionPenalty(1.3)]
    for sampler in ("greedy", penalty):
        list(mg.generate_stream(dec, params, state, np.ones((2, 5), np.int32), max_new_tokens=4,
                                sampler=sampler))
        mg.generate(dec, params, state, np.ones((2, 5), np.int32), max_new_tokens=4,
                    sampler=sampler, eos_token_id=3)
    compiles = _Compiles()
    with compiles:
        for length in (6, 9, 13):  # the 16-token bucket
            ids = np.arange(length * 2, dtype=np.int32).reshape(2, length) % 90
            for sampler in ("greedy", penalty):
                streamed = np.stack(list(mg.generate_stream(
                    dec, params, state, ids, max_new_tokens=4, sampler=sampler)), axis=1)
                whole = mg.generate(dec, params, state, ids, max_new_tokens=4, sampler=sampler)
                np.testing.assert_array_equal(streamed, np.asarray(whole)[:, length:])
        for stops in ([3, 4], [3, 4, 5], [3, 4, 5, 6]):  # one to four stop tokens: one loop
            mg.generate(dec, params, state, np.ones((2, 7), np.int32), max_new_tokens=4,
                        eos_token_id=stops)
    assert compiles.count == 0


def test_generate_sizes_its_cache_to_the_bucket_and_new_tokens(gpt2):
    model, params, state, _ = gpt2
    made = importlib.import_module("mlaxgraph.decode.generate")._made_for(model)
    made.clear()  # the decoders other tests made for this graph
    mg.generate(model, params, state, np.ones((1, 16), np.int32), max_new_tokens=64)
    assert sorted(made) == [128]  # the 64-token bucket and 64 new tokens
    counts = []
    for length in np.linspace(5, 60, 10).astype(int):
        out = mg.generate(model, params, state, np.ones((2, length), np.int32), max_new_tokens=128)
        assert out.shape == (2, length + 128)
        counts.append(made[256].compile_count)
    assert sorted(made) == [128, 256] and counts == [1] * 10  # one compile, then none


def test_the_cache_is_state_of_the_decoding_graph():
    g = mg.models.llama(LLAMA)
    dec = mg.decoder(g, max_length=64)
    model = dec.model(batch=3)
    attn = model.graph.node("model.layers.0").op.graph.node("self_attn")
    assert attn.op.op_name == "cached_attention"
    _, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    cache = state["model.layers.0"]["self_attn"]
    head_dim = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    assert cache["key"].shape == (3, 64, LLAMA["num_key_value_heads"], head_dim)
    physical = 2 * LLAMA["num_hidden_layers"] * 3 * 64 * 2 * head_dim * 4
    assert dec.cache_bytes(3) == physical == dec.empty_cache(3).nbytes
    half = mg.decoder(g, max_length=64, cache_dtype="bfloat16")
    assert half.cache_bytes(3) == physical // 2 == half.empty_cache(3).nbytes
    table = model.cost_table(batch=3, seq=1, xla=False)
    assert table["model.layers.0/self_attn"].state == 2 * 3 * 64 * 2 * head_dim
    assert "cached_attention" in model.summary(expand_nested=True)
    assert mg.Graph.from_json(dec.decode_graph(3).to_json()) == dec.decode_graph(3)


@pytest.mark.parametrize("how", ["cache_dtype", "policy"])
def test_the_decoding_model_shows_the_cache_at_its_dtype(how):
    # the summary, cost table and init of dec.model agree with the cache prefill makes
    g = mg.models.gpt2(GPT2)
    dec = (mg.decoder(g, max_length=32, cache_dtype="bfloat16") if how == "cache_dtype" else
           mg.decoder(mg.compile(g, mg.Policy(compute_dtype="bfloat16")), max_length=32))
    params, state = mg.compile(g).init(jax.random.key(0))
    _, cache = dec.prefill(params, state, np.array([[1, 2, 3]]))
    leaves = jax.tree.leaves(cache.layers)
    assert {x.dtype for x in leaves} == {jnp.dtype("bfloat16")}
    real = sum(x.size * x.dtype.itemsize for x in leaves)
    model = dec.model(1)
    _, init_state = model.init(jax.random.key(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), init_state) == jax.tree.map(
        lambda x: (x.shape, x.dtype), cache.layers)
    line = next(s for s in model.graph.summary().splitlines() if s.startswith("non-trainable"))
    count = sum(x.size for x in leaves)
    assert line == f"non-trainable params: {count:,} ({real / 1024:.1f} KiB)"
    table = model.cost_table(batch=1, seq=1, xla=False)
    params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["h.0"]["attn"]))
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache.layers["h.0"]["attn"]))
    assert table["h.0/attn"].weight_bytes == params_bytes + cache_bytes
    assert dec.cache_bytes(1) == real


def test_a_decoding_graph_for_any_batch_is_summarized_drawn_and_costed():
    g = mg.models.gpt2(GPT2)
    dec = mg.decoder(g, max_length=32)
    graph = dec.decode_graph("batch")
    # per row: key and value of every layer, max_length x heads x head_dim each
    per_row = 2 * GPT2["n_layer"] * 32 * GPT2["n_embd"]
    summary = graph.summary()
    assert f"non-trainable params: {per_row}*batch ({4 * per_row}*batch B)" in summary
    assert f"{per_row // GPT2['n_layer']}*batch+" in summary  # a block's row
    assert f"{per_row // GPT2['n_layer']}*batch non-trainable" in graph.to_dot()
    assert "<!DOCTYPE html>" in graph.to_html()
    from mlaxgraph.render.html.payload import graph_payload

    params, _ = jax.eval_shape(mg.compile(g).init_fn, jax.random.key(0))
    weights = sum(x.size for x in jax.tree.leaves(params))
    payload = graph_payload(graph, dims={"batch": 3})
    assert payload["params_f"] == f"{per_row}*batch+{weights}"
    assert payload["params"] == 3 * per_row + weights and payload["unbound"] == ["seq"]
    at_two = dec.model(2).cost_table(batch=2, seq=1, xla=False)
    assert str(dec.model("batch").cost_table(batch=2, seq=1, xla=False)) == str(at_two)
    with pytest.raises(mg.ShapeError, match=r"state of a symbolic shape \(h\.0/attn/key: "
                                            r"\[batch,32,2,16\].*dec\.model\(2\)"):
        dec.model("batch").cost_table(batch=2, seq=1)


def test_weights_keep_their_paths(gpt2):
    model, params, _, _ = gpt2
    dec = mg.decoder(model, max_length=64)
    decoded, _ = jax.eval_shape(dec.model(1).init_fn, jax.random.key(0))
    assert jax.tree.structure(decoded) == jax.tree.structure(params)
    assert jax.tree.map(jnp.shape, decoded) == jax.tree.map(jnp.shape, params)


# --- bad input ---------------------------------------------------------------------------


def test_a_non_causal_attention_is_refused_by_name():
    ids = mg.Input(("batch", "seq"), "int32")
    h = ops.Embedding(10, 8)(ids)
    line = _line(1)
    h = ops.MultiHeadAttention(2, name="bidirectional")(h)
    g = mg.Graph(ids, ops.Linear(10)(h))
    with pytest.raises(mg.GraphError, match="non-causal") as e:
        mg.decoder(g, max_length=16)
    assert "'bidirectional'" in str(e.value) and f"test_decode.py:{line}" in str(e.value)


def test_a_layer_mixing_positions_is_refused_by_name():
    ids = mg.Input(("batch", "seq"), "int32")
    h = ops.Embedding(10, 8)(ids)
    h = ops.MultiHeadAttention(2, causal=True)(h)
    line = _line(1)
    h = ops.Conv(8, (3,), padding="SAME", name="conv_over_time")(h)
    g = mg.Graph(ids, ops.Linear(10)(h))
    with pytest.raises(mg.GraphError, match="depends on other positions") as e:
        mg.decoder(g, max_length=16)
    assert "'conv_over_time'" in str(e.value) and f"test_decode.py:{line}" in str(e.value)
    pooled = mg.Graph(ids, ops.Linear(10)(ops.mean(ops.Embedding(10, 8)(ids), axis=1)))
    with pytest.raises(mg.GraphError, match="'mean'"):
        mg.decoder(pooled, max_length=16)


def test_bad_prompts_and_lengths_are_clear_errors(gpt2):
    model, params, state, _ = gpt2
    dec = mg.decoder(model, max_length=32)
    with pytest.raises(mg.ShapeError, match="more than the decoder's max_length=32"):
        dec.prefill(params, state, np.ones((1, 40), np.int32))
    with pytest.raises(mg.ShapeError, match="goes past the decoder's max_length=32"):
        mg.generate(dec, params, state, np.ones((1, 20), np.int32), max_new_tokens=13)
    with pytest.raises(mg.ShapeError, match="token id 96 is out of the vocabulary"):
        mg.generate(dec, params, state, np.array([[1, 96]]), max_new_tokens=2)
    with pytest.raises(mg.ShapeError, match="token id -1 is out of the vocabulary"):
        dec.prefill(params, state, np.array([[-1, 3]]))
    with pytest.raises(mg.ConfigError, match="pass key="):
        mg.generate(dec, params, state, np.array([[1, 2]]), max_new_tokens=2,
                    sampler=mg.sampling.TopP(0.5))
    logits, cache = dec.prefill(params, state, np.ones((1, 31), np.int32))
    logits, cache = dec.step(params, state, cache, np.array([1]))
    with pytest.raises(mg.ShapeError, match="the cache is full"):
        dec.step(params, state, cache, np.array([1]))


def _reference_logits(reference, prompt):
    """The NumPy decoder's logits after each token of ``prompt``, the last one's."""
    cache = [([], []) for _ in range(reference.n_layer)]
    for position, token in enumerate(prompt):
        logits = reference.logits(token, position, cache)
    return logits


def test_right_padded_rows_are_token_exact_against_a_numpy_decoder(gpt2):
    # a tokenizer padding on the right (GPT-2's default): each row's tokens, then its
    # padding; the rows are aligned to the right before they run
    model, params, state, _ = gpt2
    rows = [[5, 17, 3, 60, 22], [8, 30]]
    ids = np.array([rows[0], rows[1] + [0] * 3], np.int32)
    mask = np.array([[1] * 5, [1, 1, 0, 0, 0]], np.int32)
    out = np.asarray(mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=5))
    assert out[:, :5].tolist() == ids.tolist()  # the prompt given back as it came
    reference = NumpyGPT2(params, GPT2["n_layer"])
    for row, prompt in enumerate(rows):
        tokens, margin = reference.generate(prompt, 5)
        assert margin > 1e-3, "ill-posed: a near-tie between the two top logits"
        assert out[row, 5:].tolist() == tokens[len(prompt):]
    streamed = np.stack(list(mg.generate_stream(model, params, state, ids, attention_mask=mask,
                                                max_new_tokens=5)), 1)
    assert streamed.tolist() == out[:, 5:].tolist()
    # prefill: logits[:, -1] is each row's next-token logits
    logits, _ = mg.decoder(model, max_length=64).prefill(params, state, ids, mask)
    for row, prompt in enumerate(rows):
        np.testing.assert_allclose(np.asarray(logits[row, -1]), _reference_logits(reference, prompt),
                                   rtol=1e-4, atol=1e-4)


def test_prompts_with_no_token_and_masks_of_other_values_are_refused(gpt2):
    model, params, state, _ = gpt2
    ids = np.array([[11, 42, 7, 3], [0, 0, 0, 0]])
    with pytest.raises(mg.ShapeError, match="row 1 of attention_mask marks no token: that prompt "
                                            "is empty"):
        mg.generate(model, params, state, ids, attention_mask=np.array([[1] * 4, [0] * 4]),
                    max_new_tokens=4)
    with pytest.raises(mg.ShapeError, match="input_ids has no rows"):
        mg.generate(model, params, state, np.zeros((0, 4), np.int32), max_new_tokens=4)
    with pytest.raises(mg.ConfigError, match=r"attention_mask must hold 1 \(a token\) and 0 "
                                             r"\(padding\), got 2"):
        mg.generate(model, params, state, ids[:1], attention_mask=np.full((1, 4), 2),
                    max_new_tokens=2)


def test_step_checks_its_ids_and_refuses_a_consumed_cache(gpt2):
    model, params, state, _ = gpt2
    dec = mg.decoder(model, max_length=128)
    prompt = np.array([[11, 42, 7, 3]])
    _, cache = dec.prefill(params, state, prompt)
    with pytest.raises(mg.ShapeError, match="token id 500 is out of the vocabulary"):
        dec.step(params, state, cache, np.array([500]))
    with pytest.raises(mg.ShapeError, match="token_ids must be integer token ids"):
        dec.step(params, state, cache, np.array([5.7]))
    logits, after = dec.step(params, state, cache, jnp.array([5]))  # refused calls kept it
    with pytest.raises(mg.GraphError, match="this cache was consumed by step .*use the one it "
                                            "returned"):
        dec.step(params, state, cache, np.array([5]))
    logits_next, _ = dec.step(params, state, after, np.array([6]))
    full, _ = model.apply(params, state, np.array([[11, 42, 7, 3, 5, 6]]), inference_mode=True)
    np.testing.assert_allclose(np.asarray(logits[0, 0]), np.asarray(full[0, 4]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(logits_next[0, 0]), np.asarray(full[0, 5]),
                               rtol=1e-4, atol=1e-4)


def test_max_length_counts_the_prompt_as_hugging_faces_does(gpt2):
    model, params, state, ids = gpt2  # 6 prompt tokens
    by_count = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=4))
    by_length = np.asarray(mg.generate(model, params, state, ids, max_length=10))
    assert by_length.shape == (2, 10) and by_length.tolist() == by_count.tolist()
    streamed = list(mg.generate_stream(model, params, state, ids, max_length=10))
    assert np.stack(streamed, 1).tolist() == by_count[:, 6:].tolist()


def test_a_list_of_stop_tokens_ends_a_row_at_any_of_them(gpt2):
    model, params, state, ids = gpt2
    free = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=10))
    stops = [int(free[0, 9]), int(free[1, 7])]  # row 0's fourth new token, row 1's second
    out = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=10, eos_token_id=stops))
    for row in range(2):
        new = free[row, 6:].tolist()
        stop = min(new.index(s) for s in stops if s in new) + 1
        assert out[row, 6:6 + stop].tolist() == new[:stop]
        assert out[row, 6 + stop:].tolist() == [stops[0]] * (10 - stop)  # pad: the first stop
    streamed = np.stack(list(mg.generate_stream(model, params, state, ids, max_new_tokens=10,
                                                eos_token_id=stops)), 1)
    assert streamed.tolist() == out[:, 6:6 + streamed.shape[1]].tolist()


@pytest.mark.parametrize("call, error, message", [
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 sampler=mg.sampling.TopK(5), key=0),
     mg.ConfigError, r"key must be one JAX random key, e\.g\. key=jax\.random\.key\(0\), got int 0"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, eos_token_id=1000),
     mg.ConfigError, r"eos_token_id 1000 is out of the vocabulary: ids must be in \[0, 96\)"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, eos_token_id=[2, "5"]),
     mg.ConfigError, "eos_token_id must be an int token id, got str '5'"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, eos_token_id=[]),
     mg.ConfigError, "eos_token_id is an empty list"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, pad_token_id=-3),
     mg.ConfigError, "pad_token_id -3 is out of the vocabulary"),
    (lambda m, p, s: mg.decoder(m, max_length=32, cache_dtype="bfloat61"),
     mg.ConfigError, "cache_dtype must be a float dtype .* got 'bfloat61'"),
    (lambda m, p, s: mg.decoder(m, max_length=32, cache_dtype="int8"),
     mg.ConfigError, "cache_dtype must be a float dtype .* got 'int8'"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, do_sample=True,
                                 top_p=0.9, temperature=0.7),
     mg.ConfigError, r"generate got do_sample=True, top_p=0\.9, temperature=0\.7, which it does "
                     r"not take: .*sampler=mg\.sampling\.Temperature\(0\.7\) \+ "
                     r"mg\.sampling\.TopP\(0\.9\) with key="),
    (lambda m, p, s: list(mg.generate_stream(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                             num_beams=4)),
     mg.ConfigError, "generate_stream got num_beams=4, which it does not take; it takes "
                     r"max_new_tokens \(or max_length\), attention_mask, sampler.*\(beam search "
                     r"is not built"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 repetition_penalty=1.2),
     mg.ConfigError, r"repetition_penalty=1\.2, which it does not take: .*here "
                     r"sampler=mg\.sampling\.RepetitionPenalty\(1\.2\) \(the samplers run"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, top_k=5,
                                 no_repeat_ngram_size=3, do_sample=True),
     mg.ConfigError, r"here sampler=mg\.sampling\.NoRepeatNGram\(3\) \+ mg\.sampling\.TopK\(5\) "
                     r"with key=jax\.random\.key"),
    # do_sample=False is greedy in Hugging Face, which then drops temperature, top_k, top_p
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, do_sample=False,
                                 top_k=1),
     mg.ConfigError, r"as Hugging Face reads them, this is greedy decoding \(Hugging Face ignores "
                     r"top_k without do_sample=True\), generate's default"),
    # without do_sample=True Hugging Face's warpers do nothing (greedy), and None is unset
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, temperature=0.7,
                                 top_k=None, bad_words_ids=None),
     mg.ConfigError, r"got temperature=0\.7 \(and 2 more set to None\).*this is greedy decoding"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, do_sample=True,
                                 top_k=0, top_p=1.0),  # Hugging Face's values for no top-k, top-p
     mg.ConfigError, r"here sampler=mg\.sampling\.Temperature\(1\.0\) with key"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, do_sample=False,
                                 temperature=0.7, repetition_penalty=1.2),
     mg.ConfigError, r"here sampler=mg\.sampling\.RepetitionPenalty\(1\.2\) \(the samplers run"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, length_penalty=2.0),
     mg.ConfigError, r"\(beam search is not built \(length_penalty scores beams\)"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 sampler=mg.sampling.BadWords([[3], []])),
     mg.ConfigError, r"BadWords takes a non-empty list of non-empty lists of token ids >= 0"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 sampler=mg.sampling.BadWords([[3], [5, 700]])),
     mg.ConfigError, r"BadWords: token ids \[700\] are out of the model's vocabulary of 96"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 sampler=mg.sampling.RepetitionPenalty(0)),
     mg.ConfigError, r"RepetitionPenalty: penalty must be a number > 0 \(1\.0: no penalty\), got 0"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2,
                                 sampler=mg.sampling.NoRepeatNGram(2.5)),
     mg.ConfigError, r"NoRepeatNGram: size must be an int >= 0 \(0: no effect, as Hugging Face's "
                     r"default\), got 2\.5"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=2, eos_token=1),
     mg.ConfigError, r"eos_token=1, which it does not take.*\(did you mean eos_token_id\?\)"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]])),
     mg.ConfigError, r"generate needs max_new_tokens \(the new tokens per row\) or max_length"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2]]), max_new_tokens=3, max_length=5),
     mg.ConfigError, r"got max_new_tokens=3 and max_length=5: give one \(max_length counts the "
                     r"prompt's 2 tokens too\)"),
    (lambda m, p, s: mg.generate(m, p, s, np.array([[1, 2, 3]]), max_length=3),
     mg.ConfigError, r"max_length counts the prompt's 3 tokens and the new ones, so it must be "
                     r"an int > 3, got 3"),
], ids=["int_key", "eos_out_of_vocabulary", "eos_not_int", "eos_empty_list", "pad_out_of_vocabulary",
        "cache_dtype_typo", "cache_dtype_int", "hugging_face_sampling", "beams",
        "repetition_penalty", "ngram_and_top_k", "greedy_top_k", "warpers_without_do_sample",
        "no_op_warpers", "greedy_penalty", "length_penalty", "bad_words_empty",
        "bad_words_beyond_vocabulary", "penalty_zero", "ngram_float", "misspelt", "no_length",
        "both_lengths", "max_length_within_the_prompt"])
def test_odd_generate_and_decoder_arguments_are_config_errors(gpt2, call, error, message):
    model, params, state, _ = gpt2
    with pytest.raises(error, match=message):
        call(model, params, state)


@pytest.mark.parametrize("name, meant", [("gredy", "'greedy'"), ("Greedy", "'greedy'"),
                                         ("topk", r"mg\.sampling\.TopK\(\.\.\.\)"),
                                         ("temprature", r"mg\.sampling\.Temperature\(\.\.\.\)")])
def test_a_misspelt_sampler_name_names_the_one_meant(gpt2, name, meant):
    model, params, state, _ = gpt2
    with pytest.raises(mg.ConfigError, match=rf"got '{name}' \(did you mean {meant}\?\)"):
        mg.generate(model, params, state, np.array([[1, 2]]), max_new_tokens=2, sampler=name)


@pytest.mark.parametrize("batch", [0, -1, True, 2.0, ""])
def test_a_bad_decoding_batch_is_named_as_the_batch(gpt2, batch):
    dec = mg.decoder(gpt2[0], max_length=32)
    for call in (dec.decode_graph, dec.model):
        with pytest.raises(mg.GraphError, match=rf"^batch must be a positive int \(or a symbolic "
                                                rf"dim's name, a str\), got {re.escape(repr(batch))}$"):
            call(batch)


def test_a_cache_or_generation_past_the_position_table_is_refused_not_nan():
    """A learned position table of 24 rows: a decoder of more slots, or a generation of
    more positions, would look positions up past the table (NaN logits, token 0 sampled):
    both are ShapeErrors naming the table; a generation that fits caps its cache at the
    table and equals the full forward's greedy continuation."""
    g = mg.models.gpt2({**GPT2, "n_positions": 24})
    model = mg.compile(g)
    params, state = model.init(jax.random.key(3))
    with pytest.raises(mg.ShapeError, match=r"layer 'arange'.*max_length=32 slots, but the "
                       r"position table has 24"):
        mg.decoder(g, max_length=32)
    prompt = np.arange(1, 9, dtype=np.int32)[None]
    with pytest.raises(mg.ShapeError, match="need 25 positions, but the model's position "
                       "table has 24"):
        mg.generate(model, params, state, prompt, max_new_tokens=17)
    ids = np.asarray(mg.generate(model, params, state, prompt, max_new_tokens=16))
    assert ids.shape == (1, 24)
    for t in range(8, 24):  # each new token is the full forward's argmax at its position
        logits, _ = model.apply(params, state, ids[:, :t], inference_mode=True)
        assert ids[0, t] == int(np.argmax(np.asarray(logits)[0, -1]))


# --- the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A Llama checkpoint folder: config.json, model.safetensors, tokenizer.json (a word
    level tokenizer of the words w0 ... w79)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models

    folder = tmp_path_factory.mktemp("llama")
    g = mg.models.llama(LLAMA)
    params, state = mg.compile(g).init(jax.random.key(5))
    params = jax.tree.map(lambda w: w * 3.0, params)
    save_file(mg.models.to_state_dict(g, params, state), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(LLAMA))
    tokenizer = Tokenizer(tokenizer_models.WordLevel({f"w{i}": i for i in range(80)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder, g, params, state


def test_cli_generate_from_ids_and_from_text(llama_folder, capsys):
    from mlaxgraph.cli.main import main

    folder, g, params, state = llama_folder
    want = np.asarray(mg.generate(mg.compile(g), params, state, np.array([[4, 9, 2]]), max_new_tokens=6))
    assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids", "4,9,2",
                 "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out
    assert f"ids: {','.join(str(t) for t in want[0])}" in printed
    assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt", "w4 w9 w2",
                 "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out
    assert f"ids: {','.join(str(t) for t in want[0])}" in printed
    assert "text: " + " ".join(f"w{t}" for t in want[0]) in printed
    penalised = np.asarray(mg.generate(
        mg.compile(g), params, state, np.array([[4, 9, 2]]), max_new_tokens=6,
        sampler=mg.sampling.RepetitionPenalty(1.5) + mg.sampling.NoRepeatNGram(2)))
    assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids", "4,9,2",
                 "--max-new-tokens", "6", "--repetition-penalty", "1.5",
                 "--no-repeat-ngram-size", "2"]) == 0
    assert f"ids: {','.join(str(t) for t in penalised[0])}" in capsys.readouterr().out


def test_cli_generate_stops_at_any_of_the_listed_stop_tokens(llama_folder, tmp_path, capsys):
    # a list in the config, or generation_config.json's (Llama 3's): it was dropped
    from mlaxgraph.cli.main import main

    source, g, params, state = llama_folder
    plain = np.asarray(mg.generate(mg.compile(g), params, state, np.array([[4, 9, 2]]),
                                   max_new_tokens=6))[0, 3:].tolist()
    stop = plain[2]
    want = plain[:min(i for i, t in enumerate(plain) if t in (79, stop)) + 1]
    for where in ("config.json", "generation_config.json"):
        folder = tmp_path / where.split(".")[0]
        folder.mkdir()
        for f in source.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        fields = json.loads((folder / "config.json").read_text()) if where == "config.json" else {}
        (folder / where).write_text(json.dumps({**fields, "eos_token_id": [79, stop]}))
        assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids",
                     "4,9,2", "--max-new-tokens", "6"]) == 0
        assert f"ids: {','.join(str(t) for t in [4, 9, 2] + want)}" in capsys.readouterr().out
    assert main(["generate", "--model", "llama", "--weights", str(source), "--prompt-ids", "4,9,2",
                 "--max-new-tokens", "6", "--eos-token-id", f"79,{stop}"]) == 0
    assert f"ids: {','.join(str(t) for t in [4, 9, 2] + want)}" in capsys.readouterr().out


def test_cli_generate_reads_generation_configs_sampling_as_hugging_face_does(llama_folder, tmp_path,
                                                                           capsys):
    """do_sample with temperature, top_p and a repetition penalty: Hugging Face's generate
    samples with them (and its default top_k of 50); the flags override them."""
    from mlaxgraph.cli.main import main

    source, g, params, state = llama_folder
    folder = tmp_path / "sampling"
    folder.mkdir()
    for f in source.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.3}))
    S = mg.sampling
    for seed in (0, 1):
        want = np.asarray(mg.generate(
            mg.compile(g), params, state, np.array([[4, 9, 2]]), max_new_tokens=6,
            sampler=S.RepetitionPenalty(1.3) + S.Temperature(0.6) + S.TopK(50) + S.TopP(0.9),
            key=jax.random.key(seed)))
        assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids",
                     "4,9,2", "--max-new-tokens", "6", "--seed", str(seed)]) == 0
        printed = capsys.readouterr().out
        assert f"ids: {','.join(str(t) for t in want[0])}" in printed and "TopK(k=50)" in printed
    greedy = np.asarray(mg.generate(mg.compile(g), params, state, np.array([[4, 9, 2]]),
                                    max_new_tokens=6, sampler=S.RepetitionPenalty(1.3)))
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "temperature": 0.6, "repetition_penalty": 1.3}))  # no draws
    assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids",
                 "4,9,2", "--max-new-tokens", "6"]) == 0
    assert f"ids: {','.join(str(t) for t in greedy[0])}" in capsys.readouterr().out


def test_cli_generate_bad_input(llama_folder, capsys):
    from mlaxgraph.cli.main import main

    folder = llama_folder[0]
    assert main(["generate", "--model", "llama", "--weights", str(folder), "--prompt-ids", "4,80"]) == 1
    assert "token id 80 is out of the vocabulary" in capsys.readouterr().err
    assert main(["generate", "--model", "llama", "--prompt", "w1 w2"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    assert main(["generate", "--model", "llama", "--prompt-ids", "1,x"]) == 2
    assert "comma-separated ints" in capsys.readouterr().err
    # wrong arguments exit 2 naming the flag (they exited 1 naming Python's parameters)
    for flags, message in ((["--max-new-tokens", "-3"], "--max-new-tokens: must be >= 0"),
                           (["--temperature", "0"], "--temperature: must be > 0"),
                           (["--top-p", "1.5"], "--top-p: must be > 0 and <= 1"),
                           (["--weights", str(folder / "missing")], "no such file or folder")):
        assert main(["generate", "--model", "llama", "--prompt-ids", "1,2", *flags]) == 2
        assert message in capsys.readouterr().err


def test_cli_generate_names_the_config_files_and_their_misspelt_fields(llama_folder, tmp_path, capsys):
    from mlaxgraph.cli.main import main

    source = llama_folder[0]
    folder = tmp_path / "typo"
    folder.mkdir()
    for f in source.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (tmp_path / "bad.json").write_text("{bad")
    base = ["generate", "--model", "llama", "--prompt-ids", "4,9,2", "--max-new-tokens", "2"]
    assert main([*base, "--config", str(tmp_path / "none.json")]) == 2
    assert f"--config {tmp_path / 'none.json'}: no such file" in capsys.readouterr().err
    assert main([*base, "--config", str(tmp_path / "bad.json")]) == 1
    assert f"{tmp_path / 'bad.json'} line 1 column 2: not valid JSON" in capsys.readouterr().err
    for text, status, message in (
            ("{bad", 1, "generation_config.json line 1 column 2: not valid JSON"),
            ('{"do_sample": true, "temprature": 0.1}', 1,
             "field 'temprature' (did you mean 'temperature'?) is not a Hugging Face generation setting"),
            ('{"do_sample": false, "chat_format": "raw"}', 0,
             "warning: " + str(folder / "generation_config.json") + ": field 'chat_format' is not a "
             "Hugging Face generation setting; it is not read")):
        (folder / "generation_config.json").write_text(text)
        assert main([*base, "--weights", str(folder)]) == status
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("policy", [None, mg.Policy(compute_dtype="bfloat16")], ids=["f32", "bf16"])
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["summed_step", "dotted_step"])
def test_cached_attention_flops_rule_matches_xla(policy, kv_heads):
    # 4 query heads over 2 key/value heads: a step of several rows sums (one row: dots);
    # 8 over 1: past MAX_GROUP_SUMMED
    config = dict(LLAMA, num_key_value_heads=kv_heads, num_attention_heads=4 * (3 - kv_heads))
    assert (config["num_attention_heads"] // kv_heads > ops.cached_attention.MAX_GROUP_SUMMED) == (kv_heads == 1)
    dec = mg.decoder(mg.compile(mg.models.llama(config), policy=policy), max_length=16)
    for batch, seq in ((3, 1), (1, 1), (3, 5)):
        table = dec.model(batch).cost_table(batch=batch, seq=seq, inference_mode=True)
        for row in table:
            if row.op == "cached_attention":
                # exact for a step; a prefill: XLA also counts the add of the cache index
                # to each token's offset (seq of them), which it folds away for one token
                assert row.xla_flops - row.flops == (0 if seq == 1 else seq), row


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_token_attention_equals_numpy(dtype):
    """A step's attention (products and sums over the cache) against float64 NumPy, with
    grouped-query heads (3 query heads per key/value head), masked slots and a window."""
    op = ops.CachedAttention(6, 8, 16, max_length=12, batch=2, num_kv_heads=2, sliding_window=5)
    rng = np.random.default_rng(0)
    q, keys, values = (rng.normal(size=s) for s in [(2, 1, 6, 8), (2, 12, 2, 8), (2, 12, 2, 8)])
    index = 7
    mask = np.ones((2, 12), bool)
    mask[1, :4] = False  # a left-padded row
    slots = np.arange(12)
    allowed = mask & (slots <= index) & (index - slots < 5)  # (batch, slots)
    as_jax = [jnp.asarray(a, dtype) for a in (q, keys, values)]
    got = op._attend_one(*as_jax, jnp.asarray(allowed)[:, None], jnp.float32)
    grouped = np.asarray(as_jax[0], np.float64).reshape(2, 2, 3, 8)
    k64, v64 = (np.asarray(a, np.float64) for a in as_jax[1:])
    scores = np.einsum("bngk,bsnk->bngs", grouped, k64)
    scores = np.where(allowed[:, None, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    want = np.einsum("bngs,bsnk->bngk", weights, v64).reshape(2, 1, 6, 8)
    assert got.dtype == jnp.dtype(dtype) and got.shape == (2, 1, 6, 8)
    tol = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=tol, rtol=tol)
    many = op._attend_many(*as_jax, jnp.asarray(allowed)[:, None], jnp.float32)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(many, np.float64), atol=tol, rtol=tol)


def test_a_model_without_attention_decodes_against_numpy():
    # nothing reads positions or a cache (a bigram model): the decoding graph takes the
    # decoder's inputs all the same
    ids = mg.Input(("batch", "seq"), "int32", name="ids")
    g = mg.Graph(ids, ops.Linear(20, name="head")(ops.Embedding(20, 8, name="emb")(ids)))
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    dec = mg.decoder(g, max_length=16)
    assert dec.decode_graph(1).inputs == ("ids", "positions", "cache_index", "cache_mask")
    tokens = np.array([[3, 7, 1, 12]])
    got = np.asarray(_prefill_and_steps(dec, params, state, tokens, 2))
    table, kernel, bias = (np.asarray(a, np.float64) for a in (
        params["emb"]["embedding"], params["head"]["kernel"], params["head"]["bias"]))
    np.testing.assert_allclose(got, table[tokens] @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_a_misspelt_prefill_keyword_is_named(gpt2):
    model, params, state, _ = gpt2
    dec = mg.decoder(model, max_length=32)
    with pytest.raises(mg.ConfigError, match=r"prefill got unexpected keyword argument 'mask' "
                                             r"\(attention_mask=\)"):
        dec.prefill(params, state, np.ones((1, 3), np.int32), mask=np.ones((1, 3)))


def test_columns_of_padding_in_every_row_count_against_no_position_limit():
    """A batch padded to 60 columns whose rows hold 20 and 10 tokens needs 20 + 20
    positions of a 64-row table, as Hugging Face's generate runs it."""
    g = mg.models.gpt2({**GPT2, "n_positions": 64})
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    ids = np.random.default_rng(0).integers(0, 96, (2, 60))
    mask = np.zeros((2, 60), np.int32)
    mask[0, 40:], mask[1, 50:] = 1, 1
    out = np.asarray(mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=20))
    assert out.shape == (2, 80)
    np.testing.assert_array_equal(out[:, :60], ids)
    for row, tokens in ((0, 20), (1, 10)):
        alone = mg.generate(model, params, state, ids[row:row + 1, 60 - tokens:], max_new_tokens=20)
        np.testing.assert_array_equal(out[row, 60:], np.asarray(alone)[0, tokens:])
    streamed = np.stack(list(mg.generate_stream(model, params, state, ids, attention_mask=mask,
                                                max_new_tokens=20)), axis=1)
    np.testing.assert_array_equal(streamed, out[:, 60:])
    with pytest.raises(mg.ShapeError, match="a prompt of 20 tokens and max_new_tokens=50 need 70"):
        mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=50)


def test_a_tokenizers_output_and_array_stop_lists_as_users_pass_them(gpt2):
    model, params, state, _ = gpt2
    batch = {"input_ids": np.ones((1, 3), np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    with pytest.raises(mg.ShapeError, match=r"got a dict of input_ids, attention_mask: pass "
                                            r"input_ids=batch\['input_ids'\]"):
        mg.generate(model, params, state, batch, max_new_tokens=2)
    plain = mg.generate(model, params, state, batch["input_ids"], max_new_tokens=4, eos_token_id=[5, 37])
    for stops in (np.array([5, 37]), jnp.array([5, 37])):
        np.testing.assert_array_equal(
            mg.generate(model, params, state, batch["input_ids"], max_new_tokens=4, eos_token_id=stops), plain)


def test_generate_stream_checks_its_arguments_at_the_call(gpt2):
    model, params, state, _ = gpt2
    with pytest.raises(mg.ShapeError, match="token id 200 is out of the vocabulary"):
        mg.generate_stream(model, params, state, np.array([[1, 200]]), max_new_tokens=2)  # no next()
    with pytest.raises(mg.ConfigError, match="generate_stream got temprature=1"):
        mg.generate_stream(model, params, state, np.array([[1, 2]]), max_new_tokens=2, temprature=1)
    assert list(mg.generate_stream(model, params, state, np.array([[1, 2]]), max_new_tokens=0)) == []


def test_a_misspelt_hugging_face_keyword_and_a_host_raw_key(gpt2):
    model, params, state, _ = gpt2
    with pytest.raises(mg.ConfigError, match=r"did you mean Hugging Face's temperature\? here "
                                             r"sampler=mg\.sampling\.Temperature\(\.\.\.\)"):
        mg.generate(model, params, state, np.array([[1, 2]]), max_new_tokens=2, temprature=0.7)
    draw = mg.sampling.Temperature(1.0)
    on_host = mg.generate(model, params, state, np.array([[1, 2]]), max_new_tokens=4, sampler=draw,
                          key=np.array([0, 7], np.uint32))  # as jax.random.PRNGKey(7) holds it
    np.testing.assert_array_equal(on_host, mg.generate(model, params, state, np.array([[1, 2]]),
                                                       max_new_tokens=4, sampler=draw,
                                                       key=jax.random.PRNGKey(7)))
