"""What ``mg.generate`` compiles across calls: a model compiled again from the same
graph (``mg.generate(mg.compile(g), ...)``, as a loop or a script calls it) reuses the
decoder and the generation loop the first call compiled."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import monitoring

import mlaxgraph as mg

GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 128}
COMPILED = "/jax/core/compile/backend_compile_duration"


@pytest.fixture()
def compiles():
    """The number of XLA compilations so far."""
    seen: list[str] = []

    def listen(name, duration, **kw):
        if name == COMPILED:
            seen.append(name)

    monitoring.register_event_duration_secs_listener(listen)
    yield lambda: len(seen)
    monitoring.unregister_event_duration_listener(listen)


def _greedy(model, params, state, ids, new):
    """The full forward's argmax, token by token (the reference)."""
    for _ in range(new):
        logits, _ = model.apply(params, state, ids, inference_mode=True)
        ids = np.concatenate([ids, np.argmax(np.asarray(logits)[:, -1], -1)[:, None]], 1)
    return ids


def test_a_model_compiled_again_from_the_graph_compiles_no_new_loop(compiles):
    g = mg.models.gpt2(GPT2)
    params, state = mg.compile(g).init(jax.random.key(0))
    prompt = np.array([[3, 9, 27, 4]])
    first = np.asarray(mg.generate(mg.compile(g), params, state, prompt, max_new_tokens=5))
    before = compiles()
    again = np.asarray(mg.generate(mg.compile(g), params, state, prompt, max_new_tokens=5))
    assert compiles() == before  # each call made a decoder and compiled its loop (3 s here)
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(first, _greedy(mg.compile(g), params, state, prompt, 5))
    # another policy is another decoder: its tokens are its own model's
    half = mg.compile(g, policy="bfloat16")
    ids = np.asarray(mg.generate(half, params, state, prompt, max_new_tokens=5))
    np.testing.assert_array_equal(ids, _greedy(half, params, state, prompt, 5))
    assert compiles() > before


def test_streaming_with_a_processor_compiles_nothing_more_for_other_lengths(compiles):
    # the tokens so far were as wide as the prompt's bucket and max_new_tokens: each
    # max_new_tokens compiled the choice of a token again
    g = mg.models.gpt2(GPT2)
    params, state = mg.compile(g).init(jax.random.key(0))
    dec = mg.decoder(g, max_length=128)
    sampler = mg.sampling.RepetitionPenalty(1.5) + mg.sampling.NoRepeatNGram(2)
    prompt = np.array([[3, 9, 27, 4, 3]])

    def stream(ids, new):
        return np.stack([np.asarray(t) for t in mg.generate_stream(
            dec, params, state, ids, max_new_tokens=new, sampler=sampler)], 1)

    first = stream(prompt, 3)
    before = compiles()
    runs = {new: stream(prompt, new) for new in (5, 9, 14)}
    shorter = stream(prompt[:, 1:], 4)
    assert compiles() == before
    for new, tokens in runs.items():  # one sequence, cut at each length
        np.testing.assert_array_equal(tokens[:, :3], first)
        np.testing.assert_array_equal(tokens, runs[14][:, :new])
        np.testing.assert_array_equal(tokens, np.asarray(mg.generate(
            dec, params, state, prompt, max_new_tokens=new, sampler=sampler))[:, 5:])
    np.testing.assert_array_equal(shorter, np.asarray(mg.generate(
        dec, params, state, prompt[:, 1:], max_new_tokens=4, sampler=sampler))[:, 4:])
