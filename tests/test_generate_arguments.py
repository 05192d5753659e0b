"""Hugging Face's ``generate`` arguments given to ``mg.generate``: the message that
refuses them names the sampler that does what they ask, and says so of each one no
sampler stands for, rather than leaving it out of the translation."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.decode.arguments import NOT_BUILT, NOT_BUILT_DRAWS

GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 64}


@pytest.fixture(scope="module")
def tiny():
    model = mg.compile(mg.models.gpt2(GPT2))
    params, state = model.init(jax.random.key(0))
    return model, params, state


def _message(tiny, **hf) -> str:
    model, params, state = tiny
    with pytest.raises(mg.ConfigError) as info:
        mg.generate(model, params, state, np.array([[1, 2]]), max_new_tokens=2, **hf)
    return str(info.value)


def test_a_setting_no_sampler_stands_for_is_named_beside_the_translation(tiny):
    # min_p was left out: the message offered Temperature(1.0) as what do_sample=True,
    # min_p=0.1 asks for
    text = _message(tiny, do_sample=True, min_p=0.1)
    assert "here sampler=mg.sampling.Temperature(1.0) with key" in text
    assert "min-p sampling (min_p) is not built" in text
    text = _message(tiny, repetition_penalty=1.2, num_beams=4, streamer=None, output_scores=True)
    assert "here sampler=mg.sampling.RepetitionPenalty(1.2)" in text
    assert "beam search is not built" in text and "generate returns the token ids" in text
    text = _message(tiny, top_k=5, do_sample=True, stopping_criteria=[])
    assert "stopping_criteria is not an argument of generate" in text


def test_min_new_tokens_takes_precedence_over_min_length_as_in_hugging_face(tiny):
    # Hugging Face's generate sets min_length to the prompt's length and min_new_tokens:
    # the two samplers together stop later than it does
    text = _message(tiny, min_length=9, min_new_tokens=2)
    assert "here sampler=mg.sampling.MinNewTokens(2) (" in text and "MinLength" not in text
    assert "min_length=9 is left out: Hugging Face's min_new_tokens takes precedence" in text
    assert "here sampler=mg.sampling.MinLength(9) (" in _message(tiny, min_length=9)


@pytest.mark.parametrize("name, value", [("suppress_tokens", [3]), ("num_return_sequences", 2),
                                         ("sequence_bias", {(3,): -1.0}), ("typical_p", 0.5)])
def test_what_generate_does_not_do_is_named(tiny, name, value):
    text = _message(tiny, **{name: value})
    what = (NOT_BUILT.get(name) or NOT_BUILT_DRAWS[name])[1]
    assert f"{name}={value!r}, which it does not take" in text and f"{what} ({name}) is not built" in text


def test_a_stop_or_pad_token_given_as_an_array_of_one_is_read(tiny):
    # a list of arrays was read, one array refused ("must be an int token id, got int32[]")
    model, params, state = tiny
    ids = np.array([[1, 2, 3]])
    plain = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=6))[0, 3:]
    stop = int(plain[1])
    want = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=6, eos_token_id=stop,
                                  pad_token_id=7))
    assert (want[0, 5:] == 7).all() or stop == 7
    for eos, pad in ((np.int64(stop), np.array(7)), (jax.numpy.int32(stop), jax.numpy.asarray(7)),
                     (np.array([stop]), np.array(7, np.uint8))):
        got = mg.generate(model, params, state, ids, max_new_tokens=6, eos_token_id=eos, pad_token_id=pad)
        np.testing.assert_array_equal(np.asarray(got), want)
    for odd in (np.array(7.0), np.array(True), np.array([[7]])[0]):
        with pytest.raises(mg.ConfigError, match="pad_token_id must be an int token id"):
            mg.generate(model, params, state, ids, max_new_tokens=2, pad_token_id=odd)
