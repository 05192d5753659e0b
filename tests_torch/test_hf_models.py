"""Hugging Face models from random configs (tiny, so the suite stays short) through
mg.from_torch, against PyTorch's own outputs; their repeated layers fold under
``scan_blocks="always"``. GPT-2 is in test_torch_live.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import mlaxgraph as mg


def _bert():
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=32)
    return T.BertModel(config), (torch.randint(0, 100, (2, 8)),)


def _vit():
    config = T.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64)
    return T.ViTModel(config), (torch.randn(2, 3, 16, 16),)


def _decoder(kind):
    def make():
        config = getattr(T, f"{kind}Config")(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, use_cache=False)
        return getattr(T, f"{kind}ForCausalLM")(config), (torch.randint(0, 100, (2, 8)),)
    return make


def _t5_encoder():
    # three layers: the first holds the relative position bias, the other two are equal
    config = T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                        use_cache=False)
    return T.T5EncoderModel(config), (torch.randint(0, 100, (2, 8)),)


def _whisper_encoder():
    config = T.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=1,
                             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                             decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                             max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             decoder_start_token_id=1)
    return T.WhisperModel(config).get_encoder(), (torch.randn(2, 8, 32),)


# model, the block holding the layers, their scan's name
MODELS = {
    "bert": (_bert, "encoder", "layer.0..layer.1"),
    "vit": (_vit, None, "layers.0..layers.1"),
    "llama": (_decoder("Llama"), "model", "layers.0..layers.1"),
    "qwen2": (_decoder("Qwen2"), "model", "layers.0..layers.1"),
    "t5_encoder": (_t5_encoder, "encoder", "block.1..block.2"),
    "whisper_encoder": (_whisper_encoder, None, "layers.0..layers.1"),
}


def _first(out):
    """The first output: ours (an array or a tuple), or a transformers output's."""
    if isinstance(out, tuple):
        return out[0]
    if hasattr(out, "logits"):
        return out.logits
    return getattr(out, "last_hidden_state", out)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hugging_face_model_matches_and_folds(name):
    make, holder, scan_name = MODELS[name]
    torch.manual_seed(0)
    module, args = make()
    module = module.eval()
    graph, params, state = mg.from_torch(module, args)
    inputs = [jnp.asarray(a.numpy()) for a in args]
    expected = _first(module(*args)).detach().numpy()
    scale = max(1.0, float(np.abs(expected).max()))

    out, _ = mg.compile(graph).apply(params, state, *inputs, inference_mode=True)
    np.testing.assert_allclose(np.asarray(_first(out)), expected, rtol=1e-4, atol=1e-4 * scale)

    model = mg.compile(graph, scan_blocks="always")
    inner = model.graph if holder is None else model.graph.node(holder).op.graph
    assert inner.node(scan_name).op.op_name == "scan"
    stacked = model.stack_weights(params, state)
    out, _ = model.apply(*stacked, *inputs, inference_mode=True)
    np.testing.assert_allclose(np.asarray(_first(out)), expected, rtol=1e-4, atol=1e-4 * scale)

    # the weights carry the module's state-dict names (a tied weight under one of its names)
    ours = mg.models.to_state_dict(graph, params, state)
    names: dict[int, set] = {}
    for key, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(key)
    for p in module.parameters():
        found = names[id(p)] & set(ours)
        assert found, names[id(p)]
        np.testing.assert_array_equal(np.asarray(ours[found.pop()]), p.detach().numpy())


SAVED = {  # family: (config, model class, inputs, our output index)
    "bert": (dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=32), "BertModel"),
    "vit": (dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64), "ViTModel"),
    "gpt2": (dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=32), "GPT2LMHeadModel"),
    "llama": (dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=64), "LlamaForCausalLM"),
    # transformers 5 writes rope_parameters; YaRN's ramp and attention factor, MLP biases
    "llama/yarn_mlp_bias": (dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=64, mlp_bias=True,
                                 max_position_embeddings=64, rope_parameters={
                                     "rope_type": "yarn", "factor": 4.0, "rope_theta": 100.0,
                                     "original_max_position_embeddings": 16, "beta_fast": 8}),
                            "LlamaForCausalLM"),
    "qwen2/yarn_mscale": (dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                               rope_parameters={"rope_type": "yarn", "factor": 8.0, "rope_theta": 1000.0,
                                                "original_max_position_embeddings": 32, "mscale": 0.8,
                                                "mscale_all_dim": 0.5, "truncate": False}),
                          "Qwen2ForCausalLM"),
}


@pytest.mark.parametrize("family", sorted(SAVED))
def test_a_folder_save_pretrained_wrote_builds_and_loads_in_the_zoo(family, tmp_path):
    """``save_pretrained`` of the installed transformers (its config.json holds every field
    it writes: BERT's ``tie_word_embeddings`` was refused) read by the zoo's builder and
    ``load_state_dict``: the same outputs."""
    fields, cls = SAVED[family]
    torch.manual_seed(0)
    config = getattr(T, f"{cls.replace('Model', '').replace('LMHead', '').replace('ForCausalLM', '')}Config")
    theirs = getattr(T, cls)(config(**fields)).eval()
    theirs.save_pretrained(tmp_path)
    graph = getattr(mg.models, family.split("/")[0])(str(tmp_path))
    params, state = mg.models.load_state_dict(graph, str(tmp_path))
    if family == "vit":
        args = (torch.randn(2, 3, 16, 16),)
    elif family == "bert":
        ids = torch.randint(0, 100, (2, 8))
        args = (ids, torch.zeros_like(ids), torch.ones_like(ids))
    else:
        args = (torch.randint(0, 100, (2, 40 if "yarn" in family else 8)),)  # past the original context
    ours, _ = mg.compile(graph).apply(params, state, *[jnp.asarray(a.numpy()).astype(
        jnp.float32 if a.is_floating_point() else jnp.int32) for a in args], inference_mode=True)
    with torch.no_grad():
        out = theirs(*args[:1], **({"token_type_ids": args[1], "attention_mask": args[2]}
                                   if family == "bert" else {}))
    np.testing.assert_allclose(np.asarray(_first(ours)), _first(out).numpy(), atol=2e-5, rtol=1e-4)


def test_a_task_models_head_without_the_prefix_loads_beside_the_body():
    """BertForSequenceClassification: the body's names under ``bert.``, the head's
    ``classifier.*`` without it; the zoo graph with the classifier inserted after its
    pooler loads the whole state dict strictly and gives the model's logits."""
    from mlaxgraph import ops

    cfg = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
           "vocab_size": 100, "max_position_embeddings": 32, "num_labels": 3}
    torch.manual_seed(0)
    hf = T.BertForSequenceClassification(T.BertConfig(**cfg)).eval()
    g = mg.models.bert(hf.config.to_dict()).insert_after(
        "pooler.activation", lambda h: ops.Linear(3, name="classifier")(h))
    params, state = mg.models.load_state_dict(g, {k: v.numpy() for k, v in hf.state_dict().items()})
    ids = np.random.RandomState(0).randint(0, 100, (2, 9))
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got = mg.compile(g).apply(params, state, jnp.asarray(ids, jnp.int32), jnp.zeros((2, 9), jnp.int32),
                              jnp.ones((2, 9), jnp.int32), inference_mode=True)[0][1]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
