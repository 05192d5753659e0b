"""The example graphs of ``mlaxgraph.examples`` -- the ResNet basic block, the pre-norm
Transformer encoder block (plain, causal, and with dropout) and the LSTM sequence
classifier -- built, compiled, initialized by ``model.init`` and run, against NumPy
references composed from the per-layer references (``_reference.py``,
``_reference_layers.py``) at two batch sizes; Dropout's training behaviour inside the
Transformer block; and a few optax steps of each that lower the loss on a fixed batch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph.examples import lstm_classifier, residual_block, transformer_block

import _helpers
import _reference as ref
import _reference_layers as lref
from _helpers import f64, shapes

RTOL = 1e-5
ATOL = 2e-5


close = functools.partial(_helpers.close, rtol=RTOL, atol=ATOL)


def perturbed(tree, seed, scale=0.3):
    """``tree`` plus ``scale`` times standard normals: init's values made less special
    (LayerNorm/BatchNorm scales no longer exactly one, biases no longer zero)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([jnp.asarray(np.asarray(a) + scale * ref.rand(a.shape, seed + i))
                              for i, a in enumerate(leaves)])


def init(model):
    # An "rbg" key: init takes any key implementation, and XLA on CPU compiles the rbg
    # generator several times faster than threefry. The checks do not depend on the key.
    return model.init(jax.random.key(0, impl="rbg"))


def train(loss_fn, params, state, steps, learning_rate, rng=None):
    """``steps`` Adam steps on a fixed batch, then one more evaluation of the loss;
    returns (the losses, one per step plus the final one, params, state).
    ``loss_fn(params, state, rng) -> (loss, new_state)``. Each loss is computed inside
    the one jitted step function (no other compilation), at the params before that
    step's update: ``losses[0]`` is the initial loss, ``losses[-1]`` the trained one."""
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, state, opt_state, rng):
        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, rng)
        # optax's Adam raises a float to an int32 step count, which strict promotion (the
        # test configuration, root conftest.py) rejects: the optimizer alone runs with
        # standard promotion; the model's apply stays strict.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, loss

    losses = []
    for _ in range(steps + 1):
        new_params, new_state, opt_state, loss = step(params, state, opt_state, rng)
        losses.append(float(loss))
        assert np.isfinite(losses[-1])
        if len(losses) <= steps:
            params, state = new_params, new_state
    return losses, params, state


# --- ResNet basic block --------------------------------------------------------------

CHANNELS = 4


@pytest.fixture(scope="module")
def block():
    model = mg.compile(residual_block(CHANNELS, "res"))
    params, state = init(model)
    return model, params, state


def block_reference(params, state, x, training=False):
    """conv_a -> bn_a -> relu -> conv_b -> bn_b, plus the input, relu. Returns (y, new_state)."""
    p, s = f64(params), f64(state)

    def bn(h, name):
        return ref.batch_norm(h, p[name]["scale"], p[name]["bias"], s[name]["mean"], s[name]["var"],
                              momentum=0.9, epsilon=1e-5, training=training)

    x = np.asarray(x, np.float64)
    h = ref.conv(x, p["conv_a"]["kernel"], padding="SAME")
    h, ma, va = bn(h, "bn_a")
    h = ref.relu(h)
    h = ref.conv(h, p["conv_b"]["kernel"], padding="SAME")
    h, mb, vb = bn(h, "bn_b")
    return ref.relu(h + x), {"bn_a": {"mean": ma, "var": va}, "bn_b": {"mean": mb, "var": vb}}


def test_residual_block_layout(block):
    model, params, state = block
    assert shapes(params) == {
        "conv_a": {"kernel": (CHANNELS, 3, 3, CHANNELS)},        # OHWI, no bias
        "bn_a": {"scale": (CHANNELS,), "bias": (CHANNELS,)},
        "conv_b": {"kernel": (CHANNELS, 3, 3, CHANNELS)},
        "bn_b": {"scale": (CHANNELS,), "bias": (CHANNELS,)},
    }
    assert shapes(state) == {"bn_a": {"mean": (CHANNELS,), "var": (CHANNELS,)},
                             "bn_b": {"mean": (CHANNELS,), "var": (CHANNELS,)}}
    assert str(model.graph.input_specs[0]) == f"f32[batch,height,width,{CHANNELS}]"   # symbolic H, W


def test_residual_block_inference_matches_numpy_at_two_batch_sizes(block):
    model, params, state = block
    params = perturbed(params, seed=1)
    # Running statistics away from init's zeros and ones (variances stay positive).
    state = jax.tree.map(jnp.asarray, {
        name: {"mean": 0.5 * ref.rand((CHANNELS,), seed=i),
               "var": ref.rand((CHANNELS,), seed=10 + i, low=0.5, high=2.0)}
        for i, name in enumerate(("bn_a", "bn_b"))})
    # Two batch sizes, and two image sizes: height and width are symbolic too.
    for shape, seed in (((1, 5, 5, CHANNELS), 2), ((3, 4, 6, CHANNELS), 3)):
        x = ref.rand(shape, seed)
        out, new_state = model.apply(params, state, x, inference_mode=True)
        want, _ = block_reference(params, state, x, training=False)
        assert out.shape == shape and out.dtype == np.float32
        close(out, want)
        jax.tree.map(np.testing.assert_array_equal, new_state, state)      # unchanged


def test_residual_block_training_state_and_optax_steps(block):
    model, params, state = block
    x = ref.rand((4, 5, 5, CHANNELS), seed=4)
    target = ref.rand((4, 5, 5, CHANNELS), seed=5, low=0.0, high=1.0)

    # One training-mode application against NumPy: batch statistics and the state update.
    out, new_state = model.apply(params, state, x)
    want, want_state = block_reference(params, state, x, training=True)
    close(out, want)
    jax.tree.map(lambda g, w: close(g, w, atol=1e-6), new_state, want_state)

    def loss_fn(params, state, rng):                 # training mode: batch statistics
        out, new_state = model.apply(params, state, jnp.asarray(x))
        return jnp.mean(jnp.square(out - target)), new_state

    losses, _, trained_state = train(loss_fn, params, state, steps=8, learning_rate=3e-2)
    assert losses[-1] < 0.5 * losses[0], losses
    # The running statistics moved with the training steps.
    assert not np.allclose(trained_state["bn_a"]["mean"], state["bn_a"]["mean"])


# --- Transformer encoder block -------------------------------------------------------

LENGTH, WIDTH, HEADS, MLP = 6, 16, 2, 32
RATE = 0.3


@pytest.fixture(scope="module")
def transformers():
    """name -> (model, params from init). One init: all variants have the same weights."""
    models = {"plain": mg.compile(transformer_block(LENGTH, WIDTH, HEADS, MLP)),
              "causal": mg.compile(transformer_block(LENGTH, WIDTH, HEADS, MLP, causal=True)),
              "dropout": mg.compile(transformer_block(LENGTH, WIDTH, HEADS, MLP, dropout=RATE))}
    params, state = init(models["plain"])
    assert state == {}
    return models, params


def mlp_branch(P, h):
    m = lref.layer_norm(h, **P["ln_mlp"])
    m = ref.gelu(m @ P["mlp_in"]["kernel"] + P["mlp_in"]["bias"])
    return m @ P["mlp_out"]["kernel"] + P["mlp_out"]["bias"]


def attention_branch(P, x, causal):
    h = lref.layer_norm(x, **P["ln_attention"])
    return lref.multi_head_attention(h, h, P["attention"], lref.causal(x.shape[1]) if causal else None)


def transformer_reference(params, x, causal=False):
    """``h = x + MHA(LN(x))``, ``y = h + Linear(gelu(Linear(LN(h))))`` (exact gelu)."""
    P = f64(params)
    x = np.asarray(x, np.float64)
    h = x + attention_branch(P, x, causal)
    return h + mlp_branch(P, h)


def test_transformer_layout(transformers):
    models, params = transformers
    head_dim = WIDTH // HEADS
    projection = {"kernel": (WIDTH, HEADS, head_dim), "bias": (HEADS, head_dim)}
    want = {
        "ln_attention": {"scale": (WIDTH,), "bias": (WIDTH,)},
        "attention": {"query": projection, "key": projection, "value": projection,
                      "out": {"kernel": (HEADS, head_dim, WIDTH), "bias": (WIDTH,)}},
        "ln_mlp": {"scale": (WIDTH,), "bias": (WIDTH,)},
        "mlp_in": {"kernel": (WIDTH, MLP), "bias": (MLP,)},
        "mlp_out": {"kernel": (MLP, WIDTH), "bias": (WIDTH,)},
    }
    assert shapes(params) == want
    for name in ("causal", "dropout"):        # the variants have the same weights
        assert shapes(jax.eval_shape(models[name].init, jax.random.key(0, impl="rbg"))[0]) == want


@pytest.mark.parametrize("variant", ["plain", "causal"])
def test_transformer_matches_numpy_at_two_batch_sizes(transformers, variant):
    models, params = transformers
    model = models[variant]
    params = perturbed(params, seed=6)
    for batch, seed in ((1, 7), (3, 8)):
        x = ref.rand((batch, LENGTH, WIDTH), seed)
        out, state = model.apply(params, {}, x)
        assert out.shape == (batch, LENGTH, WIDTH) and out.dtype == np.float32
        close(out, transformer_reference(params, x, causal=variant == "causal"))
        assert state == {}


def test_causal_block_does_not_look_ahead(transformers):
    models, params = transformers
    x = ref.rand((3, LENGTH, WIDTH), seed=9)
    later = x.copy()
    later[:, 4:] += ref.rand((3, 2, WIDTH), seed=19)       # change positions 4 and 5 only
    out, _ = models["causal"].apply(params, {}, x)
    out2, _ = models["causal"].apply(params, {}, later)
    np.testing.assert_array_equal(out2[:, :4], out[:, :4])
    assert not np.allclose(out2[:, 4:], out[:, 4:])
    plain, _ = models["plain"].apply(params, {}, x)
    plain2, _ = models["plain"].apply(params, {}, later)
    assert not np.allclose(plain2[:, :4], plain[:, :4])     # without the mask it does


def test_transformer_dropout_is_identity_in_inference(transformers):
    models, params = transformers
    params = perturbed(params, seed=6)
    model = models["dropout"]
    assert sorted(n.name for n in model.graph.nodes if n.op.op_name == "dropout") == [
        "attention_dropout", "mlp_dropout"]
    x = ref.rand((3, LENGTH, WIDTH), seed=11)
    out, _ = model.apply(params, {}, x, inference_mode=True)
    close(out, transformer_reference(params, x))


def test_transformer_dropout_in_training(transformers):
    models, params = transformers
    model = models["dropout"]
    params = perturbed(params, seed=6)
    x = ref.rand((3, LENGTH, WIDTH), seed=12)
    with pytest.raises(mg.GraphError, match="rng"):
        model.apply(params, {}, x)
    out, _ = model.apply(params, {}, x, rng=jax.random.key(1, impl="rbg"))
    again, _ = model.apply(params, {}, x, rng=jax.random.key(1, impl="rbg"))
    other, _ = model.apply(params, {}, x, rng=jax.random.key(2, impl="rbg"))
    np.testing.assert_array_equal(out, again)                 # same key, same masks
    assert np.isfinite(np.asarray(out)).all()
    assert not np.allclose(out, other)
    assert not np.allclose(out, transformer_reference(params, x), atol=1e-3)

    P = f64(params)
    x64 = np.asarray(x, np.float64)
    # With the attention's output projection zeroed, its branch is 0 (dropped or not),
    # so h = x exactly and y - x = dropout(MLP(LN(x))): each element 0 or m / (1 - rate).
    no_attention = {**params, "attention": {**params["attention"], "out": jax.tree.map(
        jnp.zeros_like, params["attention"]["out"])}}
    # With the MLP's output projection zeroed, y - x = dropout(MHA(LN(x))).
    no_mlp = {**params, "mlp_out": jax.tree.map(jnp.zeros_like, params["mlp_out"])}
    for weights, branch in ((no_attention, mlp_branch(P, x64)), (no_mlp, attention_branch(P, x64, False))):
        y, _ = model.apply(weights, {}, x, rng=jax.random.key(3, impl="rbg"))
        delta = np.asarray(y, np.float64) - x64
        kept = delta != 0
        close(delta[kept], branch[kept] / (1 - RATE), rtol=1e-5, atol=1e-5)
        assert np.all(np.abs(branch[~kept]) > 0)     # zeros are drops, not zero values
        n = kept.size
        assert abs(kept.mean() - (1 - RATE)) < 6 * np.sqrt(RATE * (1 - RATE) / n)


def test_transformer_optax_steps_with_dropout(transformers):
    models, params = transformers
    model = models["dropout"]
    x = ref.rand((4, LENGTH, WIDTH), seed=13)
    target = ref.rand((4, LENGTH, WIDTH), seed=14)

    def loss_fn(params, state, rng):                 # training mode: dropout active
        out, new_state = model.apply(params, state, jnp.asarray(x), rng=rng)
        return jnp.mean(jnp.square(out - target)), new_state

    # One fixed key: the same dropout masks at every step, so the loss is a function of
    # the params alone and the first and last losses compare.
    losses, trained, _ = train(loss_fn, params, {}, steps=8, learning_rate=1e-2,
                               rng=jax.random.key(5, impl="rbg"))
    assert losses[-1] < 0.6 * losses[0], losses
    # Also lower in inference mode (no dropout), on the batch-3 shape compiled above.
    x3, t3 = x[:3], target[:3]
    before, _ = model.apply(params, {}, x3, inference_mode=True)
    after, _ = model.apply(trained, {}, x3, inference_mode=True)
    assert np.mean(np.square(np.asarray(after) - t3)) < np.mean(np.square(np.asarray(before) - t3))


# --- LSTM sequence classifier --------------------------------------------------------

VOCAB, TOKENS, EMBED, HIDDEN, CLASSES = 20, 7, 8, 12, 3


@pytest.fixture(scope="module")
def classifier():
    model = mg.compile(lstm_classifier(VOCAB, TOKENS, EMBED, HIDDEN, CLASSES))
    params, state = init(model)
    return model, params, state


def classifier_reference(params, tokens):
    """Embedding rows -> LSTM (zero initial state) -> the final h -> Linear."""
    P = f64(params)
    h = lref.embedding(tokens, P["embed"]["embedding"])
    _, final_h, _ = lref.lstm(h, **P["lstm"])
    return final_h @ P["logits"]["kernel"] + P["logits"]["bias"]


def tokens(batch, seed):
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, TOKENS)).astype(np.int32)


def test_lstm_classifier_layout_and_init(classifier):
    model, params, state = classifier
    assert shapes(params) == {
        "embed": {"embedding": (VOCAB, EMBED)},
        "lstm": {"input_kernel": (EMBED, 4 * HIDDEN), "recurrent_kernel": (HIDDEN, 4 * HIDDEN),
                 "bias": (4 * HIDDEN,)},
        "logits": {"kernel": (HIDDEN, CLASSES), "bias": (CLASSES,)},
    }
    assert state == {}
    forget = np.zeros(4 * HIDDEN)
    forget[HIDDEN:2 * HIDDEN] = 1.0
    np.testing.assert_array_equal(params["lstm"]["bias"], forget)
    assert model.graph.input_specs[0].dtype == np.int32


def test_lstm_classifier_matches_numpy_at_two_batch_sizes(classifier):
    model, params, state = classifier
    for params_ in (params, perturbed(params, seed=15)):
        for batch, seed in ((1, 16), (5, 17)):
            ids = tokens(batch, seed)
            out, new_state = model.apply(params_, state, ids)
            assert out.shape == (batch, CLASSES) and out.dtype == np.float32
            close(out, classifier_reference(params_, ids))
            assert new_state == {}


def test_lstm_classifier_optax_steps(classifier):
    model, params, state = classifier
    ids = jnp.asarray(tokens(8, seed=18))
    labels = jnp.asarray(np.arange(8) % CLASSES)

    def loss_fn(params, state, rng):
        logits, new_state = model.apply(params, state, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new_state

    losses, _, _ = train(loss_fn, params, state, steps=10, learning_rate=5e-2)
    assert losses[-1] < 0.3 * losses[0], losses
