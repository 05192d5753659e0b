"""MultiHeadAttention's formulation (2-d projections over the heads' columns, the
attention dots heads first, ``docs/performance.md``): float32 outputs and gradients
against a float64 NumPy reference (``_reference_layers.multi_head_attention``, per
batch element and head with explicit loops; its gradients by central differences in
float64). Bounds: outputs within 2e-6 absolute and relative to the reference's
magnitude; gradients within 1e-4 of the largest entry of the weight's gradient or of the
input's (the key bias's gradient is zero: softmax ignores it) (float32 rounding of
sums of a few dozen terms, far below the finite differences' own error in float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

import _reference_layers as lref

B, L, D, HEADS, HEAD_DIM = 2, 5, 8, 2, 4


def _model(causal: bool):
    x = mg.Input(("batch", L, D), name="x")
    mask = ops.causal_mask(x) if causal else None
    mha = ops.MultiHeadAttention(HEADS, head_dim=HEAD_DIM, name="mha")
    return mg.compile(mg.Graph(x, mha(x) if mask is None else mha(x, mask=mask)))


def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    flat, out = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = f(x)
        flat[i] = keep - eps
        down = f(x)
        flat[i] = keep
        out[i] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("causal", [True], ids=["causal"])
def test_outputs_and_gradients_match_a_float64_reference(causal):
    model = _model(causal)
    params, state = model.init(jax.random.key(0))
    # biases non-zero, so that their gradients and adds are checked too
    params = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(jax.random.key(3), v.shape), params)
    x = np.asarray(jax.random.normal(jax.random.key(1), (B, L, D)), np.float32)
    cot = np.asarray(jax.random.normal(jax.random.key(2), (B, L, D)), np.float64)
    mask = lref.causal(L) if causal else None

    got = np.asarray(model.apply(params, state, x)[0])
    p64 = jax.tree.map(lambda v: np.asarray(v, np.float64), params)["mha"]
    want = lref.multi_head_attention(x, x, p64, mask)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())

    def loss(p, v):
        return jnp.sum(model.apply(p, state, v)[0] * cot)

    g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, x)
    x64 = np.asarray(x, np.float64)
    want_x = _numeric_grad(lambda v: np.sum(lref.multi_head_attention(v, v, p64, mask) * cot), x64.copy())
    scale = np.abs(want_x).max()
    np.testing.assert_allclose(np.asarray(g_x), want_x, atol=1e-4 * scale)
    for proj in ("query", "key", "value", "out"):
        for name in ("kernel", "bias"):
            def f(w, proj=proj, name=name):
                q = {k: dict(v) for k, v in p64.items()}
                q[proj][name] = w
                return np.sum(lref.multi_head_attention(x64, x64, q, mask) * cot)

            want_w = _numeric_grad(f, p64[proj][name].copy())
            got_w = np.asarray(g_params["mha"][proj][name])
            np.testing.assert_allclose(got_w, want_w, atol=1e-4 * max(np.abs(want_w).max(), scale),
                                       err_msg=f"{proj}/{name}")
