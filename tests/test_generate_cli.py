"""``mlaxgraph generate`` and the fields of a ``generation_config.json`` beside the
weights: each one is read as Hugging Face's ``generate`` reads it, or refused by name;
none is passed over. The reference is ``mg.generate`` given the samplers and lengths
the fields stand for."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.cli.main import main

LLAMA = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
PROMPT = [4, 9, 2, 17]
S = mg.sampling


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Llama checkpoint folder (config.json, model.safetensors) and its model."""
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("llama")
    g = mg.models.llama(LLAMA)
    params, state = mg.compile(g).init(jax.random.key(5))
    params = jax.tree.map(lambda w: w * 3.0, params)  # away from near-ties
    save_file(mg.models.to_state_dict(g, params, state), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(LLAMA))
    return path, mg.compile(g), params, state


def _cli(path, fields, capsys, *flags):
    """The command's exit status, its ids (None: none printed) and its stderr."""
    (path / "generation_config.json").write_text(json.dumps(fields))
    status = main(["generate", "--model", "llama", "--weights", str(path), "--prompt-ids",
                   ",".join(map(str, PROMPT)), *flags])
    out = capsys.readouterr()
    ids = [line[4:].strip() for line in out.out.splitlines() if line.startswith("ids:")]
    return status, ([int(t) for t in ids[0].split(",")] if ids else None), out.err


def _generate(model, params, state, new, **kw):
    return np.asarray(mg.generate(model, params, state, np.array([PROMPT]), max_new_tokens=new,
                                  **kw))[0].tolist()


@pytest.fixture()
def case(folder, tmp_path):
    """A copy of the folder to write a generation_config.json into."""
    source = folder[0]
    for f in source.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


def test_the_files_lengths_are_read_as_hugging_face_reads_them(folder, case, capsys):
    # max_new_tokens, else max_length (the prompt's tokens and the new ones); they were
    # passed over for the flag's default of 32 new tokens
    _, model, params, state = folder
    assert _cli(case, {"max_new_tokens": 5}, capsys)[1] == _generate(model, params, state, 5)
    assert _cli(case, {"max_length": 11}, capsys)[1] == _generate(model, params, state, 7)
    # max_new_tokens first, as Hugging Face's; the flag before the file
    assert _cli(case, {"max_new_tokens": 3, "max_length": 30}, capsys)[1] == \
        _generate(model, params, state, 3)
    assert _cli(case, {"max_new_tokens": 3}, capsys, "--max-new-tokens", "6")[1] == \
        _generate(model, params, state, 6)
    status, ids, err = _cli(case, {"max_length": 4}, capsys)
    assert status == 1 and ids is None and "max_length=4 counts the prompt's 4 tokens" in err
    status, ids, err = _cli(case, {"max_new_tokens": "5"}, capsys)
    assert status == 1 and "field 'max_new_tokens' must be an int >= 0, got '5'" in err


def test_the_files_logits_processors_are_applied(folder, case, capsys):
    # bad_words_ids, min_new_tokens and min_length were passed over
    _, model, params, state = folder
    plain = _generate(model, params, state, 8)
    new = plain[len(PROMPT):]
    stop = new[1]  # a stop token greedy makes second
    cases = [({"bad_words_ids": [[new[0]], [new[1], new[2]]]},
              S.BadWords([[new[0]], [new[1], new[2]]])),
             ({"eos_token_id": stop, "min_new_tokens": 4}, S.MinNewTokens(4)),
             ({"eos_token_id": stop, "min_length": len(PROMPT) + 5}, S.MinLength(len(PROMPT) + 5)),
             # both: min_new_tokens takes precedence, as Hugging Face's (0 included)
             ({"eos_token_id": stop, "min_new_tokens": 3, "min_length": 30}, S.MinNewTokens(3)),
             ({"eos_token_id": stop, "min_new_tokens": 0, "min_length": 30}, "greedy")]
    for fields, sampler in cases:
        eos = fields.get("eos_token_id")
        want = _generate(model, params, state, 8, sampler=sampler, eos_token_id=eos)
        if eos is not None and eos in want[len(PROMPT):]:
            want = want[:want.index(eos, len(PROMPT)) + 1]  # the command prints up to the stop
        assert want != plain[:len(want)] or sampler == "greedy"  # the field changes the tokens
        status, ids, err = _cli(case, fields, capsys, "--max-new-tokens", "8")
        assert (status, ids) == (0, want), (fields, err)


@pytest.mark.parametrize("fields, named", [
    ({"num_beams": 3}, "num_beams=3 (beam search)"),
    ({"suppress_tokens": [5]}, "suppress_tokens=[5] (suppressed tokens)"),
    ({"forced_eos_token_id": 5, "num_return_sequences": 2},
     "num_return_sequences=2 (several sequences per prompt); forced_eos_token_id=5"),
    ({"do_sample": True, "min_p": 0.1}, "min_p=0.1 (min-p sampling)"),
])
def test_settings_it_does_not_have_are_refused_by_name(case, capsys, fields, named):
    # they were passed over: the tokens of another decoding than the file asks for
    status, ids, err = _cli(case, fields, capsys, "--max-new-tokens", "2")
    assert status == 1 and ids is None
    assert named in err and "mlaxgraph's generate does not do this" in err


def test_settings_at_their_defaults_or_unread_by_hugging_face_pass(folder, case, capsys):
    # Hugging Face's defaults, a drawing setting without do_sample (Hugging Face does not
    # read it then), and transformers 5's fields (top_h was taken for a misspelt top_k)
    _, model, params, state = folder
    want = _generate(model, params, state, 3)
    fields = {"num_beams": 1, "num_return_sequences": 1, "guidance_scale": 1.0, "typical_p": 1.0,
              "suppress_tokens": None, "min_p": 0.2, "top_h": 0.5, "max_cache_len": 64,
              "use_mtp": False}
    status, ids, err = _cli(case, fields, capsys, "--max-new-tokens", "3")
    assert (status, ids) == (0, want), err
    assert "top_k" not in err and "not a Hugging Face generation setting" not in err


def test_a_zero_temperature_with_do_sample_is_refused(case, capsys):
    # it was replaced by 1.0 (Hugging Face's generate raises)
    status, ids, err = _cli(case, {"do_sample": True, "temperature": 0.0}, capsys, "--max-new-tokens", "2")
    assert status == 1 and ids is None
    assert "generation_config.json: Temperature: temperature must be > 0, got 0.0" in err


def test_the_stop_tokens_of_generation_config_replace_the_configs(folder, case, capsys):
    # Hugging Face's generate reads generation_config.json's eos_token_id alone when the
    # folder has one (none there: no stop token); the config's stopped the command
    _, model, params, state = folder
    plain = _generate(model, params, state, 6)
    stop = plain[len(PROMPT) + 1]
    (case / "config.json").write_text(json.dumps({**LLAMA, "eos_token_id": stop}))
    assert _cli(case, {"max_new_tokens": 6}, capsys)[1] == plain
    (case / "generation_config.json").unlink()  # none: the config's, as Hugging Face's
    status = main(["generate", "--model", "llama", "--weights", str(case), "--prompt-ids",
                   ",".join(map(str, PROMPT)), "--max-new-tokens", "6"])
    assert status == 0 and f"ids: {','.join(map(str, plain[:len(PROMPT) + 2]))}\n" in capsys.readouterr().out
    status, ids, err = _cli(case, {"eos_token_id": "2"}, capsys, "--max-new-tokens", "2")
    assert status == 1 and "field 'eos_token_id' must be a token id or a list of them, got '2'" in err
