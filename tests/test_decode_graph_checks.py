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


@pytest.mark.parametrize("pick", [
    lambda h: h[:, :, :16],
    lambda h: h[..., 16:],
    lambda h: h[:, :, None][:, :, 0],
    lambda h: h[..., ::2],
], ids=["first_features", "ellipsis", "new_axis_then_int", "strided"])
def test_slices_of_the_feature_axes_decode(pick):
    # every slice was refused as mixing positions (the rewrite compared the index's
    # entries with slice(None), which an index never holds)
    tokens, h = _body()
    logits = ops.Linear(50)(pick(ops.Linear(64)(h)))
    g = mg.Graph(tokens, logits)
    model = mg.compile(g)
    params, state = model.init(jax.random.key(1))
    ids = np.array([[1, 2, 3, 4]])
    got = np.asarray(mg.generate(model, params, state, ids, max_new_tokens=4))
    want = ids
    for _ in range(4):  # the full forward's argmax, token by token
        out, _ = model.apply(params, state, want, inference_mode=True)
        want = np.concatenate([want, np.argmax(np.asarray(out)[:, -1], -1)[:, None]], 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pick", [lambda h: h[:, 1:], lambda h: h[:, ::2], lambda h: h[None][0]],
                         ids=["from_the_second_position", "every_other_position", "new_leading_axis"])
def test_slices_of_the_positions_are_refused(pick):
    tokens, h = _body()
    g = mg.Graph(tokens, ops.Linear(50)(pick(h)))
    with pytest.raises(mg.GraphError, match=r"layer 'getitem.*depends on other positions"):
        mg.decoder(g, max_length=16)
