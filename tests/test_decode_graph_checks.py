"""The graphs ``mg.decoder`` takes: token ids in, one output of logits ``(batch, seq,
vocab)``. A graph of several outputs, or of an output of another rank, is a
``GraphError`` when the decoder is made (it was Python's TypeError from inside the
prefill, ``tuple indices must be integers``, or the sampler's argmax over the rows)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops


def _body():
    tokens = mg.Input(("batch", "seq"), "int32")
    h = ops.Embedding(50, 32)(tokens)
    return tokens, h + ops.MultiHeadAttention(4, causal=True)(h)


@pytest.mark.parametrize("outputs, shown", [
    (lambda h: [ops.Linear(50)(h), h], r"gives f32\[batch,seq,50\], f32\[batch,seq,32\]"),
    (lambda h: ops.sum(ops.Linear(4)(h), axis=2), r"gives f32\[batch,seq\]"),
], ids=["logits_and_hidden", "a_score_per_position"])
def test_a_graph_whose_output_is_not_the_logits_alone_is_refused(outputs, shown):
    tokens, h = _body()
    g = mg.Graph(tokens, outputs(h))
    params, state = mg.compile(g).init(jax.random.key(0))
    message = shown + r"; a decoder takes a graph whose one output is the logits \(batch, seq, vocab\)"
    with pytest.raises(mg.GraphError, match=message):
        mg.decoder(g, max_length=16)
    with pytest.raises(mg.GraphError, match=message):
        mg.generate(mg.compile(g), params, state, np.array([[1, 2]]), max_new_tokens=2)


def test_the_logits_alone_decode():
    tokens, h = _body()
    g = mg.Graph(tokens, ops.Linear(50)(h))
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    ids = np.array([[1, 2, 3]])
    logits, _ = mg.decoder(g, max_length=16).prefill(params, state, ids)
    full, _ = model.apply(params, state, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full), atol=1e-5)
