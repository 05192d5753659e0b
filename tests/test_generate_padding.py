"""Padding ``mg.generate`` infers as Hugging Face's ``generate`` does: without an
``attention_mask``, the prompt's tokens equal to ``pad_token_id`` are padding (unless
it is a stop token). The reference is each row alone through the full forward, its
argmax token by token."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import mlaxgraph as mg

LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def llama():
    model = mg.compile(mg.models.llama(LLAMA))
    params, state = model.init(jax.random.key(2))
    params = jax.tree.map(lambda w: w * 3.0, params)  # away from near-ties
    return model, params, state


def _alone(model, params, state, row, new):
    ids = np.asarray(row)[None]
    for _ in range(new):
        logits, _ = model.apply(params, state, ids, inference_mode=True)
        ids = np.concatenate([ids, np.argmax(np.asarray(logits)[:, -1], -1)[:, None]], 1)
    return ids[0, len(row):]


def test_the_pad_token_in_the_prompt_is_padding_without_a_mask(llama):
    # the zeros were taken for tokens: the second row generated what [0, 0, 8, 30] does
    model, params, state = llama
    ids = np.array([[5, 17, 3, 60, 22], [0, 0, 8, 30, 2]])
    got = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=6, pad_token_id=0))
    np.testing.assert_array_equal(got[:, :5], ids)
    np.testing.assert_array_equal(got[0, 5:], _alone(model, params, state, [5, 17, 3, 60, 22], 6))
    np.testing.assert_array_equal(got[1, 5:], _alone(model, params, state, [8, 30, 2], 6))
    streamed = np.stack([np.asarray(t) for t in mg.generate_stream(
        model, params, state, ids, max_new_tokens=6, pad_token_id=0)], 1)
    np.testing.assert_array_equal(streamed, got[:, 5:])
    # a mask given is read as given: the zeros are tokens
    ones = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=6, pad_token_id=0,
                                  attention_mask=np.ones(ids.shape, np.int32)))
    np.testing.assert_array_equal(ones[1, 5:], _alone(model, params, state, [0, 0, 8, 30, 2], 6))


def test_a_pad_token_that_is_a_stop_token_is_not_padding(llama):
    # Hugging Face infers no mask then (GPT-2's pad is its eos)
    model, params, state = llama
    ids = np.array([[7, 7, 8, 30]])
    got = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=4, pad_token_id=7,
                                 eos_token_id=[50, 7]))
    want = _alone(model, params, state, [7, 7, 8, 30], 4)
    stop = next((i for i, t in enumerate(want) if t in (50, 7)), len(want))
    np.testing.assert_array_equal(got[0, 4:4 + stop + 1], want[:stop + 1])


def test_a_row_of_pad_tokens_only_is_an_empty_prompt(llama):
    model, params, state = llama
    with pytest.raises(mg.ShapeError, match=r"row 1 of input_ids holds only pad_token_id=0: "
                                            r"that prompt is empty"):
        mg.generate(model, params, state, np.array([[3, 4], [0, 0]]), max_new_tokens=2, pad_token_id=0)
