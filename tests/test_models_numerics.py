"""The example models (an MLP and a residual CNN with a nested block and Dropout) against
independent NumPy references that use the params ``model.init`` made; training-mode
BatchNorm state; gradients against finite differences; and the number of times ``apply``
is traced."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import mlp, residual_cnn

import _helpers
import _reference as ref
from _helpers import f64, shapes

RTOL = 1e-5
ATOL = 1e-5


close = functools.partial(_helpers.close, rtol=RTOL, atol=ATOL)


# --- the models, compiled and initialized once per module ----------------------------


# init gets an "rbg" key: init takes any key implementation, and XLA on CPU compiles the
# rbg generator several times faster than the default threefry (which takes seconds per
# rank-4 conv kernel on a loaded 2-core machine). The numbers do not depend on the key.


@pytest.fixture(scope="module")
def mlp_model():
    model = mg.compile(mlp())
    params, state = model.init(jax.random.key(0, impl="rbg"))
    return model, params, state


@pytest.fixture(scope="module")
def cnn_model():
    model = mg.compile(residual_cnn())
    params, state = model.init(jax.random.key(0, impl="rbg"))
    return model, params, state


# --- NumPy references ----------------------------------------------------------------


def mlp_reference(params, x):
    p = f64(params)
    h = np.asarray(x, np.float64)
    h = ref.relu(h @ p["dense"]["kernel"] + p["dense"]["bias"])
    h = ref.relu(h @ p["dense_1"]["kernel"] + p["dense_1"]["bias"])
    return h @ p["logits"]["kernel"] + p["logits"]["bias"]


def cnn_features(params, state, x, training):
    """The residual CNN up to the flattened features (before Dropout), and the new state."""
    p, s = f64(params), f64(state)

    def bn(h, weights, stats):
        return ref.batch_norm(h, weights["scale"], weights["bias"], stats["mean"], stats["var"],
                              momentum=0.9, epsilon=1e-5, training=training)

    h = ref.conv(x, p["stem"]["kernel"], p["stem"]["bias"], padding="SAME")
    h, m0, v0 = bn(h, p["stem_bn"], s["stem_bn"])
    h = ref.relu(h)
    r, rs = p["res1"], s["res1"]
    a = ref.conv(h, r["conv_a"]["kernel"], padding="SAME")
    a, ma, va = bn(a, r["bn_a"], rs["bn_a"])
    a = ref.relu(a)
    b = ref.conv(a, r["conv_b"]["kernel"], padding="SAME")
    b, mb, vb = bn(b, r["bn_b"], rs["bn_b"])
    h = ref.relu(b + h)
    h = ref.max_pool(h, (2, 2))
    feats = h.reshape(h.shape[0], -1)
    new_state = {"stem_bn": {"mean": m0, "var": v0},
                 "res1": {"bn_a": {"mean": ma, "var": va}, "bn_b": {"mean": mb, "var": vb}}}
    return feats, new_state


def cnn_reference(params, state, x, training=False):
    feats, new_state = cnn_features(params, state, x, training)
    p = f64(params)
    return feats @ p["logits"]["kernel"] + p["logits"]["bias"], new_state


def images(batch, seed):
    return ref.rand((batch, 8, 8, 1), seed=seed)


def check_model_gradients(graph, params, state, x, labels, rng=None, overrides=()):
    """``check_grads`` (order 1, reverse mode) of a cross-entropy loss through
    ``model.apply``, with respect to every parameter.

    The check compares the VJP with a central difference along one random direction in
    parameter space (about 10^5 dims here). With ReLU kinks and max-pool switches within
    reach of a step, only a tiny step is reliable (1e-7), and only float64 resolves it: so
    the same example graph is compiled with a float64 policy (BatchNorm overridden to
    float64 too, which the policy would otherwise run in float32), and given the float32
    params from ``init`` converted to float64. The input stays the graph's float32 input.
    """
    with jax.enable_x64(True):
        policy = mg.Policy(param_dtype="float64", compute_dtype="float64", overrides=dict(overrides))
        model = mg.compile(graph, policy)
        params64, state64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, state))
        onehot = jax.nn.one_hot(jnp.asarray(labels), 10, dtype=jnp.float64)
        xs = jnp.asarray(x)

        @jax.jit
        def loss(flat):
            logits, _ = model.apply(unravel(flat), state64, xs, rng=rng)
            assert logits.dtype == jnp.float64
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * onehot, axis=-1))

        # One flat vector of all params: check_grads' own arithmetic is then a few eager
        # ops on one array rather than a few per leaf (each one an XLA compilation).
        flat, unravel = ravel_pytree(params64)
        check_grads(loss, (flat,), order=1, modes=["rev"], eps=1e-7)


# --- MLP -----------------------------------------------------------------------------


def test_mlp_param_layout(mlp_model):
    _, params, state = mlp_model
    assert shapes(params) == {
        "dense": {"kernel": (784, 128), "bias": (128,)},
        "dense_1": {"kernel": (128, 64), "bias": (64,)},
        "logits": {"kernel": (64, 10), "bias": (10,)},
    }
    assert state == {}


def test_mlp_matches_numpy_at_two_batch_sizes(mlp_model):
    model, params, state = mlp_model
    for batch, seed in ((3, 1), (8, 2)):
        x = ref.rand((batch, 784), seed=seed)
        for inference_mode in (False, True):
            out, new_state = model.apply(params, state, x, inference_mode=inference_mode)
            assert out.shape == (batch, 10) and out.dtype == np.float32
            close(out, mlp_reference(params, x))
            assert new_state == {}


def test_mlp_gradients_match_finite_differences(mlp_model):
    _, params, _ = mlp_model
    check_model_gradients(mlp(), params, {}, ref.rand((4, 784), seed=3), [1, 7, 3, 0])


# --- residual CNN --------------------------------------------------------------------


def test_cnn_param_and_state_layout(cnn_model):
    _, params, state = cnn_model
    assert shapes(params) == {
        "stem": {"kernel": (16, 3, 3, 1), "bias": (16,)},                # OHWI
        "stem_bn": {"scale": (16,), "bias": (16,)},
        "res1": {                                                       # the nested block
            "conv_a": {"kernel": (16, 3, 3, 16)},
            "bn_a": {"scale": (16,), "bias": (16,)},
            "conv_b": {"kernel": (16, 3, 3, 16)},
            "bn_b": {"scale": (16,), "bias": (16,)},
        },
        "logits": {"kernel": (256, 10), "bias": (10,)},
    }
    assert shapes(state) == {
        "stem_bn": {"mean": (16,), "var": (16,)},
        "res1": {"bn_a": {"mean": (16,), "var": (16,)}, "bn_b": {"mean": (16,), "var": (16,)}},
    }
    assert all(a.dtype == np.float32 for a in jax.tree.leaves((params, state)))


def test_cnn_training_state_update_matches_numpy(cnn_model):
    model, params, state = cnn_model
    x = images(5, seed=4)
    out, new_state = model.apply(params, state, x, rng=jax.random.key(7))
    _, want_state = cnn_features(params, state, x, training=True)
    assert shapes(new_state) == shapes(state)
    jax.tree.map(lambda got, want: close(got, want, atol=1e-6), new_state, want_state)
    assert out.shape == (5, 10)


def test_cnn_training_output_matches_numpy_with_the_same_dropout(cnn_model):
    # The dropout mask comes from the model itself. The logits are linear in the features
    # after Dropout, so with a probe kernel holding ones at (10 c + j, j) and a zero bias,
    # logits[:, j] is feature 10 c + j: 26 calls (one compiled function, one key) read all
    # 256 features. They must be the NumPy features (batch statistics), each zeroed or
    # scaled by 1 / (1 - 0.1), and the real logits must be those features times the kernel.
    model, params, state = cnn_model
    x = images(5, seed=4)
    rng = jax.random.key(7)
    features = params["logits"]["kernel"].shape[0]
    dropped = np.zeros((5, features))
    for c in range(-(-features // 10)):
        probe = np.zeros((features, 10), np.float32)
        cols = [j for j in range(10) if 10 * c + j < features]
        probe[[10 * c + j for j in cols], cols] = 1.0
        p = {**params, "logits": {"kernel": jnp.asarray(probe), "bias": jnp.zeros(10, jnp.float32)}}
        out, _ = model.apply(p, state, x, rng=rng)
        dropped[:, [10 * c + j for j in cols]] = np.asarray(out)[:, cols]

    feats, _ = cnn_features(params, state, x, training=True)
    kept = dropped != 0
    close(dropped[kept], feats[kept] / 0.9)           # the others are dropped (zero)
    nonzero = feats != 0                              # (ReLU and max-pool leave exact zeros)
    assert nonzero.sum() > 500
    assert not np.any(kept & ~nonzero)
    assert abs(kept[nonzero].mean() - 0.9) < 6 * np.sqrt(0.09 / nonzero.sum())   # 6 sigma
    out, _ = model.apply(params, state, x, rng=rng)
    p = f64(params)
    close(out, dropped @ p["logits"]["kernel"] + p["logits"]["bias"])


def test_cnn_inference_matches_numpy_at_two_batch_sizes(cnn_model):
    model, params, state = cnn_model
    # Non-trivial running statistics: those of one training step.
    _, state = model.apply(params, state, images(5, seed=4), rng=jax.random.key(7))
    for batch, seed in ((2, 5), (5, 6)):
        x = images(batch, seed)
        out, new_state = model.apply(params, state, x, inference_mode=True)
        want, _ = cnn_reference(params, state, x, training=False)
        assert out.shape == (batch, 10) and out.dtype == np.float32
        close(out, want)
        jax.tree.map(np.testing.assert_array_equal, new_state, state)   # unchanged


def test_cnn_training_needs_rng(cnn_model):
    model, params, state = cnn_model
    with pytest.raises(mg.GraphError, match="rng"):
        model.apply(params, state, images(2, seed=1))


def test_cnn_gradients_match_finite_differences(cnn_model):
    # Training mode: BatchNorm on batch statistics, Dropout with a fixed key (so the loss
    # is a deterministic function of the params).
    _, params, state = cnn_model
    check_model_gradients(residual_cnn(), params, state, images(2, seed=8), [3, 9],
                          rng=jax.random.key(3),
                          overrides={"stem_bn": "float64", "bn_a": "float64", "bn_b": "float64"})


# --- tracing -------------------------------------------------------------------------


def test_apply_traces_once_per_input_shape_and_mode():
    traces = []

    def counted_relu(x):
        traces.append(x.shape)             # runs only while JAX traces
        return jax.nn.relu(x)

    x = mg.Input(("batch", 6), name="x")
    h = ops.F(counted_relu, name="counted")(ops.Linear(8, name="fc1")(x))
    h = ops.Dropout(0.2)(ops.BatchNorm(name="bn")(h))
    model = mg.compile(mg.Graph(x, ops.Linear(3, name="fc2")(h), name="counted"))
    params, state = jax.eval_shape(model.init, jax.random.key(0))   # (init is not the point)
    params, state = jax.tree.map(lambda a: jnp.full(a.shape, 0.5, a.dtype), (params, state))
    traces.clear()                         # shape inference traced it at build time

    for i in range(100):
        batch = (2, 5)[i % 2]
        inference_mode = (i // 2) % 2 == 1
        xs = jnp.full((batch, 6), float(i), jnp.float32)
        rng = None if inference_mode else jax.random.key(i)
        out, state = model.apply(params, state, xs, rng=rng, inference_mode=inference_mode)
        assert out.shape == (batch, 3)
    # (2 batch sizes) x (2 modes); the state fed back has the dtypes and shapes of init's.
    assert len(traces) == 4, traces
    assert model.apply._cache_size() == 4
