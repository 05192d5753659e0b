"""The zoo as users train and shard it: the originals' initialization, strict configs,
rope_parameters and rope scaling, Qwen2, Mistral's window, position limits, images of
any size, the sharding rules, and the frictions users met, each with their exact call.

References are written here: the initialization rules of Hugging Face's
``_init_weights`` and torchvision's ResNet (statistics within sampling error), and
float64 NumPy forward passes (Llama 3 and linear rope scaling from the formulas of
transformers' ``modeling_rope_utils``; Qwen2; a sliding window)."""

from __future__ import annotations

import json
import math

import _zoo_transformers as tf
import jax
import numpy as np
import optax
import pytest
from _torch_file import write_torch_file
from jax.sharding import PartitionSpec as P

import mlaxgraph as mg

# --- initialization ----------------------------------------------------------------------

SMALL = {
    "gpt2": dict(vocab_size=1000, n_positions=32, n_embd=64, n_layer=3, n_head=4),
    "llama": dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "qwen2": dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "bert": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=32),
    "vit": dict(image_size=16, patch_size=4, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128),
}


def _init(family, config=None, **kwargs):
    graph = getattr(mg.models, family)(SMALL[family] if config is None else config, **kwargs)
    return graph, *mg.compile(graph).init(jax.random.key(0))


def _next_token_loss(family, params, state, graph, vocab=1000):
    ids = np.random.default_rng(1).integers(0, vocab, size=(4, 17)).astype(np.int32)
    logits, _ = mg.compile(graph).apply(params, state, ids[:, :-1], inference_mode=True)
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean())


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_fresh_causal_lm_starts_at_ln_v_as_transformers(family):
    graph, params, state = _init(family)
    loss = _next_token_loss(family, params, state, graph)
    assert abs(loss - math.log(1000)) < 0.1 * math.log(1000), loss


def test_a_fresh_bert_tied_to_its_word_embeddings_starts_at_ln_v():
    """BertModel has no head here: its last hidden state (LayerNorm'd, std 1) against the
    word embeddings (std initializer_range), as the MLM head ties them, gives ln V."""
    graph, params, state = _init("bert")
    ids = np.random.default_rng(1).integers(0, 1000, size=(4, 16)).astype(np.int32)
    h, _ = mg.compile(graph).apply(params, state, ids, np.zeros_like(ids), np.ones_like(ids),
                                   inference_mode=True)[0]
    assert abs(float(np.std(h)) - 1.0) < 0.05
    logits = np.asarray(h) @ np.asarray(params["embeddings.word_embeddings"]["embedding"]).T
    masked = np.random.default_rng(2).integers(0, 1000, size=ids.shape)  # the tokens to predict
    loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, masked).mean())
    assert abs(loss - math.log(1000)) < 0.1 * math.log(1000)


def _check_normal(values, std, what):
    """Mean 0 and standard deviation ``std`` within 6 standard errors."""
    x = np.asarray(values, np.float64).ravel()
    n = x.size
    assert abs(x.mean()) < 6 * std / math.sqrt(n), (what, x.mean(), std)
    assert abs(x.std() / std - 1) < 6 / math.sqrt(2 * n), (what, x.std(), std)


def _check_constant(values, value, what):
    np.testing.assert_array_equal(np.asarray(values), value, err_msg=what)


def _leaves(tree):
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _expected_transformer_rule(family, path, layers, std=0.02):
    """Hugging Face's rule for each weight: (kind, value)."""
    leaf = path.rsplit("/", 1)[-1]
    if leaf == "bias":
        return "constant", 0.0
    if leaf == "scale":  # LayerNorm, RMSNorm
        return "constant", 1.0
    if family == "gpt2" and (path.endswith("out/kernel") or "mlp.c_proj" in path):
        return "normal", std / math.sqrt(2 * layers)  # c_proj: scaled by 1/sqrt(2 n_layer)
    return "normal", std


@pytest.mark.parametrize("family, layers", [("gpt2", 3), ("bert", 2), ("vit", 2), ("llama", 2), ("qwen2", 2)])
def test_every_weight_follows_the_originals_rule(family, layers):
    _, params, _ = _init(family)
    checked = 0
    for path, value in _leaves(params).items():
        kind, expected = _expected_transformer_rule(family, path, layers)
        if kind == "constant":
            _check_constant(value, expected, path)
        else:
            _check_normal(value, expected, path)
        checked += 1
    assert checked > 10


def test_initializer_range_is_read():
    _, params, _ = _init("llama", dict(SMALL["llama"], initializer_range=0.05))
    _check_normal(params["model.embed_tokens"]["embedding"], 0.05, "embed")
    _check_normal(params["model.layers.0"]["mlp.down_proj"]["kernel"], 0.05, "down_proj")
    _, params, _ = _init("gpt2", dict(SMALL["gpt2"], initializer_range=0.1))
    _check_normal(params["h.1"]["mlp.c_proj"]["kernel"], 0.1 / math.sqrt(6), "c_proj")


def test_resnet_initialization_is_torchvisions():
    graph = mg.models.resnet18(num_classes=10, width=16, zero_init_residual=True)
    params, state = mg.compile(graph).init(jax.random.key(0))
    for path, value in _leaves(params).items():
        value = np.asarray(value)
        if path.endswith("kernel") and value.ndim == 4:  # (out, kh, kw, in): fan_out = out*kh*kw
            _check_normal(value, math.sqrt(2.0 / (value.shape[0] * value.shape[1] * value.shape[2])), path)
        elif path.endswith("scale"):  # zero_init_residual: each block's last BatchNorm at 0
            _check_constant(value, 0.0 if path.endswith("bn2/scale") and path.startswith("layer") else 1.0, path)
        elif path.startswith("fc/"):  # nn.Linear: uniform in +-1/sqrt(fan_in), its bias too
            bound = 1.0 / math.sqrt(128)
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound
            if value.ndim == 2:
                assert abs(value.std() / (bound / math.sqrt(3)) - 1) < 6 / math.sqrt(2 * value.size)
        else:
            _check_constant(value, 0.0, path)
    default = mg.compile(mg.models.resnet18(num_classes=10, width=2)).init(jax.random.key(0))[0]
    _check_constant(default["layer1.0"]["bn2"]["scale"], 1.0, "bn2 without zero_init_residual")
    big = mg.compile(mg.models.resnet50(num_classes=10, width=2, zero_init_residual=True)).init(jax.random.key(0))[0]
    _check_constant(big["layer2.1"]["bn3"]["scale"], 0.0, "bn3 with zero_init_residual")


def test_resnet_activations_keep_their_scale_at_init():
    """Kaiming fan_out keeps the ReLU network's signal O(1): the logits of a fresh
    ResNet-18 in training mode (batch statistics) are of order 1, not 0 or 1e3."""
    graph = mg.models.resnet18(num_classes=10, width=16)
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    x = np.random.default_rng(0).normal(size=(8, 32, 32, 3)).astype(np.float32)
    logits, _ = model.apply(params, state, x, rng=jax.random.key(1))
    assert 0.05 < float(np.std(logits)) < 5.0


def test_initialized_zoo_graphs_save_and_load(tmp_path):
    """The parametrized initializers are named in files (normal:0.02) and read back."""
    graph, params, state = _init("gpt2")
    mg.save(tmp_path / "gpt2.mlg", graph, params, state)
    loaded, params2, _ = mg.load(tmp_path / "gpt2.mlg")
    assert loaded == graph
    np.testing.assert_array_equal(params2["wte"]["embedding"], params["wte"]["embedding"])


# --- strict configs ----------------------------------------------------------------------


def test_a_misspelled_field_is_an_error_naming_it_and_the_near_field():
    with pytest.raises(mg.ConfigError, match=r"'n_layers' \(did you mean 'n_layer'\?\)"):
        mg.models.gpt2({"n_layers": 2, "n_embd": 64, "n_head": 4})


def test_another_familys_config_is_an_error_naming_both(tmp_path):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", **SMALL["gpt2"]}))
    with pytest.raises(mg.ConfigError, match="model_type is 'gpt2', but mg.models.llama builds model_type 'llama'"):
        mg.models.llama(str(tmp_path / "gpt2/config.json"))
    with pytest.raises(mg.ConfigError, match="model_type is 'gpt2'.*qwen2"):
        mg.models.qwen2(str(tmp_path / "gpt2"))


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit", "llama", "qwen2"])
def test_dict_file_and_folder_give_the_same_graph(family, tmp_path):
    config = {"model_type": family, **SMALL[family]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    build = getattr(mg.models, family)
    assert build(config) == build(str(tmp_path / "config.json")) == build(str(tmp_path)) == build(tmp_path)


def test_the_fields_of_a_real_gpt2_config_json_are_harmless(tmp_path):
    """The config.json the hub holds for gpt2 (its fields, a smaller size)."""
    config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
              "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
              "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 32, "n_embd": 64, "n_head": 4,
              "n_layer": 2, "n_positions": 32, "resid_pdrop": 0.1, "summary_activation": None,
              "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
              "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True}},
              "vocab_size": 100, "transformers_version": "5.0.0", "dtype": "float32", "use_cache": True}
    assert mg.models.gpt2(config).output_specs[0].shape[-1] == 100


def test_a_broken_config_json_names_the_file_and_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "n_embd": 64,\n  "n_head": 4\n  "n_layer": 2\n}\n')
    with pytest.raises(mg.ConfigError, match=r"config.json line 4 column 3: not valid JSON"):
        mg.models.gpt2(tmp_path)
    with pytest.raises(mg.ConfigError, match="has no config.json"):
        mg.models.gpt2(tmp_path / "..")


def test_builders_without_a_config_dict_check_their_arguments():
    with pytest.raises(mg.ConfigError, match="image_size must be a positive int"):
        mg.models.resnet18(image_size=0)


# --- rope: both config forms, Llama 3 and linear scaling -------------------------------


def _decoder_reference(sd, c, ids, *, inv_freq, window=None, qkv_bias=False, scale=1.0):
    """float64 Llama/Qwen2/Mistral forward: rotary with the given frequencies (``cos``
    and ``sin`` times ``scale``), a causal mask limited to the last ``window`` keys when
    given."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    eps = c.get("rms_norm_eps", 1e-6)
    pos = np.arange(ids.shape[1], dtype=np.float64)
    angles = np.concatenate([pos[:, None] * inv_freq] * 2, axis=-1)

    def rope(x):
        return scale * (x * np.cos(angles) + tf.rotate_half(x) * np.sin(angles))

    h = sd["model.embed_tokens.weight"][ids]
    length = ids.shape[1]
    allowed = np.tril(np.ones((length, length), bool))
    if window is not None:
        allowed &= (np.arange(length)[:, None] - np.arange(length)[None, :]) < window
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = tf.rms_norm(h, sd, p + "input_layernorm", eps)
        q = rope(tf.split_heads(tf.linear(x, sd, p + "self_attn.q_proj"), nh))
        k = rope(tf.split_heads(tf.linear(x, sd, p + "self_attn.k_proj"), nkv))
        v = tf.split_heads(tf.linear(x, sd, p + "self_attn.v_proj"), nkv)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        s = np.where(allowed, s, -np.inf)
        h = h + tf.linear(tf.merge_heads(tf.softmax(s) @ v), sd, p + "self_attn.o_proj")
        x = tf.rms_norm(h, sd, p + "post_attention_layernorm", eps)
        h = h + tf.linear(tf.activation("silu")(tf.linear(x, sd, p + "mlp.gate_proj"))
                          * tf.linear(x, sd, p + "mlp.up_proj"), sd, p + "mlp.down_proj")
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return tf.rms_norm(h, sd, "model.norm", eps) @ head.T


def _inv_freq(dim, theta, scaling=None):
    """transformers' modeling_rope_utils: default, linear, llama3 and yarn frequencies."""
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling is None:
        return inv
    if scaling["rope_type"] == "linear":
        return inv / scaling["factor"]
    if scaling["rope_type"] == "yarn":  # the paper's ramp over the feature index
        original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
        lo, hi = (dim * math.log(original / (r * 2 * math.pi)) / (2 * math.log(theta))
                  for r in (scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)))
        lo, hi = max(math.floor(lo), 0), min(math.ceil(hi), dim - 1)
        out = []
        for i, f in enumerate(inv):
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: kept, 1: divided by factor
            out.append(f / factor * ramp + f * (1 - ramp))
        return np.asarray(out)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.asarray(out)


LLAMA = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _run(graph, sd, ids):
    params, state = mg.models.load_state_dict(graph, sd)
    return np.asarray(mg.compile(graph).apply(params, state, ids, inference_mode=True)[0])


def _ids(length=24, vocab=50):
    return np.random.default_rng(3).integers(0, vocab, size=(2, length)).astype(np.int32)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8}


@pytest.mark.parametrize("form", ["transformers 4", "transformers 5"])
@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 4.0}, YARN],
                         ids=["default", "llama3", "linear", "yarn"])
def test_rope_theta_and_scaling_in_both_config_forms_match_the_formulas(form, scaling):
    theta = 500000.0 if scaling is not YARN else 100.0  # YaRN's ramp inside 4 frequencies
    if form == "transformers 4":
        config = dict(LLAMA, rope_theta=theta, rope_scaling=scaling)
    else:
        config = dict(LLAMA, rope_parameters={"rope_theta": theta, "rope_type": "default", **(scaling or {})})
    sd = tf.state_dict("llama", LLAMA)
    ids = _ids(40)
    # YaRN's cos and sin are scaled by 0.1 ln(factor) + 1
    scale = 0.1 * math.log(4.0) + 1 if scaling is YARN else 1.0
    want = _decoder_reference(sd, LLAMA, ids, inv_freq=_inv_freq(8, theta, scaling), scale=scale)
    np.testing.assert_allclose(_run(mg.models.llama(config), sd, ids), want, rtol=2e-4, atol=2e-4)


def test_the_llama3_frequencies_take_each_branch():
    """Long wavelengths divided by the factor, short ones kept, the middle blended."""
    from mlaxgraph.ops.rotary import inverse_frequencies

    scaling = tuple(sorted({**LLAMA3, "original_max_position_embeddings": 8192.0}.items()))
    base = _inv_freq(128, 500000.0)
    want = _inv_freq(128, 500000.0, dict(scaling))
    got = inverse_frequencies(128, 500000.0, scaling)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (got == base.astype(np.float32)).any() and np.isclose(got, base / 8, rtol=1e-6).any()
    assert (~np.isclose(got, base, rtol=1e-6) & ~np.isclose(got, base / 8, rtol=1e-6)).any()


def test_the_yarn_frequencies_take_each_branch_and_scale_cos_and_sin():
    """Qwen2.5's long-context YaRN (factor 4 over 32,768 positions): the fast
    frequencies kept, the slow ones divided by the factor, a ramp between; cos and sin
    times 0.1 ln(4) + 1, or the attention factor mscale and mscale_all_dim give."""
    from mlaxgraph.models.config import Config
    from mlaxgraph.models.llama import QWEN2
    from mlaxgraph.models.rope import rope_settings
    from mlaxgraph.ops.rotary import inverse_frequencies, rotary_scale, rotary_tables

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    base, scaling = rope_settings(Config(QWEN2, {"rope_theta": 1e6, "rope_scaling": yarn}))
    scaling = mg.ops.MultiHeadAttention(2, 128, rope=base, rope_scaling=scaling).rope_scaling  # defaults filled
    plain, want = _inv_freq(128, 1e6), _inv_freq(128, 1e6, yarn)
    got = inverse_frequencies(128, base, scaling)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    kept, divided = np.isclose(got, plain, rtol=1e-6), np.isclose(got, plain / 4, rtol=1e-6)
    assert kept.any() and divided.any() and (~kept & ~divided).any()
    cos, sin = rotary_tables(np.arange(5), 128, base, np.float32, scaling)
    angles = np.arange(5)[:, None] * np.concatenate([want, want])
    np.testing.assert_allclose(cos, (0.1 * math.log(4) + 1) * np.cos(angles), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sin, (0.1 * math.log(4) + 1) * np.sin(angles), rtol=1e-5, atol=1e-6)
    deepseek = {**yarn, "mscale": 0.707, "mscale_all_dim": 0.707}  # equal: the factor is 1
    _, scaling = rope_settings(Config(QWEN2, {"rope_scaling": deepseek}))
    assert rotary_scale(mg.ops.MultiHeadAttention(2, 128, rope=base, rope_scaling=scaling).rope_scaling) == 1.0


def test_a_llama3_config_json_of_transformers_5_is_not_read_as_base_10000(tmp_path):
    """The silent wrong answer: rope_parameters used to be ignored."""
    config = dict(LLAMA, model_type="llama", rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    graph = mg.models.llama(tmp_path)
    assert graph == mg.models.llama(dict(LLAMA, rope_theta=500000.0))
    assert graph != mg.models.llama(LLAMA)


@pytest.mark.parametrize("config, message", [
    (dict(LLAMA, rope_theta=10000.0, rope_parameters={"rope_theta": 500000.0}), "disagree"),
    (dict(LLAMA, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'dynamic', which is not supported"),
    (dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": 2.0, "fator": 1}), "unknown: fator"),
    (dict(LLAMA, rope_parameters={"rope_type": "llama3", "factor": 8.0}), "missing: high_freq_factor"),
])
def test_rope_fields_it_cannot_honour_are_errors(config, message):
    with pytest.raises(mg.ConfigError, match=message):
        mg.models.llama(config)


# --- Qwen2, Mistral's window -------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_qwen2_matches_numpy_and_loads_its_state_dict(tied):
    config = dict(LLAMA, model_type="qwen2", tie_word_embeddings=tied, rope_theta=1000000.0)
    graph = mg.models.qwen2(config)
    sd = tf.state_dict("llama", dict(LLAMA, attention_bias=True, tie_word_embeddings=tied))
    sd = {k: v for k, v in sd.items() if k.rsplit(".", 2)[-2:] != ["o_proj", "bias"]}  # no bias on o
    ids = _ids()
    want = _decoder_reference(sd, config, ids, inv_freq=_inv_freq(8, 1000000.0))
    np.testing.assert_allclose(_run(graph, sd, ids), want, rtol=2e-4, atol=2e-4)
    params, state = mg.models.load_state_dict(graph, sd)
    back = mg.models.to_state_dict(graph, params, state)
    assert sorted(back) == sorted(k for k in sd if not (tied and k == "lm_head.weight"))
    assert "model.layers.0.self_attn.q_proj.bias" in back and "model.layers.0.self_attn.o_proj.bias" not in back


def test_qwen2_sliding_window_is_refused():
    with pytest.raises(mg.ConfigError, match="use_sliding_window"):
        mg.models.qwen2(dict(LLAMA, use_sliding_window=True, sliding_window=4))


def test_mistral_sliding_window_is_a_masked_window():
    config = dict(LLAMA, model_type="mistral", sliding_window=5)
    sd = tf.state_dict("llama", LLAMA)
    ids = _ids(16)
    want = _decoder_reference(sd, config, ids, inv_freq=_inv_freq(8, 10000.0), window=5)
    got = _run(mg.models.llama(config), sd, ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    full = _run(mg.models.llama(dict(config, sliding_window=None)), sd, ids)
    np.testing.assert_allclose(got[:, :5], full[:, :5], rtol=1e-5, atol=1e-5)  # inside the window
    assert not np.allclose(got[:, 8:], full[:, 8:], atol=1e-3)


# --- positions, image sizes ---------------------------------------------------------------


def test_gpt2_positions_past_its_table_are_an_error_not_nan():
    """The user's call: n_positions=64 applied to 100 tokens (it returned all-NaN logits)."""
    graph = mg.models.gpt2({"n_positions": 64, "n_layer": 1, "n_embd": 32, "n_head": 4, "vocab_size": 50})
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    ids = np.zeros((1, 100), np.int32)
    with pytest.raises(mg.ShapeError, match=r"layer 'arange' \(op arange\): 100 positions, but the position "
                                            r"table has 64"):
        model.apply(params, state, ids, inference_mode=True)
    assert np.isfinite(model.apply(params, state, ids[:, :64], inference_mode=True)[0]).all()
    with pytest.raises(mg.ShapeError, match="100 positions"):  # a fixed length: at build time
        mg.ops.arange(100, limit=64)


def test_resnet_takes_any_image_size_and_equals_a_fixed_size_build():
    free = mg.models.resnet18(num_classes=10, width=2)
    fixed = mg.models.resnet18(num_classes=10, width=2, image_size=40)
    params, state = mg.compile(free).init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x40 = rng.normal(size=(2, 40, 40, 3)).astype(np.float32)
    a, _ = mg.compile(free).apply(params, state, x40, inference_mode=True)
    b, _ = mg.compile(fixed).apply(params, state, x40, inference_mode=True)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for shape in ((2, 33, 57, 3),):
        out, _ = mg.compile(free).apply(params, state, rng.normal(size=shape).astype(np.float32),
                                        inference_mode=True)
        assert out.shape == (shape[0], 10) and np.isfinite(out).all()


# --- sharding rules ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((1, 1), ("data", "model"))


def test_sharding_rules_give_the_megatron_layout(mesh):
    graph = mg.models.gpt2(SMALL["gpt2"])
    model = mg.compile(graph, mesh=mesh, rules=mg.models.sharding_rules(graph, mesh))
    specs = model.sharding.params["h.0"]
    assert specs["mlp.c_fc"]["kernel"].spec == P(None, "model")         # column-parallel
    assert specs["mlp.c_proj"]["kernel"].spec == P("model", None)       # row-parallel
    assert specs["attn"]["query"]["kernel"].spec == P(None, "model", None)
    assert specs["attn"]["out"]["kernel"].spec == P("model", None, None)  # row-parallel
    text = model.sharding.describe()
    assert "  h.0/mlp.c_proj" in text and "kernel[model,-]" in text
    assert mg.models.sharding_rules("resnet50") == {"batch": "data"}
    assert mg.models.sharding_rules("llama", jax.make_mesh((1,), ("data",))) == {"batch": "data"}
    with pytest.raises(mg.ShardingError, match="knows the zoo's families"):
        mg.models.sharding_rules("t5")
    # a mesh of other axis names, or a misspelt one: every rule (or the model's) was
    # silently left out, and the model compiled replicated
    with pytest.raises(mg.ShardingError, match=r"include neither the data axis 'data' nor the "
                                               r"model axis 'model'.*data='dp', model_axis='tp'"):
        mg.models.sharding_rules(graph, jax.make_mesh((1, 1), ("dp", "tp")))
    with pytest.raises(mg.ShardingError, match=r"no axis 'model' \(model_axis=\); did you mean "
                                               r"'modle'"):
        mg.models.sharding_rules(graph, jax.make_mesh((1, 1), ("data", "modle")))
    assert mg.models.sharding_rules(graph, jax.make_mesh((1, 1), ("dp", "tp")), data="dp",
                                    model_axis="tp")["mlp"] == "tp"


def test_few_key_value_heads_are_replicated(monkeypatch):
    """Two key/value heads on a model axis of 4: the kv_heads rule is left out."""
    class FourWide:
        shape = {"data": 1, "model": 4}

    graph = mg.models.llama(SMALL["llama"])
    rules = mg.models.sharding_rules(graph, FourWide())
    assert "kv_heads" not in rules and rules["heads"] == "model"
    assert "kv_heads" in mg.models.sharding_rules(mg.models.llama(dict(SMALL["llama"], num_key_value_heads=4)),
                                                  FourWide())


def test_a_rule_for_an_axis_no_layer_has_is_an_error_with_near_names(mesh):
    """The user's call: {"mpl": "model"} (a typo) replicated everything without a word."""
    graph = mg.models.gpt2(SMALL["gpt2"])
    with pytest.raises(mg.ShardingError, match=r"rules\['mpl'\].*did you mean 'mlp'\?"):
        mg.compile(graph, mesh=mesh, rules={"mpl": "model"})


def test_a_misspelled_mesh_axis_names_the_mesh_axes(mesh):
    graph = mg.models.gpt2(SMALL["gpt2"])
    with pytest.raises(mg.ShardingError, match=r"expected: mesh axes 'data', 'model' \(or None\)"):
        mg.compile(graph, mesh=mesh, rules={"mlp": "modle"})


def test_builders_take_per_layer_axes(mesh):
    """The user's fix the error message suggested: override the attention's axes."""
    graph = mg.models.llama(SMALL["llama"], axes={"self_attn": {"key/kernel": ("embed", None, "kv"),
                                                                "value/kernel": ("embed", None, "kv")},
                                                  "mlp.*_proj": {"kernel": (None, None)}})
    model = mg.compile(graph, mesh=mesh, rules={"heads": "model", "kv_heads": "model", "mlp": "model"})
    layer = model.sharding.params["model.layers.1"]
    assert layer["self_attn"]["key"]["kernel"].spec == P(None, None, None)
    assert layer["self_attn"]["query"]["kernel"].spec == P(None, "model", None)
    assert layer["mlp.down_proj"]["kernel"].spec == P(None, None)
    with pytest.raises(mg.ConfigError, match=r"axes= names 'self_atn', which matches no layer.*'self_attn'"):
        mg.models.llama(SMALL["llama"], axes={"self_atn": {"key/kernel": ("embed", None, "kv")}})


# --- loaders: folders, PyTorch files without torch, mismatches ------------------------------


def test_a_torchvision_pth_loads_without_torch(tmp_path):
    """The user's call: a torchvision .pth file (it read as a safetensors header claiming
    578712552184433488 bytes)."""
    import sys

    graph = mg.models.resnet18(num_classes=10, width=4)
    params, state = mg.compile(graph).init(jax.random.key(0))
    sd = mg.models.to_state_dict(graph, params, state)
    sd = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}  # int64 in torch's
    write_torch_file(tmp_path / "resnet18.pth", sd)
    assert "torch" not in sys.modules
    loaded_params, loaded_state = mg.models.load_state_dict(graph, tmp_path / "resnet18.pth")
    for path, value in _leaves(params).items():
        np.testing.assert_array_equal(_leaves(loaded_params)[path], value, err_msg=path)
    np.testing.assert_array_equal(loaded_state["bn1"]["var"], state["bn1"]["var"])
    assert "torch" not in sys.modules


def test_a_pytorch_model_bin_in_a_checkpoint_folder(tmp_path):
    """A Hugging Face folder of the PyTorch era: config.json and pytorch_model.bin; the
    builder and load_state_dict both take the folder."""
    config = dict(tf.gpt2_config(), model_type="gpt2")
    (tmp_path / "config.json").write_text(json.dumps(config))
    sd = tf.state_dict("gpt2", tf.gpt2_config())
    write_torch_file(tmp_path / "pytorch_model.bin", {f"transformer.{k}": v for k, v in sd.items()})
    graph = mg.models.gpt2(tmp_path)
    params, state = mg.models.load_state_dict(graph, tmp_path)
    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    logits, _ = mg.compile(graph).apply(params, state, ids, inference_mode=True)
    np.testing.assert_allclose(logits, tf.forward("gpt2", sd, tf.gpt2_config(), ids)[0], rtol=1e-4, atol=1e-4)


class _Marker:
    ran = False


def mark_ran(*args):
    _Marker.ran = True
    return 0


@pytest.mark.parametrize("target", ["os system", "builtins eval", "test_zoo_train mark_ran"])
def test_a_hostile_pickle_is_refused_and_runs_nothing(tmp_path, target):
    """A pickle whose GLOBAL + REDUCE would call os.system (or eval, or a function of
    this module that records the call): refused when the global is looked up."""
    module, name = target.split()
    hostile = (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n"
               + b"X\x0b\x00\x00\x00touch pwned\x85R.")
    write_torch_file(tmp_path / "evil.pth", {}, pickle_bytes=hostile)
    graph = mg.models.resnet18(num_classes=10, width=4)
    with pytest.raises(mg.SerializationError, match=rf"refers to {module}\.{name}.*nothing in it was run"):
        mg.models.load_state_dict(graph, tmp_path / "evil.pth")
    assert not _Marker.ran and not (tmp_path / "pwned").exists()


def test_damaged_and_legacy_pytorch_files_are_named(tmp_path):
    graph = mg.models.resnet18(num_classes=10, width=4)
    (tmp_path / "old.pth").write_bytes(b"\x80\x02\x8a\x0alegacy torch pickle")
    with pytest.raises(mg.SerializationError, match="old.pth: not a zip archive"):
        mg.models.load_state_dict(graph, tmp_path / "old.pth")
    write_torch_file(tmp_path / "short.pth", {"w": np.ones(4, np.float32)})
    import zipfile

    with zipfile.ZipFile(tmp_path / "short.pth") as z, zipfile.ZipFile(tmp_path / "cut.pth", "w") as out:
        for item in z.namelist():
            data = z.read(item)
            out.writestr(item, data[:8] if item.endswith("data/0") else data)
    with pytest.raises(mg.SerializationError, match="storage '0' of 'w' holds 8 bytes"):
        mg.models.load_state_dict(graph, tmp_path / "cut.pth")


def test_a_name_mismatch_lists_missing_and_unexpected_side_by_side():
    config = tf.llama_config()
    sd = tf.state_dict("llama", config)
    renamed = {k.replace("mlp.up_proj", "mlp.up"): v for k, v in sd.items()}
    with pytest.raises(mg.SerializationError) as info:
        mg.models.load_state_dict(mg.models.llama(config), renamed)
    lines = str(info.value).splitlines()
    assert lines[1].split() == ["missing", "(2)", "unexpected", "(2)"]
    assert lines[2].split() == ["'model.layers.0.mlp.up_proj.weight'", "'model.layers.0.mlp.up.weight'"]


def test_mg_load_takes_a_folder(tmp_path):
    """The user's call: mg.load(folder) raised IsADirectoryError."""
    graph, params, state = _init("gpt2")
    (tmp_path / "run").mkdir()
    mg.save(tmp_path / "run" / "model.mlg", graph, params, state)
    loaded, _, _ = mg.load(tmp_path / "run")
    assert loaded == graph
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    with pytest.raises(mg.SerializationError, match=r"a Hugging Face checkpoint folder.*mg.models.<model_type>"):
        mg.load(tmp_path / "hf")
    with pytest.raises(mg.SerializationError, match="no mlaxgraph model file"):
        mg.load(tmp_path / "hf" / "..")


# --- fit: epochs to run now, initial_epoch to resume ----------------------------------------


def test_fit_runs_epochs_more_after_manual_steps_and_resumes_with_initial_epoch():
    """The user's calls: fit(epochs=3) after 21 manual steps ran only epoch 3; a second
    call ran nothing and returned {'epoch': []} without a word."""
    import warnings

    from mlaxgraph.examples import mlp

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(70, 4)).astype(np.float32), rng.integers(0, 3, 70).astype(np.int32)
    trainer = mg.train.Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    for i in range(21):  # 3 epochs of 7 steps of 10
        ts, _ = trainer.train_step(ts, x[(i % 7) * 10:(i % 7) * 10 + 10], y[(i % 7) * 10:(i % 7) * 10 + 10])
    ts, history = trainer.fit(ts, (x, y), epochs=3, batch_size=10, progress=False)
    assert history["epoch"] == [4, 5, 6] and int(ts.step) == 21 + 21
    ts, history = trainer.fit(ts, (x, y), epochs=3, batch_size=10, progress=False)
    assert history["epoch"] == [7, 8, 9] and int(ts.step) == 63
    ts, history = trainer.fit(ts, (x, y), epochs=10, initial_epoch=9, batch_size=10, progress=False)
    assert history["epoch"] == [10] and int(ts.step) == 70
    with pytest.warns(UserWarning, match="nothing to do"):
        ts, history = trainer.fit(ts, (x, y), epochs=10, initial_epoch=10, batch_size=10, progress=False)
    assert history == {"epoch": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ts, history = trainer.fit(ts, (x, y), epochs=1, batch_size=10, progress=False)
    assert history["epoch"] == [11]


def test_the_documented_rules_give_row_parallel_down_projections(mesh):
    """The user's call: the rules docs/sharding.md shows gave GPT-2's mlp.c_proj and
    Llama's mlp.down_proj P(None, 'model'), column-parallel."""
    documented = {"batch": "data", "mlp": "model", "heads": "model"}
    gpt2 = mg.compile(mg.models.gpt2(SMALL["gpt2"]), mesh=mesh, rules=documented)
    assert gpt2.sharding.params["h.0"]["mlp.c_proj"]["kernel"].spec == P("model", None)
    llama = mg.compile(mg.models.llama(SMALL["llama"]), mesh=mesh, rules=documented)
    layer = llama.sharding.params["model.layers.0"]
    assert layer["mlp.down_proj"]["kernel"].spec == P("model", None)
    assert layer["self_attn"]["out"]["kernel"].spec == P("model", None, None)
    assert layer["self_attn"]["key"]["kernel"].spec == P(None, None, None)  # kv_heads: no rule


def test_demo_of_a_checkpoint_with_a_short_position_table(tmp_path, capsys):
    """`mlaxgraph demo --model gpt2` ran a forward pass at seq 128 on an n_positions=64
    checkpoint (all NaN); it runs at the table's length now."""
    from mlaxgraph.cli.main import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 64, "n_layer": 1,
                                                      "n_embd": 32, "n_head": 4, "vocab_size": 50}))
    assert main(["demo", "--model", "gpt2", "--config", str(tmp_path / "config.json"),
                 "--out", str(tmp_path / "out")]) == 0
    assert "one forward pass at batch 1, seq 64: outputs (1, 64, 50)" in capsys.readouterr().out
