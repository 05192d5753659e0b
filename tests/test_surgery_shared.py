"""Surgery on layers and blocks called more than once (sharing their weights): a
further call acted on by its own path, the old layer called again inside the function
keeping the shared weights, and a first call taken out leaving its layer listed."""

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

X = np.asarray(jax.random.normal(jax.random.key(1), (3, 8)))


def _linear(p, x):
    return x @ np.asarray(p["kernel"]) + np.asarray(p["bias"])


def _block(p, x):
    return np.tanh(_linear(p["fc"], x)) + x


@pytest.fixture(scope="module")
def shared():
    """``shared(tanh(shared(x)))`` then a block called twice, ``blk(blk(h))``."""
    x = mg.Input(("batch", 8), name="x")
    inner = mg.Input(("batch", 8), name="h")
    blk = mg.Graph(inner, ops.tanh(ops.Linear(8, name="fc")(inner)) + inner, name="blk")
    layer = ops.Linear(8, name="shared")
    h = layer(ops.tanh(layer(x)))
    g = mg.Graph(x, blk(blk(h)), name="shared")
    params, state = mg.compile(g).init(jax.random.key(0))
    return g, params, state


def _run(graph, params, state):
    model = mg.compile(graph)
    new, new_state = model.init(jax.random.key(7), reuse=(params, state))
    out, _ = model.apply(new, new_state, X)
    return np.asarray(out), new


def test_the_old_layer_called_again_in_a_further_calls_place_keeps_the_shared_weights(shared):
    g, params, state = shared
    g2 = g.replace("shared@1", lambda layer, x: ops.relu(layer(x)))
    assert [(n.name, n.layer) for n in g2.nodes][:4] == [
        ("x", "x"), ("shared", "shared"), ("tanh", "tanh"), ("shared@1", "shared")]
    out, new = _run(g2, params, state)
    assert sorted(new) == ["blk", "shared"]  # no weights of its own for shared@1
    p = params["shared"]
    h = np.maximum(_linear(p, np.tanh(_linear(p, X))), 0)
    np.testing.assert_allclose(out, _block(params["blk"], _block(params["blk"], h)),
                               rtol=1e-5, atol=1e-5)


def test_a_block_called_again_is_acted_on_by_its_own_path(shared):
    g, params, state = shared
    p, b = params["shared"], params["blk"]
    h = _linear(p, np.tanh(_linear(p, X)))
    doubled = g.insert_after("blk@1", lambda y: y * 2.0)
    np.testing.assert_allclose(_run(doubled, params, state)[0], 2 * _block(b, _block(b, h)),
                               rtol=1e-5, atol=1e-5)
    wrapped = g.replace("blk@1", lambda layer, y: layer(y) * 0.5)
    assert [(n.name, n.layer) for n in wrapped.nodes if n.name.startswith("blk")] == [
        ("blk", "blk"), ("blk@1", "blk")]
    out, new = _run(wrapped, params, state)
    assert sorted(new) == ["blk", "shared"]
    np.testing.assert_allclose(out, 0.5 * _block(b, _block(b, h)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(g.remove("blk@1"), params, state)[0], _block(b, h),
                               rtol=1e-5, atol=1e-5)
    # a path inside the further call: its layers are the block's, named under 'blk'
    with pytest.raises(mg.GraphError, match=r"'blk@1' calls block 'blk' again, sharing its "
                       r"weights: its layers are named under 'blk' \(blk/fc\)"):
        g.replace("blk@1/fc", lambda layer, y: ops.relu(y))


def test_a_first_call_taken_out_leaves_its_layer_listed_under_its_weights_path(shared):
    g, params, state = shared
    p, b = params["shared"], params["blk"]
    # the block's first call taken out: its second call is the block now
    g2 = g.remove("blk")
    assert [(n.name, n.layer) for n in g2.nodes][-1] == ("blk", "blk")
    assert g2.select("blk/*") == ["blk/fc", "blk/tanh", "blk/add"]
    assert "graph blk(%h" in str(g2)  # printed with its body
    h = _linear(p, np.tanh(_linear(p, X)))
    out, new = _run(g2, params, state)
    assert new["blk"]["fc"]["kernel"] is params["blk"]["fc"]["kernel"]
    np.testing.assert_allclose(out, _block(b, h), rtol=1e-5, atol=1e-5)
    # the layer's first call replaced by a layer of its own: its further call is 'shared'
    g3 = g.replace("shared", lambda layer, x: ops.Linear(8, name="first")(x))
    assert g3.select("shared*") == ["shared"]
    assert g3.node("shared").layer == "shared"
    g4 = g3.replace("shared", lambda layer, x: ops.relu(layer(x)))  # reachable by its path
    out, new = _run(g4, params, state)
    assert new["shared"]["kernel"] is params["shared"]["kernel"]
    h = np.maximum(_linear(p, np.tanh(_linear(new["first"], X))), 0)
    np.testing.assert_allclose(out, _block(b, _block(b, h)), rtol=1e-5, atol=1e-5)


def test_replacing_the_tied_head_calls_the_embedding_as_the_head_does():
    """``replace("wte@1", lambda layer, h: ...)``: ``layer(h)`` is the tied head's
    ``wte.attend(h)`` (``h @ wte.T``), on the same weights."""
    g = mg.models.gpt2({"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 40, "n_positions": 16})
    seen = []

    def doubled(layer, h):
        seen.append((layer.features, layer.num_embeddings))   # the embedding's attributes
        return layer(h) * 2

    changed = g.replace("wte@1", doubled)
    assert seen == [(16, 40)] and changed.node("wte@1").layer == "wte"
    model, base = mg.compile(changed), mg.compile(g)
    params, state = base.init(jax.random.key(0))
    ids = np.array([[1, 5, 7, 39]], np.int32)
    hidden = base.apply(params, state, ids, inference_mode=True, capture="ln_f")[2]["ln_f"]
    want = 2 * np.asarray(hidden) @ np.asarray(params["wte"]["embedding"]).T
    np.testing.assert_allclose(model.apply(params, state, ids, inference_mode=True)[0], want,
                               rtol=1e-5, atol=1e-5)
