"""mg.generate against transformers' generate on the same weights (loaded through the
zoo's state-dict loading): the same tokens, greedy, on left-padded batches of Llama's
variants (grouped-query heads, rotary scalings, a tied head, Mistral's window, Qwen2),
and with the padding transformers infers from pad_token_id when no mask is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mlaxgraph as mg

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _pair(family: str, config: dict):
    classes = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, mg.models.llama),
               "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig, mg.models.llama),
               "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, mg.models.qwen2)}
    model_class, config_class, builder = classes[family]
    torch.manual_seed(0)
    theirs = model_class(config_class(**config)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.mul_(3.0)  # away from near-ties
    graph = builder(config)
    params, state = mg.models.load_state_dict(
        graph, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return theirs, mg.compile(graph), params, state


@pytest.mark.parametrize("family, extra", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 32}}),
    ("llama", {"head_dim": 16, "attention_bias": True, "mlp_bias": True}),
    ("mistral", {"sliding_window": 4}),
    ("qwen2", {"tie_word_embeddings": True}),
], ids=["gqa", "tied_mqa", "linear", "llama3", "yarn", "head_dim_biases", "mistral", "qwen2"])
def test_greedy_tokens_on_a_left_padded_batch(family, extra):
    theirs, model, params, state = _pair(family, {**BASE, **extra})
    ids = np.random.default_rng(0).integers(1, 97, (3, 9))
    mask = np.ones_like(ids)
    mask[1, :4] = mask[2, :7] = 0
    ids[mask == 0] = 0
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=10, do_sample=False, pad_token_id=0,
                               eos_token_id=None).numpy()
    got = mg.generate(model, params, state, ids, attention_mask=mask, max_new_tokens=10)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_the_padding_inferred_from_pad_token_id_without_a_mask():
    theirs, model, params, state = _pair("llama", BASE)
    ids = np.array([[5, 17, 3, 60, 22, 9, 41], [0, 0, 0, 8, 30, 2, 11]])
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(ids), max_new_tokens=8, do_sample=False,
                               pad_token_id=0, eos_token_id=None).numpy()
    got = mg.generate(model, params, state, ids, max_new_tokens=8, pad_token_id=0)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("fields", [
    {"max_new_tokens": 5},
    {"max_length": 13},
    {"bad_words_ids": "first"},
    {"eos_token_id": "second", "min_new_tokens": 5},
    {"eos_token_id": "second", "min_length": 11},
    {"repetition_penalty": 1.4, "no_repeat_ngram_size": 2},
], ids=["max_new_tokens", "max_length", "bad_words_ids", "min_new_tokens", "min_length",
        "penalties"])
def test_the_command_reads_generation_config_as_transformers_does(tmp_path, capsys, fields):
    """``mlaxgraph generate`` on a folder transformers saved, its generation_config.json
    read by both: the same tokens as transformers' generate with no arguments but the
    prompt."""
    from mlaxgraph.cli.main import main

    theirs, model, params, state = _pair("llama", BASE)
    prompt = [1, 15, 33, 8, 41, 12]
    plain = np.asarray(mg.generate(model, params, state, np.array([prompt]), max_new_tokens=4))[0, 6:]
    fields = {k: ([[int(plain[0])]] if v == "first" else int(plain[1]) if v == "second" else v)
              for k, v in fields.items()}
    theirs.generation_config = transformers.GenerationConfig(**fields)
    theirs.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    length = {} if {"max_new_tokens", "max_length"} & set(fields) else {"max_new_tokens": 8}
    with torch.no_grad():
        want = loaded.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 6, dtype=torch.long),
                               **length).numpy()[0].tolist()
    flags = ["--max-new-tokens", "8"] if length else []
    assert main(["generate", "--model", "llama", "--weights", str(tmp_path), "--prompt-ids",
                 ",".join(map(str, prompt)), *flags]) == 0
    printed = capsys.readouterr().out
    assert f"ids: {','.join(map(str, want))}" in printed
