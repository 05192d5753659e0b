"""The model zoo (``mg.models``) against independent float64 NumPy implementations of
each architecture written from the original code's formulas (``_zoo_transformers``,
``_zoo_cnn``): state dicts with the original names and layouts are written to
safetensors files, loaded without torch, run, compared; and back (``to_state_dict``)
exactly. Then the errors: missing, extra, mis-shaped and non-float weights, tied
copies that differ, damaged shard indexes and config fields a builder does not
support."""

from __future__ import annotations

import functools
import json
import os

import _helpers
import _zoo_cnn as cnn
import _zoo_transformers as tf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import mlaxgraph as mg

RNG = np.random.default_rng(0)


def ids(batch=2, length=7, vocab=50, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)


def bert_inputs():
    mask = np.ones((2, 7), np.int32)
    mask[1, 4:] = 0  # the second sequence is padded after 4 tokens
    return ids(), ids(vocab=2, seed=1), mask


def pixels(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# (builder, its args, a state dict, the reference forward, the inputs): small configs.
TEXT = {
    "gpt2": (lambda: mg.models.gpt2(tf.gpt2_config()), tf.gpt2_config(), lambda: (ids(),)),
    "gpt2_relu_inner": (lambda: mg.models.gpt2(tf.gpt2_config(activation_function="relu", n_inner=40)),
                        tf.gpt2_config(activation_function="relu", n_inner=40), lambda: (ids(),)),
    "bert": (lambda: mg.models.bert(tf.bert_config()), tf.bert_config(), bert_inputs),
    "vit": (lambda: mg.models.vit(tf.vit_config()), tf.vit_config(), lambda: (pixels(2, 3, 16, 16),)),
    "llama": (lambda: mg.models.llama(tf.llama_config()), tf.llama_config(), lambda: (ids(),)),
    "llama_tied_biased": (lambda: mg.models.llama(tf.llama_config(tie_word_embeddings=True, attention_bias=True,
                                                                  mlp_bias=True, head_dim=16)),
                          tf.llama_config(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                          head_dim=16),
                          lambda: (ids(),)),
}


def arch(case: str) -> str:
    return case.split("_")[0]


# atol relative to the output's magnitude (at least 1): the architectures' outputs differ
# in scale by orders of magnitude.
close = functools.partial(_helpers.close, rtol=2e-5, atol=2e-5, scale=1.0)


def check_round_trip(graph, params, state, sd):
    back = mg.models.to_state_dict(graph, params, state)
    assert set(back) == set(sd)
    for name, value in sd.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value, err_msg=name)


@pytest.mark.parametrize("case", sorted(TEXT))
def test_transformers_match_numpy_from_a_safetensors_file(case, tmp_path):
    build, config, inputs = TEXT[case]
    sd = tf.state_dict(arch(case), config)
    path = tmp_path / "model.safetensors"
    save_file(sd, str(path))
    graph = build()
    params, state = mg.models.load_state_dict(graph, str(path))
    xs = inputs()
    got, _ = mg.compile(graph).apply(params, state, *xs, inference_mode=True)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = tf.forward(arch(case), sd, config, *xs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        close(g, w)
    check_round_trip(graph, params, state, sd)


@pytest.mark.parametrize("depth", [18, 34, 50])
def test_resnets_match_torchvisions_formulas(depth):
    sd = cnn.resnet_state_dict(depth, num_classes=10, width=8)
    graph = getattr(mg.models, f"resnet{depth}")(num_classes=10, image_size=32, width=8)
    params, state = mg.models.load_state_dict(graph, sd)
    x = pixels(2, 32, 32, 3)
    got, _ = mg.compile(graph).apply(params, state, x, inference_mode=True)
    close(got, cnn.resnet_forward(sd, depth, x))
    check_round_trip(graph, params, state, sd)
    # torchvision's names read like the code: blocks layer1.0 ..., a stem conv1, a head fc
    names = [node.name for node in graph.nodes]
    assert names[:3] == ["images", "conv1", "bn1"] and names[-2:] == ["avgpool", "fc"]
    assert [n for n in names if n.startswith("layer4.")] == [f"layer4.{i}" for i in range(2 if depth == 18 else 3)]


def test_resnet_channel_first_equals_channel_last():
    sd = cnn.resnet_state_dict(18, num_classes=10, width=8)
    x = pixels(2, 32, 32, 3)
    outs = []
    for data_format, xs in (("NHWC", x), ("NCHW", x.transpose(0, 3, 1, 2))):
        graph = mg.models.resnet18(10, data_format, image_size=32, width=8)
        params, state = mg.models.load_state_dict(graph, sd)
        outs.append(np.asarray(mg.compile(graph).apply(params, state, xs, inference_mode=True)[0]))
        check_round_trip(graph, params, state, sd)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-4)


def test_unet_matches_the_pytorch_unet_formulas():
    sd = cnn.unet_state_dict(3, 2, width=4, depth=2)
    graph = mg.models.unet(3, 2, width=4, depth=2, image_size=16)
    params, state = mg.models.load_state_dict(graph, sd)
    x = pixels(2, 16, 16, 3)
    got, _ = mg.compile(graph).apply(params, state, x, inference_mode=True)
    close(got, cnn.unet_forward(sd, x, depth=2))
    check_round_trip(graph, params, state, sd)
    assert [n.name for n in graph.nodes] == ["images", "inc", "down1", "down2", "up1", "up2", "outc"]


def test_unet_takes_any_image_size_as_the_pytorch_unet_does():
    """image_size=None (the default): height and width symbolic. Odd and even sizes,
    and sizes the pools do not divide (the upsampled maps padded to the skips' sizes),
    equal a build for that fixed size and the NumPy reference."""
    sd = cnn.unet_state_dict(3, 2, width=4, depth=2)
    graph = mg.models.unet(3, 2, width=4, depth=2)
    assert str(graph.output_specs[0]) == "f32[batch,height,width,2]"
    params, state = mg.models.load_state_dict(graph, sd)
    model = mg.compile(graph)
    for height, width in ((13, 13), (16, 16), (13, 18)):
        x = pixels(1, height, width, 3)
        got, _ = model.apply(params, state, x, inference_mode=True)
        close(got, cnn.unet_forward(sd, x, depth=2))
        if height == width:
            fixed = mg.models.unet(3, 2, width=4, depth=2, image_size=height)
            want, _ = mg.compile(fixed).apply(*mg.models.load_state_dict(fixed, sd), x, inference_mode=True)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_folder_of_shards_with_its_index(tmp_path):
    config = tf.gpt2_config()
    sd = tf.state_dict("gpt2", config)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, members in shards.items():
        save_file({n: sd[n] for n in members}, str(tmp_path / shard))
    index = {"metadata": {}, "weight_map": {n: shard for shard, members in shards.items() for n in members}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    graph = mg.models.gpt2(config)
    params, state = mg.models.load_state_dict(graph, str(tmp_path))
    check_round_trip(graph, params, state, sd)
    # an index naming a file outside the folder is refused before anything is read
    index["weight_map"][names[0]] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(mg.SerializationError, match="not a file name in the folder"):
        mg.models.load_state_dict(graph, str(tmp_path))


def test_a_missing_shard_a_truncated_file_odd_names_and_non_float_dtypes_are_named(tmp_path):
    from _torch_file import write_torch_file

    config = tf.gpt2_config()
    sd = tf.state_dict("gpt2", config)
    graph = mg.models.gpt2(config)
    names = sorted(sd)
    save_file({n: sd[n] for n in names[1::2]}, str(tmp_path / "b.safetensors"))
    index = {"weight_map": {n: "ab"[i % 2] + ".safetensors" for i, n in enumerate(names)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(mg.SerializationError, match=r"shard 'a.safetensors' is not in the folder"):
        mg.models.load_state_dict(graph, str(tmp_path))
    path = str(tmp_path / "pytorch_model.bin")
    write_torch_file(path, sd)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-200])
    with pytest.raises(mg.SerializationError, match="cut short or damaged"):
        mg.models.load_state_dict(graph, path)
    with pytest.raises(mg.SerializationError, match=r"names are strings.*got 3 \(int\)"):
        mg.models.load_state_dict(graph, {**sd, 3: sd[names[0]]})
    for dtype in ("int8", "bool", "floaty", "complex64"):
        with pytest.raises(mg.ConfigError, match=f"float dtype.*got '{dtype}'"):
            mg.models.load_state_dict(graph, sd, dtype=dtype)
    params, state = mg.models.load_state_dict(graph, sd, dtype="bfloat16")
    with pytest.raises(mg.ConfigError, match="to_state_dict: dtype is the dtype of the floating"):
        mg.models.to_state_dict(graph, params, state, dtype="int8")


def test_lm_head_files_with_prefixes_buffers_and_tied_copies():
    """GPT2LMHeadModel's state dict: ``transformer.`` before each name, the tied
    ``lm_head.weight`` and the causal-mask buffers; BertForPreTraining's: ``bert.``
    and the pretraining heads, which only ``strict=False`` ignores."""
    config = tf.gpt2_config()
    sd = tf.state_dict("gpt2", config)
    graph = mg.models.gpt2(config)
    full = {f"transformer.{k}": v for k, v in sd.items()}
    full["lm_head.weight"] = sd["wte.weight"].copy()
    full["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    params, state = mg.models.load_state_dict(graph, full)
    check_round_trip(graph, params, state, sd)
    full["lm_head.weight"] = sd["wte.weight"] + 1
    with pytest.raises(mg.SerializationError, match="'lm_head.weight' differs from 'wte.weight'"):
        mg.models.load_state_dict(graph, full)

    config = tf.bert_config()
    sd = tf.state_dict("bert", config)
    graph = mg.models.bert(config)
    pretraining = {f"bert.{k}": v for k, v in sd.items()}
    pretraining["cls.predictions.bias"] = np.zeros(50, np.float32)
    with pytest.raises(mg.SerializationError, match=r"(?s)does not hold.*strict=False.*unexpected \(1\)\n +'cls.predictions.bias'"):
        mg.models.load_state_dict(graph, pretraining)
    params, state = mg.models.load_state_dict(graph, pretraining, strict=False)
    check_round_trip(graph, params, state, sd)


def test_a_task_models_head_without_the_prefix_loads_beside_the_body():
    """BertForSequenceClassification's state dict: the body under ``bert.``, the head
    ``classifier.*`` without it, read into the zoo graph with the classifier added."""
    from mlaxgraph import ops

    config = tf.bert_config()
    sd = tf.state_dict("bert", config)
    graph = mg.models.bert(config).insert_after(
        "pooler.activation", lambda h: ops.Linear(3, name="classifier")(h))
    rng = np.random.RandomState(0)
    weight = rng.randn(3, config["hidden_size"]).astype(np.float32)
    bias = rng.randn(3).astype(np.float32)
    task = {**{f"bert.{k}": v for k, v in sd.items()}, "classifier.weight": weight, "classifier.bias": bias}
    params, state = mg.models.load_state_dict(graph, task)
    np.testing.assert_array_equal(params["classifier"]["kernel"], weight.T)   # torch's (out, in)
    np.testing.assert_array_equal(params["classifier"]["bias"], bias)
    body, _ = mg.models.load_state_dict(mg.models.bert(config), sd)
    for a, b in zip(jax.tree.leaves(body), jax.tree.leaves({k: v for k, v in params.items() if k != "classifier"})):
        np.testing.assert_array_equal(a, b)
    ids = jnp.asarray(rng.randint(0, config["vocab_size"], (2, 5)), jnp.int32)
    args = (ids, jnp.zeros_like(ids), jnp.ones_like(ids))
    pooled = mg.compile(mg.models.bert(config)).apply(body, state, *args, inference_mode=True)[0][1]
    logits = mg.compile(graph).apply(params, state, *args, inference_mode=True)[0][1]
    np.testing.assert_allclose(logits, np.asarray(pooled) @ weight.T + bias, rtol=1e-5, atol=1e-5)
    with pytest.raises(mg.SerializationError, match=r"(?s)missing 1 weight.*'bert.classifier.bias'"):
        mg.models.load_state_dict(graph, {k: v for k, v in task.items() if k != "classifier.bias"})


def test_missing_extra_misshaped_and_integer_weights_are_named():
    config = tf.llama_config()
    sd = tf.state_dict("llama", config)
    graph = mg.models.llama(config)
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(mg.SerializationError, match=r"(?s)missing 1 weight\(s\).*\n  'model.layers.1.mlp.up_proj.weight'"):
        mg.models.load_state_dict(graph, missing)
    with pytest.raises(mg.SerializationError, match=r"(?s)does not hold.*'model.layers.9.extra.weight'"):
        mg.models.load_state_dict(graph, {**sd, "model.layers.9.extra.weight": np.zeros(3, np.float32)})
    bad = dict(sd, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)})
    with pytest.raises(mg.SerializationError,
                       match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(32, 32\); "
                             r"layer 'model.layers.0/self_attn' .* needs \(16, 32\)"):
        mg.models.load_state_dict(graph, bad)
    ints = dict(sd, **{"model.norm.weight": np.ones(32, np.int64)})
    with pytest.raises(mg.SerializationError, match="'model.norm.weight' is int64"):
        mg.models.load_state_dict(graph, ints)
    with pytest.raises(mg.SerializationError, match="a mapping of names to arrays"):
        mg.models.load_state_dict(graph, 42)


def test_bfloat16_files_keep_their_dtype_when_asked(tmp_path):
    config = tf.gpt2_config()
    sd = {k: v.astype(ml_dtypes.bfloat16) for k, v in tf.state_dict("gpt2", config).items()}
    save_file(sd, str(tmp_path / "bf16.safetensors"))
    graph = mg.models.gpt2(config)
    params, _ = mg.models.load_state_dict(graph, str(tmp_path / "bf16.safetensors"), dtype=None)
    assert {a.dtype for a in jax.tree.leaves(params)} == {np.dtype(jnp.bfloat16)}
    check_round_trip(graph, params, {}, sd)
    params, _ = mg.models.load_state_dict(graph, str(tmp_path / "bf16.safetensors"))
    assert {a.dtype for a in jax.tree.leaves(params)} == {np.dtype(jnp.float32)}
    np.testing.assert_array_equal(params["wte"]["embedding"], sd["wte.weight"].astype(np.float32))


@pytest.mark.parametrize("build, field, message", [
    (lambda: mg.models.gpt2({"add_cross_attention": True}), "add_cross_attention", "not supported"),
    (lambda: mg.models.gpt2({"activation_function": "mish"}), "activation_function", "'mish' is not supported"),
    (lambda: mg.models.llama({"rope_scaling": {"rope_type": "longrope", "factor": 8.0}}), "rope_scaling",
     "not supported"),
    (lambda: mg.models.bert({"position_embedding_type": "relative_key"}), "position_embedding_type",
     "not supported"),
    (lambda: mg.models.vit({"image_size": 30, "patch_size": 16}), "patch_size", "does not divide"),
    (lambda: mg.models.gpt2({"n_head": 0}), "n_head", "positive int"),
    (lambda: mg.models.resnet50(num_classes=0), "num_classes", "positive int"),
    (lambda: mg.models.unet(image_size=12, depth=4), "image_size", "less than 2 \\*\\* depth = 16"),
    (lambda: mg.models.gpt2([1, 2]), "config", "a dict of the original config's fields"),
])
def test_config_fields_a_builder_cannot_honour_are_config_errors(build, field, message):
    with pytest.raises(mg.ConfigError, match=message) as info:
        build()
    assert field in str(info.value)


def test_a_config_json_path_and_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**tf.gpt2_config(), "architectures": ["GPT2LMHeadModel"],
                                                      "bos_token_id": 0, "n_inner": None}))
    assert mg.models.gpt2(str(tmp_path / "config.json")) == mg.models.gpt2(tf.gpt2_config())


def test_gpt2_small_has_its_published_size_and_compiles_scanned_and_not():
    graph = mg.models.gpt2()
    for scan in (True, False):
        model = mg.compile(graph, scan_blocks=scan)
        params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
        assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params)) == 124_439_808
        tokens = jax.ShapeDtypeStruct((1, 32), jnp.int32)
        compiled = jax.jit(model.apply_fn, static_argnames="inference_mode").lower(
            params, state, tokens, inference_mode=True).compile()
        assert compiled.out_info[0].shape == (1, 32, 50257)
    assert [n.name for n in mg.compile(graph, scan_blocks="always").graph.nodes if n.op.op_name == "scan"] == ["h.0..h.11"]


@pytest.mark.parametrize("case", ["gpt2", "bert", "llama"])
def test_scanned_equals_unscanned(case):
    build, config, inputs = TEXT[case]
    graph = build()
    params, state = mg.models.load_state_dict(graph, tf.state_dict(arch(case), config))
    scanned = mg.compile(graph, scan_blocks="always")
    assert any(n.op.op_name == "scan" for n in scanned.graph.nodes)
    xs = inputs()
    want, _ = mg.compile(graph).apply(params, state, *xs, inference_mode=True)
    got, _ = scanned.apply(*scanned.stack_weights(params, state), *xs, inference_mode=True)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_graph_of_ones_own_named_after_torch_modules_round_trips():
    """Outside the zoo, any graph whose layers carry PyTorch module names exchanges
    state dicts with PyTorch's default layouts (Linear weights (out, in))."""
    from mlaxgraph import ops

    x = mg.Input(("batch", 4), name="x")
    y = ops.Linear(2, name="classifier.1")(ops.relu(ops.Linear(3, name="classifier.0")(x)))
    graph = mg.Graph(x, y, name="mine")
    params, state = mg.compile(graph).init(jax.random.key(0))
    sd = mg.models.to_state_dict(graph, params, state)
    assert {k: v.shape for k, v in sd.items()} == {"classifier.0.weight": (3, 4), "classifier.0.bias": (3,),
                                                  "classifier.1.weight": (2, 3), "classifier.1.bias": (2,)}
    np.testing.assert_array_equal(sd["classifier.0.weight"], np.asarray(params["classifier.0"]["kernel"]).T)
    back, _ = mg.models.load_state_dict(graph, sd)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    # a layer without a PyTorch layout is named
    lstm = mg.Graph(x := mg.Input(("batch", 3, 4), name="x"), ops.LSTM(5, name="rnn")(x), name="r")
    with pytest.raises(mg.SerializationError, match="layer 'rnn' \\(lstm\\) has no PyTorch layout"):
        mg.models.to_state_dict(lstm, *mg.compile(lstm).init(jax.random.key(0)))


def test_the_zoo_files_are_not_torch_pickles(tmp_path):
    """Loading reads safetensors only: a pickle named .safetensors is a clear error."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x80\x04\x95" + os.urandom(64))
    with pytest.raises(mg.SerializationError):
        mg.models.load_state_dict(mg.models.gpt2(tf.gpt2_config()), str(path))


def test_gpt2_small_cost_table_counts_past_two_to_the_31():
    """The tied head of GPT-2 small at 128 tokens is 9.9 GFLOPs: formulas evaluate in
    64 bits (JAX keeps a term's coefficient as an int32, which wrapped around)."""
    table = mg.compile(mg.models.gpt2()).cost_table(xla=False, inference_mode=True, batch=1, seq=128)
    head = table["wte@1"]
    assert head.flops == 2 * 128 * 768 * 50257
    assert head.training_flops > head.flops > 2**32
    assert table.params == 124_439_808


def test_demo_model_writes_its_views_with_a_local_checkpoint(tmp_path, capsys):
    """``mlaxgraph demo --model llama --weights DIR``: the config.json beside the
    weights is read, the weights loaded, and the summary, drawing, explorer page, cost
    table and first block's HLO written."""
    from mlaxgraph.cli.main import main

    config = tf.llama_config()
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    sd = tf.state_dict("llama", config)
    save_file(sd, str(folder / "model.safetensors"))
    out = tmp_path / "out"
    assert main(["demo", "--model", "llama", "--weights", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "model.layers.1" in printed and f"weights: {folder}" in printed
    assert "outputs (1, 128, 50)" in printed
    written = sorted(p.name for p in out.iterdir())  # make test installs Graphviz: an SVG
    assert written == ["llama.cost.txt", "llama.html", "llama.model.layers.0.hlo.txt", "llama.svg"]
    hlo = (out / "llama.model.layers.0.hlo.txt").read_text()
    assert "model.layers.0/self_attn:" in hlo and "dot" in hlo
    cost = (out / "llama.cost.txt").read_text()
    assert "model.layers.0/mlp.gate_proj" in cost


def test_demo_weights_without_a_model_is_a_usage_error(capsys):
    from mlaxgraph.cli.main import main

    assert main(["demo", "--weights", "x.safetensors"]) == 2
    assert "--weights and --config go with --model" in capsys.readouterr().err


def test_task_model_files_legacy_layer_norm_names_and_no_pooler():
    """ViTForImageClassification's file: ``vit.`` names, no pooler, a classifier head
    (ignored with strict=False), into ``vit(add_pooling_layer=False)``; BERT's original
    checkpoints name LayerNorm's weights ``gamma`` and ``beta``."""
    config = tf.vit_config()
    sd = tf.state_dict("vit", config)
    task = {f"vit.{k}": v for k, v in sd.items() if not k.startswith("pooler.")}
    task["classifier.weight"] = np.zeros((10, 32), np.float32)
    task["classifier.bias"] = np.zeros(10, np.float32)
    graph = mg.models.vit(config, add_pooling_layer=False)
    assert len(graph.outputs) == 1
    params, state = mg.models.load_state_dict(graph, task, strict=False)
    x = pixels(2, 3, 16, 16)
    hidden, _ = mg.compile(graph).apply(params, state, x, inference_mode=True)
    close(hidden, tf.forward("vit", sd, config, x)[0])

    config = tf.bert_config()
    sd = tf.state_dict("bert", config)
    legacy = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in sd.items()}
    graph = mg.models.bert(config)
    params, state = mg.models.load_state_dict(graph, legacy)
    check_round_trip(graph, params, state, sd)  # written back in today's names


#: transformers 5.x's ViTModel().state_dict() names (5.23, read from a ViTModel built
#: there) for the files' names, which save_pretrained still writes.
VIT_5X = (("encoder.layer.{i}.attention.attention.query.", "layers.{i}.attention.q_proj."),
          ("encoder.layer.{i}.attention.attention.key.", "layers.{i}.attention.k_proj."),
          ("encoder.layer.{i}.attention.attention.value.", "layers.{i}.attention.v_proj."),
          ("encoder.layer.{i}.attention.output.dense.", "layers.{i}.attention.o_proj."),
          ("encoder.layer.{i}.intermediate.dense.", "layers.{i}.mlp.fc1."),
          ("encoder.layer.{i}.output.dense.", "layers.{i}.mlp.fc2."),
          ("encoder.layer.{i}.layernorm_before.", "layers.{i}.layernorm_before."),
          ("encoder.layer.{i}.layernorm_after.", "layers.{i}.layernorm_after."))


def _in_memory_5x(name: str, layers: int) -> str:
    for i in range(layers):
        for files, memory in VIT_5X:
            if name.startswith(files.format(i=i)):
                return memory.format(i=i) + name[len(files.format(i=i)):]
    return name


def test_transformers_5x_in_memory_state_dict_names_load_as_the_files_do():
    """ViTModel().state_dict() in transformers 5.x names the layers ``layers.N`` with
    ``attention.q_proj`` ... ``o_proj`` and ``mlp.fc1`` / ``fc2``; such a dict (and
    ViTForImageClassification's, under ``vit.``) loads to the same weights as the
    files' names, and an unknown name in it is still refused."""
    config = tf.vit_config()
    sd = tf.state_dict("vit", config)
    layers = config["num_hidden_layers"]
    memory = {_in_memory_5x(k, layers): v for k, v in sd.items()}
    assert "layers.0.attention.q_proj.weight" in memory and "layers.0.mlp.fc1.bias" in memory
    assert not any(k.startswith("encoder.") for k in memory)
    graph = mg.models.vit(config)
    want = mg.models.load_state_dict(graph, sd)
    got = mg.models.load_state_dict(graph, memory)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    x = pixels(2, 3, 16, 16)
    out, _ = mg.compile(graph).apply(*got, x, inference_mode=True)
    close(out[0], tf.forward("vit", sd, config, x)[0])
    check_round_trip(graph, *got, sd)  # written back in the files' names
    # ViTForImageClassification in memory: vit.layers.N..., a classifier, no pooler
    task = {f"vit.{k}": v for k, v in memory.items() if not k.startswith("pooler.")}
    task["classifier.weight"] = np.zeros((10, 32), np.float32)
    headless = mg.models.vit(config, add_pooling_layer=False)
    params, _ = mg.models.load_state_dict(headless, task, strict=False)
    np.testing.assert_array_equal(params["encoder.layer.0"]["attention"]["query"]["kernel"],
                                  want[0]["encoder.layer.0"]["attention"]["query"]["kernel"])
    memory["layers.0.attention.x_proj.weight"] = memory.pop("layers.0.attention.q_proj.weight")
    with pytest.raises(mg.SerializationError, match="x_proj") as info:
        mg.models.load_state_dict(graph, memory)
    assert "encoder.layer.0.attention.attention.query.weight" in str(info.value)


def test_stacked_weights_are_refused_with_the_way_out():
    config = tf.gpt2_config()
    graph = mg.models.gpt2(config)
    params, state = mg.models.load_state_dict(graph, tf.state_dict("gpt2", config))
    scanned = mg.compile(graph, scan_blocks="always")
    with pytest.raises(mg.SerializationError, match=r"stacked weights: model.unstack_weights\(params, state\) first"):
        mg.models.to_state_dict(graph, *scanned.stack_weights(params, state))


def test_resnet_training_updates_batch_norm_statistics_as_pytorch():
    """A training-mode pass updates bn1's running statistics as PyTorch's BatchNorm2d
    (momentum 0.1): the batch mean, and the unbiased batch variance."""
    sd = cnn.resnet_state_dict(18, num_classes=10, width=8)
    graph = mg.models.resnet18(10, image_size=32, width=8)
    params, state = mg.models.load_state_dict(graph, sd)
    x = pixels(4, 32, 32, 3)
    _, new_state = mg.compile(graph).apply(params, state, x, inference_mode=False)
    h = cnn.conv2d(x.astype(np.float64), sd["conv1.weight"].astype(np.float64), stride=2, padding=3)
    mean, var = h.mean(axis=(0, 1, 2)), h.var(axis=(0, 1, 2), ddof=1)
    np.testing.assert_allclose(new_state["bn1"]["mean"], 0.9 * sd["bn1.running_mean"] + 0.1 * mean,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new_state["bn1"]["var"], 0.9 * sd["bn1.running_var"] + 0.1 * var,
                               rtol=1e-5, atol=1e-5)
