"""LoRA on MultiHeadAttention's projections: query, key, value, the fused qkv and the
output projection adapted as nodes of their own, checked against NumPy attention with
the low-rank update added to the kernels; grouped-query attention, merging, scanning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.adapters.lora import lora_targets

D, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4


def _graph(kv_heads=None):
    x = mg.Input(("batch", 6, D), name="x")
    attention = ops.MultiHeadAttention(HEADS, HEAD_DIM, num_kv_heads=kv_heads, causal=True,
                                       name="attn")
    return mg.Graph(x, ops.Linear(3, name="head")(attention(x)), name="net")


def _numpy_attention(x, p, kv_heads):
    """Causal attention in NumPy, float64; p holds (d, h, k) / (h, k, out) kernels."""
    x = x.astype(np.float64)
    q = np.einsum("bld,dhk->blhk", x, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("bld,dhk->blhk", x, p["key"]["kernel"]) + p["key"]["bias"]
    v = np.einsum("bld,dhk->blhk", x, p["value"]["kernel"]) + p["value"]["bias"]
    group = HEADS // kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(HEAD_DIM)
    length = x.shape[1]
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = np.einsum("bhqs,bshk->bqhk", weights, v)
    return np.einsum("bqhk,hko->bqo", attended, p["out"]["kernel"]) + p["out"]["bias"]


def _random(params, key, scale=0.3):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [scale * jax.random.normal(k, w.shape) for k, w in zip(keys, leaves)])


@pytest.mark.parametrize("targets, projections", [
    ("attn", ("query", "value")),
    ("attn/qkv", ("qkv",)),
    ("attn/*", ("query", "key", "value", "out")),
    (["attn/key", "attn/out"], ("key", "out")),
])
@pytest.mark.parametrize("kv_heads", [None, KV_HEADS])
def test_adapted_attention_equals_numpy(targets, projections, kv_heads):
    g = _graph(kv_heads)
    g2 = mg.lora(g, targets, rank=2, alpha=6)
    assert g2.node("attn").op.adapters == projections
    for p in projections:
        assert {f"attn.{p}.lora_A", f"attn.{p}.lora_B", f"attn.{p}.lora_scale"} <= {
            n.name for n in g2.nodes}
    params, state = mg.compile(g2).init(jax.random.key(0))
    params = _random(params, jax.random.key(1))
    x = np.asarray(jax.random.normal(jax.random.key(2), (2, 6, D)))
    out, _ = mg.compile(g2).apply(params, state, x)

    kv = kv_heads or HEADS
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params["attn"])
    for name in projections:
        a = np.asarray(params[f"attn.{name}.lora_A"]["kernel"], np.float64)
        b = np.asarray(params[f"attn.{name}.lora_B"]["kernel"], np.float64)
        delta = 3.0 * a @ b   # alpha / rank
        if name == "qkv":
            widths = [HEADS * HEAD_DIM, kv * HEAD_DIM, kv * HEAD_DIM]
            for part, piece in zip(("query", "key", "value"), np.split(delta, np.cumsum(widths)[:2], 1)):
                p[part]["kernel"] = p[part]["kernel"] + piece.reshape(p[part]["kernel"].shape)
        else:
            p[name]["kernel"] = p[name]["kernel"] + delta.reshape(p[name]["kernel"].shape)
    y = _numpy_attention(x, p, kv)
    want = y @ np.asarray(params["head"]["kernel"], np.float64) + np.asarray(params["head"]["bias"])
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-4, atol=2e-4)

    merged, merged_params = mg.merge_lora(g2, params)
    assert merged == g
    again, _ = mg.compile(merged).apply(merged_params, state, x)
    np.testing.assert_allclose(np.asarray(again), np.asarray(out), rtol=1e-5, atol=1e-5)


def test_zero_b_equals_the_base_and_base_weights_keep_their_paths():
    g = _graph(KV_HEADS)
    base_params, state = mg.compile(g).init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(2), (2, 6, D))
    base, _ = mg.compile(g).apply(base_params, state, x)
    model = mg.compile(mg.lora(g, "attn/*", rank=2))
    report = model.reuse_report(base_params, state)
    assert not report.dropped and not report.changed
    params, _ = model.init(jax.random.key(1), reuse=(base_params, state))
    assert params["attn"]["query"]["kernel"] is base_params["attn"]["query"]["kernel"]
    out, _ = model.apply(params, state, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(base))


def test_gpt2_attention_adapters_scan_and_stack():
    g = mg.models.gpt2({"n_layer": 3, "n_embd": 16, "n_head": 2, "vocab_size": 31,
                        "n_positions": 8})
    g2 = mg.lora(g, "h.*/attn/qkv", rank=2)
    flat = mg.compile(g2)
    params, state = flat.init(jax.random.key(0))
    params = jax.tree.map(lambda w: w, params)
    for i in range(3):
        adapter = params[f"h.{i}"]["attn.qkv.lora_B"]
        adapter["kernel"] = 0.2 * jax.random.normal(jax.random.key(i), adapter["kernel"].shape)
    ids = jax.random.randint(jax.random.key(5), (2, 8), 0, 31)
    want, _ = flat.apply(params, state, ids, inference_mode=True)
    scanned = mg.compile(g2, scan_blocks="always")
    assert [n.name for n in scanned.graph.nodes if n.name.startswith("h.")] == ["h.0..h.2"]
    stacked, stacked_state = scanned.stack_weights(params, state)
    assert jax.tree.map(jnp.shape, mg.lora_params(stacked)) == {"h.0..h.2": {
        "attn.qkv.lora_A": {"kernel": (3, 16, 2)}, "attn.qkv.lora_B": {"kernel": (3, 2, 48)}}}
    out, _ = scanned.apply(stacked, stacked_state, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("targets, projections", [
    (["attn", "attn/query"], ("query", "value")),
    (["attn/query", "attn"], ("query", "value")),
    (["attn", "attn/out"], ("query", "value", "out")),
    (["attn/key", "a*"], ("query", "key", "value")),
])
def test_targets_naming_one_attention_adapt_what_they_ask_together(targets, projections):
    assert lora_targets(_graph(), targets) == {"attn": projections}
    assert mg.lora(_graph(), targets, rank=2).node("attn").op.adapters == projections


def test_bad_attention_targets_are_errors():
    g = _graph()
    with pytest.raises(mg.ConfigError, match="choose one form"):
        mg.lora(g, ["attn/qkv", "attn/query"], rank=2)
    with pytest.raises(mg.ConfigError, match="the attention itself asks for query and value"):
        mg.lora(g, ["attn", "attn/qkv"], rank=2)
    for wrong, near in (("quer", "; near: attn/query"), ("q_proj", ". PyTorch"),
                        ("c_attn", ". PyTorch"), ("Out", "; near: attn/out")):
        with pytest.raises(mg.GraphError) as e:
            mg.lora(g, f"attn/{wrong}", rank=2)
        assert str(e.value).startswith(
            f"lora('attn/{wrong}'): 'attn' names attention (MultiHeadAttention), and "
            f"{wrong!r} is none of its projections: query, key, value, out, and qkv"), e.value
        assert near in str(e.value)
    # "**" names every layer, attention or not: "**/atn" (a typo) is a pattern that
    # matches no layer, not a projection of the attention layers "**" also matches
    with pytest.raises(mg.GraphError) as e:
        mg.lora(g, "**/atn", rank=2)
    assert str(e.value).startswith("lora('**/atn'): pattern '**/atn' matches no layer"), e.value
    assert [p for p, _ in mg.lora(g, "**/query", rank=2).walk() if p.endswith("lora_A")] == \
        ["attn.query.lora_A"]
    g2 = mg.lora(g, "attn", rank=2)
    with pytest.raises(mg.ConfigError, match="adapters already"):
        mg.lora(g2, "attn/query", rank=2)
    assert dict(mg.lora(g2, "attn/out", rank=2).walk())["attn"].op.adapters == ("query", "value", "out")
    with pytest.raises(mg.ConfigError, match="adapters must be"):
        ops.MultiHeadAttention(2, adapters=("value", "query"))


def test_scanned_base_weights_are_reused_and_adapted_models_save(tmp_path):
    g = mg.models.gpt2({"n_layer": 3, "n_embd": 16, "n_head": 2, "vocab_size": 31,
                        "n_positions": 8})
    params, state = mg.compile(g, scan_blocks="always").init(jax.random.key(0))
    g2 = mg.lora(g, ["h.*/attn/qkv", "h.*/attn/out"], rank=2)
    model = mg.compile(g2, scan_blocks="always")
    p2, s2 = model.init(jax.random.key(1), reuse=(params, state))
    # The stacked base weights are the very same arrays: nothing restacked or copied.
    for name in ("query", "key", "value", "out"):
        assert p2["h.0..h.2"]["attn"][name]["kernel"] is params["h.0..h.2"]["attn"][name]["kernel"]
    p2 = jax.tree.map(lambda w: w + 0.01, p2)
    ids = jax.random.randint(jax.random.key(5), (2, 8), 0, 31)
    want, _ = model.apply(p2, s2, ids, inference_mode=True)
    mg.save(tmp_path / "adapted.mlg", model.graph, p2, s2)
    loaded, lp, ls = mg.load(tmp_path / "adapted.mlg")
    assert loaded == g2
    out, _ = mg.compile(loaded).apply(lp, ls, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)


def _masked_graph():
    """Causal grouped-query attention reading a key-padding mask (Hugging Face's
    ``attention_mask``: 1 attends, 0 is padding)."""
    x = mg.Input(("batch", 6, D), name="x")
    mask = mg.Input(("batch", 6), dtype="int32", name="attention_mask")
    attention = ops.MultiHeadAttention(HEADS, HEAD_DIM, num_kv_heads=KV_HEADS, causal=True,
                                       name="attn")
    return mg.Graph([x, mask], ops.Linear(3, name="head")(attention(x, mask=mask)), name="net")


def test_adapted_attention_reads_its_padding_mask():
    """The key-padding mask still applies once adapters feed the attention extra inputs."""
    g2 = mg.lora(_masked_graph(), "attn", rank=2, alpha=4)
    params, state = mg.compile(g2).init(jax.random.key(0))
    params = _random(params, jax.random.key(1))
    x = np.asarray(jax.random.normal(jax.random.key(2), (2, 6, D)))
    padding = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], np.int32)
    out, _ = mg.compile(g2).apply(params, state, x, padding)

    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params["attn"])
    for name in ("query", "value"):
        a = np.asarray(params[f"attn.{name}.lora_A"]["kernel"], np.float64)
        b = np.asarray(params[f"attn.{name}.lora_B"]["kernel"], np.float64)
        p[name]["kernel"] = p[name]["kernel"] + (2.0 * a @ b).reshape(p[name]["kernel"].shape)
    xd = x.astype(np.float64)
    q, k, v = (np.einsum("bld,dhk->blhk", xd, p[n]["kernel"]) + p[n]["bias"]
               for n in ("query", "key", "value"))
    k, v = np.repeat(k, HEADS // KV_HEADS, axis=2), np.repeat(v, HEADS // KV_HEADS, axis=2)
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(HEAD_DIM)
    allowed = np.tril(np.ones((6, 6), bool))[None, None] & (padding[:, None, None, :] == 1)
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum("bqhk,hko->bqo", np.einsum("bhqs,bshk->bqhk", weights, v),
                  p["out"]["kernel"]) + p["out"]["bias"]
    want = y @ np.asarray(params["head"]["kernel"], np.float64) + np.asarray(params["head"]["bias"])
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-4, atol=2e-4)


def test_adapted_attention_costs_and_displays_like_any_layer(tmp_path):
    """Every place that counts an adapted attention's FLOPs (the cost table, the explorer,
    the diff page, Model Explorer's file, the memory planner, QLoRA's too) works on it;
    the counts agree with XLA's, layer by layer."""
    g = _masked_graph()
    g2 = mg.lora(g, "attn/*", rank=2, alpha=4)
    table = mg.compile(g2).cost_table(batch=2)
    assert {row.layer for row in table} >= {"attn", "attn.query.lora_A", "attn.out.lora"}
    for row in table:
        assert row.flops == pytest.approx(row.xla_flops, rel=0.05), row
    assert table.flops == pytest.approx(table.xla_total, rel=0.05)
    assert "attn.value.lora_A" in g2._repr_html_()
    g2.to_html(tmp_path / "g.html")
    assert "attn.key.lora_B" in (tmp_path / "g.html").read_text()
    assert mg.show(g2, open_browser=False, batch=2)
    assert "attn.qkv" not in mg.diff_html(g, g2) and "attn.query.lora_A" in mg.diff_html(g, g2)
    assert g2.to_model_explorer(tmp_path / "g.json", batch=2)
    # QLoRA: the planner's gradient step takes the int8 weights along, without gradients.
    qlora = mg.lora(mg.quantize(g, "int8"), "attn/*", rank=2, alpha=4)
    plan = mg.compile(qlora, memory_budget="1GB", dims={"batch": 2}).memory_plan()
    full = {o.path: o.recomputed_flops for o in plan.options if o.policy == "full"}
    quantized = mg.compile(qlora).cost_table(batch=2, xla=False)
    assert full["attn"] == next(row.flops for row in quantized if row.layer == "attn") > 0
    assert plan.measured_peak > 0
