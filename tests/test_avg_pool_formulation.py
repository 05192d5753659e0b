"""AvgPool's means (``ops.pooling.window_mean``: where every window divides by one
number, the sum of the window's taps, each a strided slice, for windows of at most
``MAX_SLICED_TAPS`` taps; else ``reduce_window``'s sums over constant counts) against
a float64 NumPy reference written here; the counts without ``count_include_pad``;
and the PyTorch importer's ``avg_pool2d`` with ``ceil_mode``, which it now honours.

The bound: a window's float32 sum of at most ``taps`` values is within
``taps * eps * sum |x|`` of the float64 sum (eps: float32's machine epsilon), and so is
each input's gradient, a sum of at most ``taps`` output gradients (divided by the
counts, exact in float64).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pooling import pads as _pads
from _pooling import pool as _pool

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.aten import op_class
from mlaxgraph.ops.pooling import MAX_SLICED_TAPS, window_counts

EPS = float(np.finfo(np.float32).eps)

CASES = {
    "2x2": ((4, 8, 8, 3), dict(window=(2, 2))),
    "3x3 stride 2 SAME": ((4, 9, 9, 3), dict(window=(3, 3), strides=(2, 2), padding="SAME")),
    "3x3 stride 2 SAME, pads not counted": ((4, 9, 9, 3), dict(
        window=(3, 3), strides=(2, 2), padding="SAME", count_include_pad=False)),
    "3x3 stride 1 SAME, pads not counted": ((2, 7, 6, 3), dict(
        window=(3, 3), strides=(1, 1), padding="SAME", count_include_pad=False)),
    "NCHW 3x3 explicit pads": ((2, 3, 8, 7), dict(window=(3, 3), strides=(2, 1),
                                                  padding=((1, 1), (0, 2)), data_format="NCHW")),
    "1D explicit pads, not counted": ((4, 10, 3), dict(window=(3,), strides=(2,), padding=((1, 2),),
                                                       count_include_pad=False)),
    "3D 2x2x2": ((2, 4, 6, 6, 3), dict(window=(2, 2, 2))),
}


def reference(x, g, window, strides, pads, count_include_pad, channels_last=True):
    """float64: the pooled output, the gradient of ``sum(g * y)``, and the bounds' sums
    (``sum |x|`` per window, ``sum |g| / count`` per input), by loops over the windows."""
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    if not channels_last:
        x, g = np.moveaxis(x, 1, -1), np.moveaxis(g, 1, -1)
    spatial = x.shape[1:-1]
    counts = [(n + lo + hi - w) // s + 1 for n, (lo, hi), w, s in zip(spatial, pads, window, strides)]
    y, y_abs = np.zeros((x.shape[0], *counts, x.shape[-1])), None
    y_abs = np.zeros_like(y)
    dx, dx_abs = np.zeros_like(x), np.zeros_like(x)
    for out in itertools.product(*(range(k) for k in counts)):
        taps = [tuple(o * s + t - lo for o, s, t, (lo, _) in zip(out, strides, tap, pads))
                for tap in itertools.product(*(range(w) for w in window))]
        inside = [at for at in taps if all(0 <= i < n for i, n in zip(at, spatial))]
        count = len(taps) if count_include_pad else len(inside)
        for at in inside:
            y[(slice(None), *out)] += x[(slice(None), *at)] / count
            y_abs[(slice(None), *out)] += np.abs(x[(slice(None), *at)]) / count
            dx[(slice(None), *at)] += g[(slice(None), *out)] / count
            dx_abs[(slice(None), *at)] += np.abs(g[(slice(None), *out)]) / count
    if not channels_last:
        y, y_abs, dx, dx_abs = (np.moveaxis(a, -1, 1) for a in (y, y_abs, dx, dx_abs))
    return y, y_abs, dx, dx_abs


@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_are_within_the_bound_of_the_float64_reference(case):
    shape, kw = CASES[case]
    layer = ops.AvgPool(**kw)
    assert int(np.prod(layer.window)) <= MAX_SLICED_TAPS
    x = jax.random.normal(jax.random.key(1), shape)
    y, vjp = jax.vjp(jax.jit(lambda v: _pool(layer, v)), x)
    g = jax.random.normal(jax.random.key(2), y.shape)
    (dx,) = vjp(g)
    y64, y_abs, dx64, dx_abs = reference(x, g, layer.window, layer.strides, _pads(layer, shape),
                                         layer.count_include_pad, layer.channels_last)
    taps = int(np.prod(layer.window))
    # the division adds one rounding: within (taps + 1) * eps of the magnitudes summed
    assert np.all(np.abs(np.asarray(y, np.float64) - y64) <= (taps + 1) * EPS * y_abs), case
    assert np.all(np.abs(np.asarray(dx, np.float64) - dx64) <= (taps + 1) * EPS * dx_abs), case
    # one divisor: the slices, no reduce-window in the program or its gradient; counts
    # that differ (padding not counted): reduce_window's sums
    spatial = shape[1:-1] if layer.channels_last else shape[2:]
    counts = window_counts(spatial, layer.window, layer.strides, _pads(layer, shape),
                           counted=_pads(layer, shape) if layer.count_include_pad else None)
    text = jax.jit(jax.grad(lambda v: jnp.sum(_pool(layer, v) * g))).lower(x).as_text()
    assert ("reduce_window" in text) == (len(np.unique(counts)) > 1), case


def test_larger_windows_and_symbolic_extents_reduce_with_reduce_window():
    layer = ops.AvgPool((4, 4), strides=2, padding="SAME", count_include_pad=False)
    x = jax.random.normal(jax.random.key(3), (2, 9, 9, 3))
    assert "reduce_window" in jax.jit(lambda v: _pool(layer, v)).lower(x).as_text()
    g = jnp.ones((2, 5, 5, 3))
    y64, y_abs, _, _ = reference(x, g, layer.window, layer.strides, _pads(layer, x.shape), False)
    assert np.all(np.abs(np.asarray(_pool(layer, x), np.float64) - y64) <= 17 * EPS * y_abs)
    # symbolic spatial dims (jax.export): the counts are window sums of a ones mask
    small = ops.AvgPool((3, 3), strides=2, padding="SAME", count_include_pad=False)
    h, w = jax.export.symbolic_shape("h, w")
    spec = jax.ShapeDtypeStruct((2, h, w, 3), jnp.float32)
    exported = jax.export.export(jax.jit(lambda v: _pool(small, v)))(spec)
    x = jax.random.normal(jax.random.key(4), (2, 9, 7, 3))
    y64, y_abs, _, _ = reference(x, jnp.ones((2, 5, 4, 3)), small.window, small.strides,
                                 _pads(small, x.shape), False)
    assert np.all(np.abs(np.asarray(exported.call(x), np.float64) - y64) <= 10 * EPS * y_abs)


def test_counts_without_the_padding_are_the_real_elements_of_each_window():
    # 5 inputs, window 3, stride 2, one pad each side: windows at -1..1, 1..3, 3..5
    np.testing.assert_array_equal(window_counts((5,), (3,), (2,), [(1, 1)]), [2, 3, 2])
    # the explicit padding counted, ceil_mode's room (the high side's extra 1) not:
    # windows at -1..1, 1..3, 3..5, counted from -1 to 4
    np.testing.assert_array_equal(window_counts((4,), (3,), (2,), [(1, 2)], counted=[(1, 1)]),
                                  [3, 3, 2])
    # dilation 2: taps -1, 1, 3 and 1, 3, 5 of 5 inputs
    np.testing.assert_array_equal(window_counts((5,), (3,), (2,), [(1, 1)], (2,)), [2, 2])
    two = window_counts((5, 4), (3, 2), (2, 2), [(1, 1), (0, 0)])
    np.testing.assert_array_equal(two, np.multiply.outer([2, 3, 2], [2, 2]))


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_torch_avg_pool2d_with_ceil_mode_follows_pytorchs_rule(count_include_pad):
    """PyTorch's ceil_mode: a last window that starts inside the padded input is kept,
    and the room it reaches past the padding never counts in the divisor."""
    x = np.asarray(jax.random.normal(jax.random.key(5), (2, 3, 8, 6)))
    layer = op_class("aten.avg_pool2d.default")(
        args=(("$tensor", 0), (3, 3), (2, 2), (1, 1), True, count_include_pad))
    inp = mg.Input(x.shape, name="x")
    y, _ = mg.compile(mg.Graph(inp, layer(inp), name="g")).apply({}, {}, x, inference_mode=True)
    assert y.shape == (2, 3, 5, 4)  # ceil((8 + 2 - 3) / 2) + 1 = 5, ceil((6 + 2 - 3) / 2) + 1 = 4
    want = np.zeros(y.shape)
    for i, j in itertools.product(range(5), range(4)):
        rows = range(2 * i - 1, 2 * i + 2)
        cols = range(2 * j - 1, 2 * j + 2)
        inside = [(r, c) for r in rows for c in cols if 0 <= r < 8 and 0 <= c < 6]
        # PyTorch's divisor with count_include_pad: the window clipped to the padded input
        padded = [(r, c) for r in rows for c in cols if -1 <= r < 9 and -1 <= c < 7]
        divisor = len(padded) if count_include_pad else len(inside)
        want[:, :, i, j] = sum(x[:, :, r, c] for r, c in inside) / divisor
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6, atol=1e-6)
