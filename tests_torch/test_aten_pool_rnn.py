"""mg.from_torch against PyTorch on 1D and 3D pooling (max, average, adaptive, with
indices), repeat_interleave, nn.LSTM / nn.GRU / nn.RNN and the random operators:
outputs and input gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mlaxgraph as mg


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _compare(module, *xs, train=False, exact=False, tol=1e-5, pick=None):
    """The imported module's first output and the input gradients against PyTorch's."""
    module.train(train)
    graph, params, state = mg.from_torch(module, xs)
    model = mg.compile(graph)
    pick = pick or (lambda out: out[0] if isinstance(out, (tuple, list)) else out)

    def ours(*vs):
        out = model.apply(params, state, *vs, inference_mode=not train)[0]
        return pick(out)
    got = np.asarray(ours(*[jnp.asarray(x.numpy()) for x in xs]))
    ts = [x.clone().requires_grad_(x.dtype.is_floating_point) for x in xs]
    theirs = pick(module(*ts))
    if exact:
        np.testing.assert_array_equal(got, theirs.detach().numpy())
    else:
        np.testing.assert_allclose(got, theirs.detach().numpy(), rtol=tol, atol=tol)
    if not theirs.dtype.is_floating_point:
        return graph
    g = torch.randn(theirs.shape)
    (theirs * g).sum().backward()
    grads = jax.grad(lambda *vs: jnp.sum(ours(*vs) * jnp.asarray(g.numpy())),
                     argnums=tuple(range(len(xs))))(*[jnp.asarray(x.numpy()) for x in xs])
    for ours_g, t in zip(grads, ts):
        np.testing.assert_allclose(np.asarray(ours_g), t.grad.numpy(), rtol=tol, atol=tol)
    return graph


POOLS = [
    (nn.MaxPool1d(3, 2, 1, ceil_mode=True), (2, 3, 12)),
    (nn.MaxPool1d(2, dilation=2), (2, 3, 11)),
    (nn.MaxPool1d(3, 2, 1), (3, 12)),  # unbatched
    (nn.MaxPool3d(3, 2, 1, dilation=2, ceil_mode=True), (2, 2, 9, 8, 7)),
    (nn.MaxPool3d(2), (1, 2, 5, 6, 7)),
    (nn.AvgPool1d(3, 2, 1, ceil_mode=True), (2, 3, 12)),
    (nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 11)),
    (nn.AvgPool3d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 2, 8, 7, 9)),
    (nn.AvgPool3d(3, 2, 1, divisor_override=5), (2, 2, 8, 7, 9)),
    (nn.AvgPool3d((2, 3, 1), (1, 2, 1)), (1, 2, 5, 7, 3)),
    (nn.AdaptiveAvgPool1d(4), (2, 3, 11)),
    (nn.AdaptiveAvgPool1d(5), (2, 3, 10)),
    (nn.AdaptiveAvgPool3d((2, 3, 4)), (2, 2, 7, 8, 9)),
    (nn.AdaptiveAvgPool3d(1), (2, 2, 5, 4, 3)),
    (nn.AdaptiveMaxPool1d(4), (2, 3, 11)),
    (nn.AdaptiveMaxPool2d((4, 5)), (2, 3, 9, 11)),
    (nn.AdaptiveMaxPool2d((3, 7)), (2, 3, 9, 7)),
    (nn.AdaptiveMaxPool3d((2, 3, 4)), (2, 2, 7, 8, 9)),
]


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("module,shape", POOLS, ids=[f"{type(m).__name__}-{i}" for i, (m, _) in enumerate(POOLS)])
def test_pooling_as_pytorch(module, shape, train):
    torch.manual_seed(0)
    relu = nn.Sequential(nn.ReLU(), module)  # ties (the zeros): the first maximum takes the gradient
    _compare(relu, torch.randn(*shape), train=train, exact="Max" in type(module).__name__)


@pytest.mark.parametrize("fn,shape", [
    (lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True)[1], (2, 3, 12)),
    (lambda x: F.max_pool3d(x, 3, 2, 1, dilation=2, return_indices=True)[1], (2, 2, 9, 8, 7)),
    (lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True)[1], (2, 3, 11)),
    (lambda x: F.adaptive_max_pool2d(x, (4, 5), return_indices=True)[1], (2, 3, 9, 11)),
    (lambda x: F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True)[1], (2, 2, 7, 8, 9)),
])
def test_pooling_indices_as_pytorch(fn, shape):
    torch.manual_seed(0)
    x = torch.relu(torch.randn(*shape))  # ties: the first maximum's index
    _compare(Fn(fn), x, exact=True)


@pytest.mark.parametrize("fn", [
    lambda x: x.repeat_interleave(3, dim=1),
    lambda x: x.repeat_interleave(2),
    lambda x: torch.repeat_interleave(x, 2, dim=-1),
    lambda x: x.repeat_interleave(torch.tensor([1, 0, 3]), dim=1, output_size=4),
    lambda x: x.repeat_interleave(torch.tensor([2]), dim=0, output_size=4),
])
def test_repeat_interleave_as_pytorch(fn):
    torch.manual_seed(0)
    _compare(Fn(fn), torch.randn(2, 3, 5), exact=True)


def test_repeat_interleave_by_values_without_output_size_is_named():
    with pytest.raises(mg.ShapeError, match="repeat_interleave.*depends on the data"):
        mg.from_torch(Fn(lambda x: x.repeat_interleave(torch.tensor([1, 2, 3]), dim=1)),
                      (torch.randn(2, 3, 5),))


RNNS = [
    lambda: nn.LSTM(5, 4),
    lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True),
    lambda: nn.LSTM(5, 4, num_layers=3, bias=False),
    lambda: nn.LSTM(5, 6, num_layers=2, proj_size=3, bidirectional=True, batch_first=True),
    lambda: nn.GRU(5, 4),
    lambda: nn.GRU(5, 4, num_layers=2, bidirectional=True, batch_first=True),
    lambda: nn.GRU(5, 4, bias=False, batch_first=True),
    lambda: nn.RNN(5, 4, num_layers=2, nonlinearity="relu", bidirectional=True),
    lambda: nn.RNN(5, 4, batch_first=True),
]


@pytest.mark.parametrize("given_state", [False, True])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("make", RNNS, ids=[f"rnn{i}" for i in range(len(RNNS))])
def test_recurrent_modules_as_pytorch(make, train, given_state):
    torch.manual_seed(0)
    rnn = make()
    layers, directions = rnn.num_layers, 2 if rnn.bidirectional else 1
    x = torch.randn(3, 7, 5)  # (batch, time) if batch_first, else (time, batch)
    batch = 3 if rnn.batch_first else 7
    out_h = rnn.proj_size if getattr(rnn, "proj_size", 0) else rnn.hidden_size
    states = ()
    if given_state:
        h0 = torch.randn(layers * directions, batch, out_h)
        states = (h0, torch.randn(layers * directions, batch, rnn.hidden_size)) \
            if isinstance(rnn, nn.LSTM) else (h0,)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, *s):
            out, final = self.rnn(x, (s if len(s) > 1 else s[0]) if s else None)
            finals = final if isinstance(final, tuple) else (final,)
            return (out,) + finals

    # the output, h_n (and c_n), flattened together
    graph = _compare(Wrap(), x, *states, train=train, tol=2e-5,
                     pick=lambda out: (torch.cat if isinstance(out[0], torch.Tensor) else jnp.concatenate)(
                         [o.reshape(-1) for o in out]))
    # the weights are param layers under their state-dict names
    names = {path.replace("/", ".") for path, node in graph.walk() if node.op.op_name == "param"}
    assert names == {f"rnn.{k}" for k in rnn.state_dict()}


def test_recurrent_dropout_draws_between_layers_in_train_mode():
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 4, num_layers=2, dropout=0.5).train()
    x = torch.randn(6, 3, 5)
    graph, params, state = mg.from_torch(lstm, (x,))
    assert mg.aten.inference_mode(graph) is False
    model = mg.compile(graph)
    a = model.apply(params, state, jnp.asarray(x.numpy()), rng=jax.random.key(0),
                    inference_mode=False)[0][0]
    b = model.apply(params, state, jnp.asarray(x.numpy()), rng=jax.random.key(1),
                    inference_mode=False)[0][0]
    assert not np.allclose(a, b)
    # in eval mode the module's own computation
    lstm.eval()
    expected = lstm(x)[0].detach().numpy()
    got = model.apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)[0][0]
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fn,check", [
    (lambda x: x + torch.rand_like(x), lambda d: (d >= 0).all() and (d < 1).all() and 0.4 < d.mean() < 0.6),
    (lambda x: x + torch.randn(x.shape), lambda d: abs(d.mean()) < 0.1 and 0.9 < d.std() < 1.1),
    (lambda x: x + torch.randint(2, 5, x.shape), lambda d: set(np.unique(np.round(d))) == {2, 3, 4}),
    (lambda x: torch.bernoulli(torch.full_like(x, 0.3)) + x, lambda d: 0.25 < d.mean() < 0.35),
])
def test_random_operators_draw_from_mlaxgraph_s_key(fn, check):
    x = torch.zeros(20, 100)
    graph, params, state = mg.from_torch(Fn(fn), (x,))
    model = mg.compile(graph)
    for mode in (True, False):
        out = np.asarray(model.apply(params, state, jnp.asarray(x.numpy()), rng=jax.random.key(0),
                                     inference_mode=mode)[0])
        assert check(out)
    with pytest.raises(mg.GraphError, match="draws random numbers in either mode.*pass rng="):
        model.apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)


def test_multinomial_and_alpha_dropout():
    probs = torch.tensor([[0.0, 0.2, 0.8], [0.5, 0.5, 0.0]])
    graph, params, state = mg.from_torch(Fn(lambda p: torch.multinomial(p, 2)), (probs,))
    model = mg.compile(graph)
    for seed in range(5):
        out = np.asarray(model.apply(params, state, jnp.asarray(probs.numpy()), rng=jax.random.key(seed),
                                     inference_mode=True)[0])
        assert sorted(out[0]) == [1, 2] and sorted(out[1]) == [0, 1]
    x = torch.randn(200, 200)
    drop = nn.AlphaDropout(0.2)
    graph, params, state = mg.from_torch(drop.train(), (x,))
    model = mg.compile(graph)
    got = np.asarray(model.apply(params, state, jnp.asarray(x.numpy()), rng=jax.random.key(0),
                                 inference_mode=False)[0])
    theirs = drop(x).numpy()
    # the same two affine maps of the input (kept) and the same constant (dropped)
    a = 1 / np.sqrt((1.7580993408473766 ** 2 * 0.2 + 1) * 0.8)
    dropped_value = -1.7580993408473766 * a + 1.7580993408473766 * a * 0.2
    for out in (got, theirs):
        dropped = np.isclose(out, dropped_value, atol=1e-6)
        assert 0.15 < dropped.mean() < 0.25
        np.testing.assert_allclose(out[~dropped], x.numpy()[~dropped] * a + 1.7580993408473766 * a * 0.2,
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(model.apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)[0]), x.numpy())


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_as_pytorch(reduce, include_self):
    torch.manual_seed(0)
    index = torch.randint(0, 4, (6, 5))
    module = Fn(lambda x, src: x.scatter_reduce(0, index, src, reduce, include_self=include_self))
    x, src = torch.randn(4, 5), torch.randn(6, 5)
    if reduce != "prod":  # JAX has no gradient of a product scattered to repeated indices
        _compare(module, x, src, exact=reduce != "mean", tol=1e-6)
        return
    graph, params, state = mg.from_torch(module, (x, src))
    got = mg.compile(graph).apply(params, state, jnp.asarray(x.numpy()), jnp.asarray(src.numpy()))[0]
    np.testing.assert_array_equal(np.asarray(got), module(x, src).numpy())


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")])
def test_cdist_as_pytorch(p):
    torch.manual_seed(0)
    module = Fn(lambda a, b: torch.cdist(a, b, p=p))
    a, b = torch.randn(2, 30, 7), torch.randn(2, 40, 7)
    graph, params, state = mg.from_torch(module, (a, b))
    got = mg.compile(graph).apply(params, state, jnp.asarray(a.numpy()), jnp.asarray(b.numpy()))[0]
    np.testing.assert_allclose(np.asarray(got), module(a, b).numpy(), rtol=1e-5, atol=1e-5)
