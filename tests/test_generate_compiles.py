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
