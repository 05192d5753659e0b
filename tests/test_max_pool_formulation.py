"""MaxPool's formulation (the window's maximum as a select over its taps, each a strided
slice; ``MaxPool._by_slices``) against a float64 NumPy reference written here, and
against ``lax.reduce_window``, which it replaced for windows of at most
``MAX_SLICED_TAPS`` taps.

The bound: none is needed. The maximum is one of the inputs, so the output equals the
reference exactly. Each input's gradient is the sum of the output gradients of the
windows whose first maximum it is (row-major order within a window, as
``select_and_scatter`` and PyTorch choose); with non-overlapping windows that is one
value, exact; with overlapping ones a float32 sum of at most ``taps`` values, within
``taps * eps * sum |g|`` of the float64 sum (eps = float32's machine epsilon). Against
``reduce_window`` the outputs and gradients are equal to the bit, ties, NaNs, bfloat16
and integers included.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pooling import pads as _pads
from _pooling import pool as _pool
from _pooling import reduce_window
from jax import lax

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ops.pooling import MAX_SLICED_TAPS

CASES = {
    "2x2": ((4, 8, 8, 3), dict(window=(2, 2))),
    "3x3 stride 2 SAME": ((4, 9, 9, 3), dict(window=(3, 3), strides=(2, 2), padding="SAME")),
    "3x3 stride 1 SAME": ((2, 9, 7, 3), dict(window=(3, 3), strides=(1, 1), padding="SAME")),
    "NCHW 2x2": ((4, 3, 8, 8), dict(window=(2, 2), data_format="NCHW")),
    "1D explicit pads": ((4, 10, 3), dict(window=(3,), strides=(2,), padding=((1, 2),))),
    "3D 2x2x2": ((2, 4, 6, 6, 3), dict(window=(2, 2, 2))),
    "2x3 strides 1,2": ((4, 7, 7, 2), dict(window=(2, 3), strides=(1, 2))),
}


def reference(x, g, window, strides, pads, channels_last=True):
    """float64: the pooled output, the gradient of ``sum(g * y)`` and the sum of the
    ``|g|`` each input's gradient adds up, by loops over the windows (padding is -inf;
    the first maximum in row-major order takes the gradient)."""
    x = np.asarray(x, np.float64)
    if not channels_last:
        x, g = np.moveaxis(x, 1, -1), np.moveaxis(np.asarray(g, np.float64), 1, -1)
    g = np.asarray(g, np.float64)
    n = len(window)
    xp = np.pad(x, [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
    counts = [(xp.shape[1 + i] - window[i]) // strides[i] + 1 for i in range(n)]
    y = np.empty((x.shape[0], *counts, x.shape[-1]))
    dxp, absp = np.zeros_like(xp), np.zeros_like(xp)
    for b, c in itertools.product(range(x.shape[0]), range(x.shape[-1])):
        for out in itertools.product(*(range(k) for k in counts)):
            best, where = -np.inf, None
            for tap in itertools.product(*(range(w) for w in window)):
                at = tuple(o * s + t for o, s, t in zip(out, strides, tap))
                v = xp[(b, *at, c)]
                if where is None or v > best:
                    best, where = v, at
            y[(b, *out, c)] = best
            dxp[(b, *where, c)] += g[(b, *out, c)]
            absp[(b, *where, c)] += abs(g[(b, *out, c)])
    crop = (slice(None), *(slice(lo, xp.shape[1 + i] - hi) for i, (lo, hi) in enumerate(pads)))
    dx, dx_abs = dxp[crop], absp[crop]
    if not channels_last:
        y, dx, dx_abs = (np.moveaxis(a, -1, 1) for a in (y, dx, dx_abs))
    return y, dx, dx_abs


def _reduce_window(layer, x):
    init = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else
                    np.iinfo(x.dtype).min, x.dtype)
    return reduce_window(layer, x, init, lax.max)


def _ties(shape, dtype="float32", seed=0):
    """Values with many ties: zeros (as after a ReLU) and small integers."""
    x = jax.random.normal(jax.random.key(seed), shape)
    return jnp.where(x > 0.3, jnp.round(2 * x), 0.0).astype(dtype)


@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_equal_the_float64_reference(case):
    shape, kw = CASES[case]
    layer = ops.MaxPool(**kw)
    assert layer._by_slices(shape)
    x = jax.random.normal(jax.random.key(1), shape)
    for values in (x, _ties(shape)):
        y, vjp = jax.vjp(lambda v: _pool(layer, v), values)
        g = jax.random.normal(jax.random.key(2), y.shape)
        (dx,) = vjp(g)
        y64, dx64, dx_abs = reference(values, g, layer.window, layer.strides,
                                      _pads(layer, shape), layer.channels_last)
        np.testing.assert_array_equal(np.asarray(y, np.float64), y64)
        taps = int(np.prod(layer.window))
        eps = float(np.finfo(np.float32).eps)
        assert np.all(np.abs(np.asarray(dx, np.float64) - dx64) <= taps * eps * dx_abs), case
        if layer.window == layer.strides:  # non-overlapping: one gradient each, exact
            np.testing.assert_array_equal(np.asarray(dx, np.float64), dx64)


@pytest.mark.parametrize("case,dtype", [(case, "float32") for case in CASES]
                         + [("3x3 stride 2 SAME", d) for d in ("bfloat16", "float16", "int32")]
                         + [("NCHW 2x2", d) for d in ("bfloat16", "int32")])
def test_equal_to_reduce_window_to_the_bit(case, dtype):
    shape, kw = CASES[case]
    layer = ops.MaxPool(**kw)
    x = _ties(shape, dtype)
    y, want = _pool(layer, x), _reduce_window(layer, x)
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    if dtype == "int32":
        return
    def loss(pool):
        return lambda v: jnp.sum(jnp.sin(pool(layer, v).astype(jnp.float32)))
    got = jax.jit(jax.grad(loss(_pool)))(x)
    ref = jax.jit(jax.grad(loss(_reduce_window)))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_a_nan_propagates_as_reduce_windows_maximum():
    shape, kw = CASES["3x3 stride 2 SAME"]
    layer = ops.MaxPool(**kw)
    x = jax.random.normal(jax.random.key(3), shape).at[0, 3, 3, 0].set(jnp.nan)
    y = np.asarray(_pool(layer, x))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(np.asarray(_reduce_window(layer, x))))
    assert np.isnan(y).sum() == 4  # the four windows that hold it (2 x 2 starts)
    np.testing.assert_array_equal(y[~np.isnan(y)], np.asarray(_reduce_window(layer, x))[~np.isnan(y)])


def test_forward_mode_and_second_order_work():
    """Written as selects, not a custom rule: jvp and the Hessian-vector product of a
    pooled model work as with ``reduce_window``."""
    shape, kw = CASES["3x3 stride 2 SAME"]
    layer = ops.MaxPool(**kw)
    x = jax.random.normal(jax.random.key(4), shape)
    t = jax.random.normal(jax.random.key(5), shape)
    for pool in (_pool, _reduce_window):
        f = lambda v, pool=pool: jnp.sum(pool(layer, v) ** 3)
        _, tangent = jax.jvp(lambda v, pool=pool: pool(layer, v), (x,), (t,))
        hvp = jax.jvp(jax.grad(f), (x,), (t,))[1]
        if pool is _pool:
            ours = (tangent, hvp)
    np.testing.assert_allclose(np.asarray(ours[0]), np.asarray(tangent), rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(ours[1]), np.asarray(hvp), rtol=1e-6)


def test_symbolic_dims_and_large_windows_keep_reduce_window():
    big = ops.MaxPool((4, 4))
    assert 4 * 4 > MAX_SLICED_TAPS and not big._by_slices((8, 16, 16, 3))
    x = jax.random.normal(jax.random.key(6), (2, 16, 16, 3))
    np.testing.assert_array_equal(np.asarray(_pool(big, x)), np.asarray(_reduce_window(big, x)))
    # a graph with a symbolic batch exports, and the exported call equals the model's
    inp = mg.Input(("batch", 8, 8, 3), name="x")
    model = mg.compile(mg.Graph(inp, ops.MaxPool((3, 3), strides=2, padding="SAME")(inp)))
    params, state = model.init(jax.random.key(0))
    exported = model.export()
    x = jax.random.normal(jax.random.key(7), (5, 8, 8, 3))
    np.testing.assert_array_equal(np.asarray(exported.call(params, state, x)[0]),
                                  np.asarray(model.apply(params, state, x)[0]))
    assert not ops.MaxPool((2, 2))._by_slices(mg.Input(("b", "h", 8, 3)).spec.shape)
