"""The ``onnx`` family's recurrent operators, RNN, GRU and LSTM, as ONNX specifies
them (gate orders ``zrh`` for GRU and ``iofc`` for LSTM, forward, reverse or
bidirectional, sequence lengths, clipping, named activations), each direction one
``lax.scan`` over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..core.errors import ShapeError
from ..ops.flops import size
from .layer import define

_ACTIVATIONS = {
    "sigmoid": lambda x, a, b: jax.nn.sigmoid(x),
    "tanh": lambda x, a, b: jnp.tanh(x),
    "relu": lambda x, a, b: jax.nn.relu(x),
    "leakyrelu": lambda x, a, b: jnp.where(x >= 0, x, (0.01 if a is None else a) * x),
    "thresholdedrelu": lambda x, a, b: jnp.where(x > (1.0 if a is None else a), x, 0),
    "scaledtanh": lambda x, a, b: (1.0 if a is None else a) * jnp.tanh((1.0 if b is None else b) * x),
    "hardsigmoid": lambda x, a, b: jnp.clip((0.2 if a is None else a) * x + (0.5 if b is None else b), 0, 1),
    "elu": lambda x, a, b: jnp.where(x >= 0, x, (1.0 if a is None else a) * jnp.expm1(x)),
    "softsign": lambda x, a, b: x / (1 + jnp.abs(x)),
    "softplus": lambda x, a, b: jax.nn.softplus(x),
    "affine": lambda x, a, b: (1.0 if a is None else a) * x + (0.0 if b is None else b),
}


def _activations(a, defaults: list[str], directions: int):
    names = list(a.get("activations") or defaults * directions)
    alphas = list(a.get("activation_alpha") or [])
    betas = list(a.get("activation_beta") or [])
    out = []
    for i, name in enumerate(names):
        fn = _ACTIVATIONS.get(name.lower())
        if fn is None:
            raise ShapeError(f"unknown recurrent activation {name!r}",
                             expected=", ".join(sorted(_ACTIVATIONS)))
        alpha = alphas[i] if i < len(alphas) else None
        beta = betas[i] if i < len(betas) else None
        out.append(lambda x, fn=fn, alpha=alpha, beta=beta: fn(x, alpha, beta))
    return [out[k * len(defaults):(k + 1) * len(defaults)] for k in range(directions)]


def _run(kind: str, a, x, w, r, b, lengths, h0, c0, p):
    if a.get("layout", 0):
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(c0, 0, 1)
    direction = a.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = w.shape[1] // {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    steps, batch = x.shape[0], x.shape[1]
    defaults = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(a, defaults, dirs)
    clip = a.get("clip")
    dtype = x.dtype
    t_index = jnp.arange(steps)
    valid = (jnp.ones((steps, batch), bool) if lengths is None
             else t_index[:, None] < lengths.reshape(1, -1))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        wd, rd = w[d], r[d]
        bd = jnp.zeros((2 * w.shape[1],), dtype) if b is None else b[d]
        wb, rb = bd[: w.shape[1]], bd[w.shape[1]:]
        h = jnp.zeros((batch, hidden), dtype) if h0 is None else h0[d]
        c = jnp.zeros((batch, hidden), dtype) if c0 is None else c0[d]
        peep = None if p is None else p[d]
        f = acts[d]
        order = t_index[::-1] if reverse else t_index
        if reverse and lengths is not None:  # each sequence reversed within its length
            order_b = jnp.where(valid, lengths.reshape(1, -1) - 1 - t_index[:, None], t_index[:, None])
        else:
            order_b = jnp.broadcast_to(order[:, None], (steps, batch))
        xs = jnp.take_along_axis(x, order_b[:, :, None], axis=0)
        mask = jnp.take_along_axis(valid, order_b, axis=0) if reverse else valid

        def cell(carry, inputs, wd=wd, rd=rd, wb=wb, rb=rb, peep=peep, f=f):
            h, c = carry
            xt, keep = inputs
            gx = xt @ wd.T + wb
            def clipped(v):
                return v if clip is None else jnp.clip(v, -clip, clip)
            if kind == "rnn":
                h_new = f[0](clipped(gx + h @ rd.T + rb))
                c_new = c
            elif kind == "gru":
                xz, xr, xh = jnp.split(gx, 3, axis=-1)
                rz, rr, rh = jnp.split(rd, 3, axis=0)
                bz, br, bh = jnp.split(rb, 3)
                z = f[0](clipped(xz + h @ rz.T + bz))
                rg = f[0](clipped(xr + h @ rr.T + br))
                if a.get("linear_before_reset", 0):
                    hh = f[1](clipped(xh + rg * (h @ rh.T + bh)))
                else:
                    hh = f[1](clipped(xh + (rg * h) @ rh.T + bh))
                h_new = (1 - z) * hh + z * h
                c_new = c
            else:
                gates = gx + h @ rd.T + rb
                gi, go, gf, gc = jnp.split(gates, 4, axis=-1)
                pi, po, pf = (None, None, None) if peep is None else jnp.split(peep, 3)
                i = f[0](clipped(gi if pi is None else gi + pi * c))
                fg = f[0](clipped(gf if pf is None else gf + pf * c))
                if a.get("input_forget", 0):
                    fg = 1 - i
                cand = f[1](clipped(gc))
                c_new = fg * c + i * cand
                o = f[0](clipped(go if po is None else go + po * c_new))
                h_new = o * f[2](c_new)
            keep = keep[:, None]
            h_next = jnp.where(keep, h_new, h).astype(dtype)
            c_next = jnp.where(keep, c_new, c).astype(dtype)
            return (h_next, c_next), jnp.where(keep, h_new, 0).astype(dtype)

        (h_last, c_last), y = lax.scan(cell, (h, c), (xs, mask))
        if reverse:
            y = jnp.take_along_axis(y, jnp.argsort(order_b, axis=0)[:, :, None], axis=0)
        ys.append(y)
        hs.append(h_last)
        cs.append(c_last)
    y = jnp.stack(ys, axis=1)  # (steps, dirs, batch, hidden)
    yh, yc = jnp.stack(hs), jnp.stack(cs)
    if a.get("layout", 0):
        y = jnp.transpose(y, (2, 0, 1, 3))
        yh, yc = jnp.swapaxes(yh, 0, 1), jnp.swapaxes(yc, 0, 1)
    return (y, yh, yc) if kind == "lstm" else (y, yh)


def _recurrent_flops(inputs, outputs, a):
    w, r = inputs[1], inputs[2]
    steps_batch = size(inputs[0]) // inputs[0].shape[-1]
    return 2 * steps_batch * (w.shape[1] * w.shape[2] + r.shape[1] * r.shape[2]) * w.shape[0]


@define("RNN", dtypes="float", flops=_recurrent_flops)
def _rnn(a, x, w, r, b=None, lengths=None, h0=None):
    return _run("rnn", a, x, w, r, b, lengths, h0, None, None)


@define("GRU", dtypes="float", flops=_recurrent_flops)
def _gru(a, x, w, r, b=None, lengths=None, h0=None):
    return _run("gru", a, x, w, r, b, lengths, h0, None, None)


@define("LSTM", dtypes="float", flops=_recurrent_flops)
def _lstm(a, x, w, r, b=None, lengths=None, h0=None, c0=None, p=None):
    return _run("lstm", a, x, w, r, b, lengths, h0, c0, p)
