"""The ``aten`` family's recurrent operators: ``nn.LSTM`` (``aten.lstm.input``),
``nn.GRU`` (``aten.gru.input``) and ``nn.RNN`` (``aten.rnn_tanh.input``,
``aten.rnn_relu.input``), in ATen's signatures, as PyTorch computes them.

Each takes the module's weights as a list, per layer and direction ``weight_ih``,
``weight_hh``, then ``bias_ih``, ``bias_hh`` (``has_biases``) and the LSTM's
``weight_hr`` (``proj_size``); the initial states (``h0``, and the LSTM's ``c0``) of
shape ``(layers * directions, batch, hidden)``; ``batch_first`` either way. A layer
reads the input projection of all steps at once, then scans the steps (``lax.scan``);
the reverse direction scans the sequence backwards; each layer's output (the
directions' concatenated) is the next one's input, dropped out by ``dropout`` between
layers in train mode (drawn from mlaxgraph's key, as ``nn.Dropout``).

The cells, PyTorch's (gate order i, f, g, o for LSTM; r, z, n for GRU, the reset
gate applied to ``h W_hn + b_hn``):

- LSTM: ``c' = f * c + i * g``, ``h' = o * tanh(c')`` (times ``weight_hr.T`` with a projection);
- GRU: ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``, ``h' = (h - n) * z + n``;
- RNN: ``h' = tanh(x W_ih + b_ih + h W_hh + b_hh)`` (or relu).

mlaxgraph's own ``ops.LSTM`` and ``ops.GRU`` start from zeros, in one direction, one
layer (the LSTM with one bias), so these are ATen operators reading the weights as
``param`` layers under their state-dict names (``lstm.weight_ih_l0``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.flops import size
from .layer import DRAWS, define
from .ops_nn import _dropped


def _dot(a, w):
    return jnp.matmul(a, w.T, precision="highest")


def _lstm_cell(x_w, state, w):
    h, c = state
    gates = x_w + _dot(h, w["w_hh"])
    if "b_hh" in w:
        gates = gates + w["b_hh"]
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    if "w_hr" in w:
        h = _dot(h, w["w_hr"])
    return (h, c), h


def _gru_cell(x_w, state, w):
    (h,) = state
    gh = _dot(h, w["w_hh"])
    if "b_hh" in w:
        gh = gh + w["b_hh"]
    xr, xz, xn = jnp.split(x_w, 3, axis=-1)
    hr, hz, hn = jnp.split(gh, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    h = (h - n) * z + n
    return (h,), h


def _rnn_cell(activation):
    def cell(x_w, state, w):
        (h,) = state
        pre = x_w + _dot(h, w["w_hh"])
        h = activation(pre + w["b_hh"] if "b_hh" in w else pre)
        return (h,), h
    return cell


def _weights(params: list, has_biases: bool, n_groups: int) -> list[dict]:
    """The weights of each (layer, direction), by name."""
    per = len(params) // n_groups
    names = ["w_ih", "w_hh"] + (["b_ih", "b_hh"] if has_biases else [])
    if per == len(names) + 1:  # an LSTM's projection (proj_size)
        names.append("w_hr")
    if per != len(names) or len(params) % n_groups:
        raise NotImplementedError(f"{len(params)} weights for {n_groups} layers and directions")
    return [dict(zip(names, params[g * per:(g + 1) * per])) for g in range(n_groups)]


def _run(cell, x, states, params, has_biases, num_layers, dropout, train, bidirectional,
         batch_first, rng):
    """The output sequence and each state's final value per layer and direction."""
    directions = 2 if bidirectional else 1
    groups = _weights(list(params), bool(has_biases), num_layers * directions)
    seq = jnp.swapaxes(x, 0, 1) if batch_first else x  # (time, batch, features)
    finals: list[tuple] = []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            w = groups[layer * directions + d]
            x_w = _dot(seq, w["w_ih"])
            if "b_ih" in w:
                x_w = x_w + w["b_ih"]
            start = tuple(s[layer * directions + d] for s in states)
            final, ys = lax.scan(lambda c, xt, w=w: cell(xt, c, w), start,
                                 jnp.flip(x_w, 0) if d else x_w)
            outs.append(jnp.flip(ys, 0) if d else ys)
            finals.append(final)
        seq = jnp.concatenate(outs, -1) if directions > 1 else outs[0]
        if train and dropout and layer < num_layers - 1 and rng is not None:
            seq = _dropped(seq, dropout, jax.random.fold_in(rng, layer), seq.shape)
    out = jnp.swapaxes(seq, 0, 1) if batch_first else seq
    return (out,) + tuple(jnp.stack([f[i] for f in finals]) for i in range(len(states)))


def _flops(gate_flops: int):
    """Per step and batch element: the input and recurrent products, the gates."""
    def rule(inputs, outputs, args):
        out = outputs[0]
        projections = sum(2 * size(w.shape) for w in inputs[len(inputs) - _n_weights(args):]
                          if len(w.shape) == 2)
        steps = size(out.shape[:2])
        return steps * projections + gate_flops * size(out.shape)
    return rule


def _n_weights(args) -> int:
    return len(args[2]) if len(args) > 2 and isinstance(args[2], tuple) else 0


def _draws(args, kwargs) -> bool:
    """A call drops out between layers: train mode, ``dropout > 0``, more than one layer."""
    return len(args) > 6 and args[6] is True and isinstance(args[5], (int, float)) and \
        args[5] > 0 and isinstance(args[4], int) and args[4] > 1


@define("aten.lstm.input", flops=_flops(12), random=True)
def _lstm(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
          rng=None):
    return _run(_lstm_cell, x, tuple(hx), params, has_biases, num_layers, dropout, train,
                bidirectional, batch_first, rng)


@define("aten.gru.input", flops=_flops(12), random=True)
def _gru(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
         rng=None):
    return _run(_gru_cell, x, (hx,), params, has_biases, num_layers, dropout, train,
                bidirectional, batch_first, rng)


_ACTIVATIONS: dict[str, Any] = {"rnn_tanh": jnp.tanh, "rnn_relu": jax.nn.relu}
for _name, _fn in _ACTIVATIONS.items():
    define(f"aten.{_name}.input", flops=_flops(2), random=True)(
        lambda x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
        rng=None, fn=_fn: _run(_rnn_cell(fn), x, (hx,), params, has_biases, num_layers, dropout,
                               train, bidirectional, batch_first, rng))
for _name in ("aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input"):
    DRAWS[_name] = _draws
