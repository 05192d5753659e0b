"""The aten family's 1D and 3D pooling, adaptive pooling, repeat_interleave,
recurrent (LSTM, GRU) and random operators against NumPy written here: each
operator built as a layer with ATen's arguments, compiled in a graph and run."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.aten import op_class

T, U, V = ("$tensor", 0), ("$tensor", 1), ("$tensor", 2)
rng = np.random.default_rng(0)


def _run(name, args, inputs, kwargs=None, **apply):
    layer = op_class(name)(args=args, kwargs=tuple(sorted((kwargs or {}).items())))
    xs = [mg.Input(a.shape, a.dtype, name=f"x{i}") for i, a in enumerate(inputs)]
    out = layer(*xs)
    model = mg.compile(mg.Graph(xs, list(out) if isinstance(out, tuple) else out, name="g"))
    got, _ = model.apply({}, {}, *inputs, **{"inference_mode": True, **apply})
    return [np.asarray(g) for g in got] if isinstance(got, (tuple, list)) else np.asarray(got)


def _pool(x, k, s, p, d, ceil, reduce, counted_pad=True, divisor=None):
    """PyTorch's pooling over the last len(k) axes, window by window: the output size
    (ceil_mode: one more window where it starts inside the input or its left padding),
    and for an average the taps inside the padded input (or the input) counted."""
    nd = len(k)
    spatial = x.shape[-nd:]
    outs = []
    for n, ki, si, pi, di in zip(spatial, k, s, p, d):
        span = di * (ki - 1) + 1
        o = -(-(n + 2 * pi - span) // si) + 1 if ceil else (n + 2 * pi - span) // si + 1
        if ceil and (o - 1) * si >= n + pi:
            o -= 1
        outs.append(o)
    y = np.zeros(x.shape[:-nd] + tuple(outs), np.float64)
    index = np.zeros(y.shape, np.int64)
    for pos in itertools.product(*(range(o) for o in outs)):
        taps = [[pi * 0 + q * si - pi + t * di for t in range(ki)]
                for q, si, pi, di, ki in zip(pos, s, p, d, k)]
        vals, ids, count = [], [], 0
        for tap in itertools.product(*taps):
            inside = all(0 <= t < n for t, n in zip(tap, spatial))
            in_pad = all(-pi <= t < n + pi for t, n, pi in zip(tap, spatial, p))
            count += in_pad if counted_pad else inside
            if inside:
                vals.append(x[(Ellipsis,) + tap])
                ids.append(np.ravel_multi_index(tap, spatial))
        stacked = np.stack(vals, -1)
        if reduce == "max":
            first = stacked.argmax(-1)
            y[(Ellipsis,) + pos] = stacked.max(-1)
            index[(Ellipsis,) + pos] = np.asarray(ids)[first]
        else:
            y[(Ellipsis,) + pos] = stacked.sum(-1) / (divisor or count)
    return y, index


X1 = np.maximum(rng.standard_normal((2, 3, 12)), 0).astype(np.float32)  # ties at 0
X3 = np.maximum(rng.standard_normal((2, 2, 7, 8, 9)), 0).astype(np.float32)


@pytest.mark.parametrize("x,k,s,p,d,ceil", [
    (X1, (3,), (2,), (1,), (1,), True), (X1[:, :, :11], (2,), (2,), (0,), (2,), False),
    (X3, (3, 3, 3), (2, 2, 2), (1, 1, 1), (2, 2, 2), True), (X3, (2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 1, 1), False),
])
def test_max_pool_1d_3d_and_indices(x, k, s, p, d, ceil):
    nd = len(k)
    y, index = _pool(x, k, s, p, d, ceil, "max")
    got = _run(f"aten.max_pool{nd}d.default", (T, k, s, p, d, ceil), [x])
    np.testing.assert_array_equal(got, y.astype(np.float32))
    got, got_index = _run(f"aten.max_pool{nd}d_with_indices.default", (T, k, s, p, d, ceil), [x])
    np.testing.assert_array_equal(got, y.astype(np.float32))
    np.testing.assert_array_equal(got_index, index)


@pytest.mark.parametrize("x,k,s,p,ceil,include,divisor", [
    (X1, (3,), (2,), (1,), True, True, None), (X1[:, :, :11], (3,), (2,), (1,), True, False, None),
    (X3, (3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None), (X3, (3, 2, 3), (2, 2, 1), (1, 0, 1), False, True, 5),
])
def test_avg_pool_1d_3d(x, k, s, p, ceil, include, divisor):
    nd = len(k)
    y, _ = _pool(x, k, s, p, (1,) * nd, ceil, "avg", include, divisor)
    args = (T, k, s, p, ceil, include) + ((divisor,) if nd == 3 else ())
    np.testing.assert_allclose(_run(f"aten.avg_pool{nd}d.default", args, [x]), y, rtol=1e-5, atol=1e-6)


def _adaptive(x, out, reduce):
    nd = len(out)
    spatial = x.shape[-nd:]
    y = np.zeros(x.shape[:-nd] + tuple(out), np.float64)
    index = np.zeros(y.shape, np.int64)
    for pos in itertools.product(*(range(o) for o in out)):
        box = tuple(slice(i * n // o, -(-(i + 1) * n // o)) for i, n, o in zip(pos, spatial, out))
        window = x[(Ellipsis,) + box].reshape(x.shape[:-nd] + (-1,))
        if reduce == "max":
            y[(Ellipsis,) + pos] = window.max(-1)
            local = np.unravel_index(window.argmax(-1), [b.stop - b.start for b in box])
            index[(Ellipsis,) + pos] = np.ravel_multi_index(
                tuple(lo + b.start for lo, b in zip(local, box)), spatial)
        else:
            y[(Ellipsis,) + pos] = window.mean(-1)
    return y, index


@pytest.mark.parametrize("x,out", [(X1[:, :, :11], (4,)), (X1[:, :, :10], (5,)), (X3, (2, 3, 4)),
                                   (X3[0], (3, 5, 2)), (X1[:, :, :11].reshape(2, 3, 11, 1)[:, :, :9], (4, 1))])
def test_adaptive_pools(x, out):
    nd = len(out)
    y, _ = _adaptive(x, out, "avg")
    np.testing.assert_allclose(_run(f"aten.adaptive_avg_pool{nd}d.default", (T, out), [x]), y,
                               rtol=1e-5, atol=1e-6)
    y, index = _adaptive(x, out, "max")
    got, got_index = _run(f"aten.adaptive_max_pool{nd}d.default", (T, out), [x])
    np.testing.assert_array_equal(got, y.astype(np.float32))
    np.testing.assert_array_equal(got_index, index)


def test_repeat_interleave():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run("aten.repeat_interleave.self_int", (T, 3, 1), [x]),
                                  np.repeat(x, 3, axis=1))
    np.testing.assert_array_equal(_run("aten.repeat_interleave.self_int", (T, 2), [x]),
                                  np.repeat(x.reshape(-1), 2))
    reps = np.array([1, 0, 3], np.int32)
    np.testing.assert_array_equal(
        _run("aten.repeat_interleave.self_Tensor", (T, U, 1), [x, reps], {"output_size": 4}),
        np.repeat(x, reps, axis=1))
    np.testing.assert_array_equal(
        _run("aten.repeat_interleave.Tensor", (T,), [reps], {"output_size": 4}), np.repeat(np.arange(3), reps))
    with pytest.raises(mg.GraphError, match="no output_size"):
        _run("aten.repeat_interleave.self_Tensor", (T, U, 1), [x, reps])


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def _rnn_numpy(kind, x, states, weights, layers, bidirectional, batch_first):
    """PyTorch's LSTM / GRU, step by step in float64."""
    seq = x.swapaxes(0, 1) if batch_first else x
    directions = 2 if bidirectional else 1
    finals = [[] for _ in states]
    for layer in range(layers):
        outs = []
        for d in range(directions):
            w_ih, w_hh, b_ih, b_hh = weights[layer * directions + d]
            state = [s[layer * directions + d].astype(np.float64) for s in states]
            ys = [None] * len(seq)
            for t in (reversed(range(len(seq))) if d else range(len(seq))):
                gi, gh = seq[t] @ w_ih.T + b_ih, state[0] @ w_hh.T + b_hh
                if kind == "lstm":
                    i, f, g, o = np.split(gi + gh, 4, -1)
                    c = _sigmoid(f) * state[1] + _sigmoid(i) * np.tanh(g)
                    state = [_sigmoid(o) * np.tanh(c), c]
                else:
                    (ir, iz, i_n), (hr, hz, hn) = np.split(gi, 3, -1), np.split(gh, 3, -1)
                    r, z = _sigmoid(ir + hr), _sigmoid(iz + hz)
                    n = np.tanh(i_n + r * hn)
                    state = [(1 - z) * n + z * state[0]]
                ys[t] = state[0]
            outs.append(np.stack(ys))
            for i, s in enumerate(state):
                finals[i].append(s)
        seq = np.concatenate(outs, -1)
    return [seq.swapaxes(0, 1) if batch_first else seq] + [np.stack(f) for f in finals]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers,bidirectional,batch_first", [(1, False, False), (2, True, True)])
def test_recurrent_operators(kind, layers, bidirectional, batch_first):
    gates, hidden, features, batch, time = (4 if kind == "lstm" else 3), 4, 5, 3, 6
    directions = 2 if bidirectional else 1
    x = rng.standard_normal((batch, time, features) if batch_first else (time, batch, features))
    weights = []
    for layer in range(layers):
        for _ in range(directions):
            n_in = features if layer == 0 else hidden * directions
            weights.append([rng.standard_normal(s) * 0.5 for s in
                            [(gates * hidden, n_in), (gates * hidden, hidden), (gates * hidden,), (gates * hidden,)]])
    states = [rng.standard_normal((layers * directions, batch, hidden)) for _ in range(2 if kind == "lstm" else 1)]
    flat = [w for group in weights for w in group]
    inputs = [a.astype(np.float32) for a in [x] + states + flat]
    refs = [("$tensor", i) for i in range(len(inputs))]
    hx = tuple(refs[1:1 + len(states)]) if kind == "lstm" else refs[1]
    args = (refs[0], hx, tuple(refs[1 + len(states):]), True, layers, 0.0, False, bidirectional, batch_first)
    got = _run(f"aten.{kind}.input", args, inputs)
    expected = _rnn_numpy(kind, inputs[0].astype(np.float64),
                          [s.astype(np.float64) for s in inputs[1:1 + len(states)]],
                          [[w.astype(np.float32).astype(np.float64) for w in g] for g in weights],
                          layers, bidirectional, batch_first)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_random_operators_draw_from_the_key():
    x = np.zeros((50, 40), np.float32)
    u = _run("aten.rand_like.default", (T,), [x], rng=jax.random.key(0))
    assert u.shape == x.shape and (u >= 0).all() and (u < 1).all() and 0.45 < u.mean() < 0.55
    n = _run("aten.randn.default", ((2000,),), [], rng=jax.random.key(1))
    assert abs(n.mean()) < 0.1 and 0.9 < n.std() < 1.1
    r = _run("aten.randint.low", (3, 7, (500,)), [], rng=jax.random.key(2))
    assert r.dtype == np.int32 and set(np.unique(r)) == {3, 4, 5, 6}
    b = _run("aten.bernoulli.p", (T, 0.25), [x], rng=jax.random.key(3))
    assert set(np.unique(b)) == {0, 1} and 0.2 < b.mean() < 0.3
    probs = np.array([[0.0, 0.2, 0.8], [0.5, 0.5, 0.0]], np.float32)
    m = _run("aten.multinomial.default", (T, 2), [probs], rng=jax.random.key(4))
    assert sorted(m[0]) == [1, 2] and sorted(m[1]) == [0, 1]
    with pytest.raises(mg.GraphError, match=r"aten\.rand_like\.default draws random numbers in either mode"):
        _run("aten.rand_like.default", (T,), [x])


def test_alpha_dropout_keeps_selu_s_statistics_in_train_mode_only():
    x = rng.standard_normal((300, 300)).astype(np.float32)
    alpha, p = 1.7580993408473766, 0.2
    a = 1 / np.sqrt((alpha ** 2 * p + 1) * (1 - p))
    y = _run("aten.alpha_dropout.default", (T, p, True), [x], inference_mode=False, rng=jax.random.key(0))
    dropped = np.isclose(y, -alpha * a + alpha * a * p, atol=1e-6)
    assert 0.18 < dropped.mean() < 0.22
    np.testing.assert_allclose(y[~dropped], x[~dropped] * a + alpha * a * p, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_run("aten.alpha_dropout.default", (T, p, True), [x]), x)
    np.testing.assert_array_equal(_run("aten.alpha_dropout.default", (T, p, False), [x], inference_mode=False,
                                       rng=jax.random.key(0)), x)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    src = rng.standard_normal((6, 5)).astype(np.float32)
    index = rng.integers(0, 4, (6, 5)).astype(np.int32)
    expected = x.astype(np.float64).copy()
    for j in range(5):
        for row in range(4):
            taken = [src[i, j] for i in range(6) if index[i, j] == row]
            if not taken:
                continue
            values = ([x[row, j]] if include_self else []) + taken
            expected[row, j] = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max,
                                "amin": np.min}[reduce](values)
    got = _run("aten.scatter_reduce.two", (T, 0, U, V, reduce), [x, index, src], {"include_self": include_self})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")])
def test_cdist(p):
    a, b = rng.standard_normal((2, 6, 3)).astype(np.float32), rng.standard_normal((2, 4, 3)).astype(np.float32)
    diff = np.abs(a[:, :, None] - b[:, None]).astype(np.float64)
    expected = (diff != 0).sum(-1) if p == 0 else diff.max(-1) if p == np.inf else (diff ** p).sum(-1) ** (1 / p)
    np.testing.assert_allclose(_run("aten._cdist_forward.default", (T, U, p, None), [a, b]), expected,
                               rtol=1e-5, atol=1e-6)
