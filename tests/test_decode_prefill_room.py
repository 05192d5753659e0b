"""``Decoder.prefill``'s ``room`` and ``step``'s cache: what a caller gives wrong is an
``mg.*Error`` saying so (a float room was NumPy's TypeError from deep inside; a negative
one, or more than the prompt leaves, was taken as something else; another decoder's
cache was an error about the decoding graph's ``cache_mask`` input)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import mlaxgraph as mg

GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 128}


@pytest.fixture(scope="module")
def gpt2():
    model = mg.compile(mg.models.gpt2(GPT2))
    params, state = model.init(jax.random.key(0))
    return model, params, state


@pytest.mark.parametrize("room, error, message", [
    (-1, mg.ConfigError, r"room must be an int >= 0 \(the slots to keep free for step after the "
                         r"prompt\), got -1"),
    (2.5, mg.ConfigError, r"room must be an int >= 0 .* got 2\.5"),
    ("4", mg.ConfigError, r"room must be an int >= 0 .* got '4'"),
    (61, mg.ShapeError, r"room=61: a prompt of 4 tokens leaves 60 of the decoder's max_length=64 "
                        r"slots"),
])
def test_a_bad_room_is_refused(gpt2, room, error, message):
    model, params, state = gpt2
    dec = mg.decoder(model, max_length=64)
    with pytest.raises(error, match=message):
        dec.prefill(params, state, np.array([[3, 4, 5, 6]]), room=room)


def test_room_is_left_free_and_the_logits_are_the_full_forwards(gpt2):
    model, params, state = gpt2
    dec = mg.decoder(model, max_length=64)
    ids = np.array([[3, 4, 5, 6]])
    full, _ = model.apply(params, state, ids, inference_mode=True)
    for room, filled in ((60, 4), (0, 64), (np.int64(30), 34)):
        logits, cache = dec.prefill(params, state, ids, room=room)
        assert cache.filled == filled and 64 - cache.filled >= room
        np.testing.assert_allclose(np.asarray(logits), np.asarray(full), atol=1e-5)


def test_another_decoders_cache_is_named(gpt2):
    model, params, state = gpt2
    _, cache = mg.decoder(model, max_length=32).prefill(params, state, np.array([[3, 4]]))
    with pytest.raises(mg.GraphError, match=r"this cache has 32 slots: it is another decoder's "
                                            r"\(this one has max_length=64\)"):
        mg.decoder(model, max_length=64).step(params, state, cache, np.array([5]))
