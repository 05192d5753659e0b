"""LoRA adapter folders against PEFT itself (``make test-torch``): a folder PEFT's
``save_pretrained`` wrote is read by ``mg.lora_from_peft`` and
``mg.models.load_state_dict(..., adapter=folder)``, and a folder
``mg.models.save_adapter`` wrote is loaded by ``PeftModel.from_pretrained``; each time
the adapted model's logits equal PEFT's on the same base weights (transformers' GPT-2
with its fused Conv1D ``c_attn`` and the tied embedding, Llama with grouped-query
attention, rsLoRA, rank and alpha patterns and ``modules_to_save``), and
``mg.merge_lora`` equals PEFT's ``merge_and_unload``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mlaxgraph as mg

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

GPT2 = dict(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4)
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False)


def _base(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
        graph = mg.models.gpt2(GPT2)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
        graph = mg.models.llama(LLAMA)
    state_dict = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return model.eval(), graph, state_dict


def _ids(seed=1, shape=(2, 9)):
    return np.random.default_rng(seed).integers(0, 96, shape)


def _theirs(model, ids):
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def _ours(graph, params, state, ids):
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(ids, jnp.int32),
                                     inference_mode=True)
    return np.asarray(out)


def _close(ours, theirs):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(theirs).max()))


def _nonzero_b(params):
    """The adapters' B drawn away from zero (init starts them at zero), so the adapters
    change the outputs the comparison reads."""
    key = iter(jax.random.split(jax.random.key(3), 64))
    return jax.tree_util.tree_map_with_path(
        lambda path, w: (0.3 * jax.random.normal(next(key), w.shape, w.dtype)
                         if ".lora_B" in jax.tree_util.keystr(path) else w), params)


def _randomize_saved_modules(peft_model):
    """PEFT's copies of ``modules_to_save`` start as the base module: moved off it, so
    reading the copy (not the base's) is what the logits check."""
    with torch.no_grad():
        for name, value in peft_model.named_parameters():
            if ".modules_to_save." in name:
                value.add_(torch.randn_like(value) * 0.5)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "adapter_model_bin"])
def test_gpt2_folder_written_by_peft_reads_as_peft_runs_it(tmp_path, safe):
    model, graph, sd = _base("gpt2")
    config = peft.LoraConfig(r=4, lora_alpha=12, target_modules=["c_attn", "c_fc", "wte"],
                             fan_in_fan_out=True, lora_dropout=0.0, init_lora_weights=False)
    theirs = peft.get_peft_model(model, config).eval()
    theirs.save_pretrained(tmp_path, safe_serialization=safe)  # False: torch.save's .bin
    assert (tmp_path / ("adapter_model.safetensors" if safe else "adapter_model.bin")).exists()
    adapted = mg.lora_from_peft(graph, tmp_path)
    params, state = mg.models.load_state_dict(adapted, sd, adapter=tmp_path)
    ids = _ids()
    want = _theirs(theirs, ids)
    assert np.abs(want - _theirs(_base("gpt2")[0], ids)).max() > 1e-2   # the adapters act
    _close(_ours(adapted, params, state, ids), want)


def test_llama_rslora_patterns_and_modules_to_save_read_as_peft_runs_them(tmp_path):
    model, graph, sd = _base("llama")
    config = peft.LoraConfig(r=4, lora_alpha=8, use_rslora=True, lora_dropout=0.0,
                             target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                             rank_pattern={"v_proj": 2}, alpha_pattern={"o_proj": 2},
                             modules_to_save=["norm"], init_lora_weights=False)
    theirs = peft.get_peft_model(model, config).eval()
    _randomize_saved_modules(theirs)
    theirs.save_pretrained(tmp_path)
    adapted = mg.lora_from_peft(graph, tmp_path)
    params, state = mg.models.load_state_dict(adapted, sd, adapter=tmp_path)
    _close(_ours(adapted, params, state, _ids(2)), _theirs(theirs, _ids(2)))
    # written back like the folder read (like=): PEFT loads its saved norms and adapters
    mg.models.save_adapter(adapted, params, tmp_path / "back", like=tmp_path)
    again = peft.PeftModel.from_pretrained(_base("llama")[0], tmp_path / "back").eval()
    assert again.peft_config["default"].modules_to_save == {"norm"} or \
        list(again.peft_config["default"].modules_to_save) == ["norm"]
    _close(_theirs(again, _ids(2)), _theirs(theirs, _ids(2)))


@pytest.mark.parametrize("kind, targets, rslora", [
    ("gpt2", ["h.*/attn/qkv", "h.*/mlp/c_proj", "h.*/attn/out"], False),
    ("llama", ["*/self_attn/query", "*/self_attn/value", "*/mlp/gate_proj"], True),
])
def test_folder_written_by_save_adapter_loads_in_peft(tmp_path, kind, targets, rslora):
    model, graph, sd = _base(kind)
    adapted = mg.lora(graph, targets, rank=4, alpha=6, use_rslora=rslora)
    base = mg.models.load_state_dict(graph, sd)
    params, state = mg.compile(adapted).init(jax.random.key(2), reuse=base)  # B zero
    params = _nonzero_b(params)
    mg.models.save_adapter(adapted, params, tmp_path)
    theirs = peft.PeftModel.from_pretrained(model, tmp_path).eval()
    ids = _ids(4)
    ours = _ours(adapted, params, state, ids)
    _close(ours, _theirs(theirs, ids))
    # merged both ways: PEFT's merge_and_unload and mg.merge_lora
    merged_graph, merged_params = mg.merge_lora(adapted, params)
    _close(_ours(merged_graph, merged_params, state, ids), _theirs(theirs.merge_and_unload(), ids))


def test_a_folder_peft_wrote_for_an_embedding_target_loads(tmp_path):
    """target_modules=["embed_tokens"]: PEFT writes the table as
    ``embed_tokens.base_layer.weight`` beside ``lora_embedding_A``/``_B``."""
    model, graph, state_dict = _base("llama")
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8,
                                                            target_modules=["embed_tokens"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_embedding_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path)
    adapted = mg.lora_from_peft(graph, tmp_path)
    params, state = mg.models.load_state_dict(adapted, state_dict, adapter=tmp_path)
    ids = _ids()
    _close(_ours(adapted, params, state, ids), _theirs(peft_model.eval(), ids))


@pytest.mark.parametrize("blocks", ["layer1.0/conv2", "layer*/conv1"])
def test_a_top_level_module_save_adapter_writes_is_the_one_peft_adapts(tmp_path, blocks):
    """ResNet's top-level conv1 also ends every block's conv1's name: PEFT must adapt it
    alone, with its rank (a list of names would give it nine adapters), and with every
    block's conv1 adapted at another rank, those keep theirs."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    graph = mg.models.resnet18(10, image_size=32)
    base = mg.models.load_state_dict(graph, {k: v.detach().numpy().copy()
                                             for k, v in model.state_dict().items()})
    adapted = mg.lora(mg.lora(graph, "conv1", rank=3, alpha=5), blocks, rank=2, alpha=2,
                      init_weights=False)
    params, state = mg.compile(adapted).init(jax.random.key(2), reuse=base)
    params = _nonzero_b(params)
    mg.models.save_adapter(adapted, params, tmp_path)
    theirs = peft.PeftModel.from_pretrained(model, tmp_path).eval()
    wrapped = sorted(name for name, m in theirs.named_modules() if hasattr(m, "lora_A")
                     and "default" in getattr(m, "lora_A", {}))
    want = sorted(f"base_model.model.{p[: -len('.lora_A')].replace('/', '.')}"
                  for p, _ in adapted.walk() if p.endswith(".lora_A"))
    assert wrapped == want
    assert {n: m.r["default"] for n, m in theirs.named_modules() if n in wrapped} == \
        {n: 3 if n == "base_model.model.conv1" else 2 for n in wrapped}
    images = np.random.default_rng(5).normal(size=(2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = theirs(torch.from_numpy(images)).numpy()
    out, _ = mg.compile(adapted).apply(params, state, images.transpose(0, 2, 3, 1), inference_mode=True)
    _close(np.asarray(out), want)


def test_a_vit_adapter_save_adapter_writes_loads_in_peft_under_transformers_5(tmp_path):
    """transformers 5.x holds ViT's modules as layers.N.attention.q_proj, mlp.fc1 ...:
    the folder names them so, and PEFT adapts them."""
    config = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  image_size=16, patch_size=4)
    torch.manual_seed(0)
    model = transformers.ViTModel(transformers.ViTConfig(**config)).eval()
    graph = mg.models.vit(config)
    base = mg.models.load_state_dict(graph, {k: v.detach().numpy().copy()
                                             for k, v in model.state_dict().items()})
    adapted = mg.lora(graph, ["encoder.layer.*/attention/query", "encoder.layer.*/attention/value",
                              "encoder.layer.*/intermediate.dense"], rank=2, alpha=4, init_weights=False)
    params, state = mg.compile(adapted).init(jax.random.key(2), reuse=base)
    mg.models.save_adapter(adapted, params, tmp_path)
    theirs = peft.PeftModel.from_pretrained(model, tmp_path).eval()
    pixels = np.random.default_rng(5).normal(size=(2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        want = theirs(pixel_values=torch.from_numpy(pixels)).last_hidden_state.numpy()
    out, _ = mg.compile(adapted).apply(params, state, pixels, inference_mode=True)
    ours = np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
    _close(ours, want)
    assert mg.lora_from_peft(graph, tmp_path) == adapted


@pytest.mark.parametrize("kind", ["gpt2", "llama", "resnet18"])
def test_all_linear_adapts_the_modules_peft_adapts(tmp_path, kind):
    """"all-linear" read from a config gives the adapters PEFT gives (its folder holds
    the modules it resolved): Llama's lm_head left out, ResNet's fc (no output
    embeddings) adapted."""
    if kind == "resnet18":
        torchvision = pytest.importorskip("torchvision")
        model, graph = torchvision.models.resnet18(num_classes=10), mg.models.resnet18(10, image_size=32)
    else:
        model, graph, _ = _base(kind)
    config = peft.LoraConfig(r=2, target_modules="all-linear")
    peft.get_peft_model(model, config).save_pretrained(tmp_path)
    assert mg.lora_from_peft(graph, {"r": 2, "target_modules": "all-linear"}) == \
        mg.lora_from_peft(graph, tmp_path)


def test_a_sequence_classification_folder_peft_wrote_reads_and_writes_back(tmp_path):
    """task_type="SEQ_CLS" makes PEFT save "classifier" and "score" (whichever the model
    has) in modules_to_save: the folder reads as PEFT runs it, and the folder written back
    loads in PEFT."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.classifier = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.classifier(torch.relu(self.fc(x)))

    torch.manual_seed(0)
    net = Net().eval()
    state_dict = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    theirs = peft.get_peft_model(net, peft.LoraConfig(task_type="SEQ_CLS", target_modules=["fc"],
                                                      r=2, lora_alpha=4))
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.3)
    theirs.eval().save_pretrained(tmp_path)
    x = mg.Input(("batch", 8), name="x")
    graph = mg.Graph(x, mg.ops.Linear(3, name="classifier")(mg.ops.relu(mg.ops.Linear(16, name="fc")(x))))
    adapted = mg.lora_from_peft(graph, tmp_path)
    params, state = mg.models.load_state_dict(adapted, state_dict, adapter=tmp_path)
    xs = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    with torch.no_grad():
        want = theirs.base_model(torch.from_numpy(xs)).numpy()
    out, _ = mg.compile(adapted).apply(params, state, xs, inference_mode=True)
    _close(np.asarray(out), want)
    mg.models.save_adapter(adapted, params, tmp_path / "back", like=tmp_path)
    again = Net().eval()
    again.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
    again = peft.PeftModel.from_pretrained(again, tmp_path / "back").eval()
    with torch.no_grad():
        _close(again.base_model(torch.from_numpy(xs)).numpy(), want)


@pytest.mark.parametrize("targets", [["c_fc", "mlp"], ["c_attn", "h.0"]])
def test_target_modules_naming_a_module_that_holds_others_is_refused_as_peft_refuses_it(targets):
    model, graph, _ = _base("gpt2")
    config = peft.LoraConfig(r=2, target_modules=targets)
    with pytest.raises(ValueError, match="(?s)Target module .* is not supported"):
        peft.get_peft_model(model, config)
    with pytest.raises(mg.ConfigError, match=f"names {targets[1]!r}, a module holding others"):
        mg.lora_from_peft(graph, config.to_dict())


def test_peft_draws_a_dilated_convs_lora_a_without_the_dilation_so_it_is_refused():
    """The reason lora_from_peft refuses a dilated conv target: PEFT's lora_A there is
    undilated (mg.lora's A has the conv's dilation)."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(4, 6, 3, padding="same", dilation=2)

        def forward(self, x):
            return self.c(x)

    config = peft.LoraConfig(r=2, target_modules=["c"])
    theirs = peft.get_peft_model(Net(), config)
    assert theirs.base_model.model.c.lora_A["default"].dilation == (1, 1)
    x = mg.Input(("batch", 9, 9, 4), name="x")
    graph = mg.Graph(x, mg.ops.Conv(6, 3, padding="SAME", dilation=2, name="c")(x))
    with pytest.raises(mg.ConfigError, match="Conv with dilation"):
        mg.lora_from_peft(graph, config.to_dict())


def test_a_grouped_convs_adapter_reads_and_writes_as_peft_runs_it(tmp_path):
    """PEFT adapts a grouped Conv2d with lora_B grouped as the conv: its folder reads as
    PEFT runs it, and the folder save_adapter writes loads in PEFT."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(4, 6, 3, padding=1, groups=2)

        def forward(self, x):
            return self.c(x)

    torch.manual_seed(0)
    net = Net().eval()
    state_dict = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    theirs = peft.get_peft_model(net, peft.LoraConfig(r=4, lora_alpha=2, target_modules=["c"],
                                                      init_lora_weights=False)).eval()
    theirs.save_pretrained(tmp_path)
    x = mg.Input(("batch", 4, 9, 9), name="x")
    graph = mg.Graph(x, mg.ops.Conv(6, (3, 3), padding=((1, 1), (1, 1)), groups=2,
                                    data_format="NCHW", name="c")(x))
    adapted = mg.lora_from_peft(graph, tmp_path)
    params, state = mg.models.load_state_dict(adapted, state_dict, adapter=tmp_path)
    xs = np.random.default_rng(0).normal(size=(2, 4, 9, 9)).astype(np.float32)
    with torch.no_grad():
        want = theirs(torch.from_numpy(xs)).numpy()
    out, _ = mg.compile(adapted).apply(params, state, xs, inference_mode=True)
    _close(np.asarray(out), want)
    params = _nonzero_b(params)
    mg.models.save_adapter(adapted, params, tmp_path / "back")
    again = Net().eval()
    again.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
    again = peft.PeftModel.from_pretrained(again, tmp_path / "back").eval()
    out, _ = mg.compile(adapted).apply(params, state, xs, inference_mode=True)
    with torch.no_grad():
        _close(np.asarray(out), again(torch.from_numpy(xs)).numpy())
