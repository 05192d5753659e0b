"""The ``onnx`` family's optimizer operators (ONNX's ``ai.onnx.preview.training``
domain): Adagrad, Momentum and Adam, each updating any number of tensors in one
node: inputs ``R`` (learning rate), ``T`` (update count), then the tensors, their
gradients and their optimizer states; outputs the new tensors and states."""

from __future__ import annotations

import jax.numpy as jnp

from .layer import DOMAINS, define


def _groups(xs, count: int):
    n = len(xs) // count
    return [xs[k * n:(k + 1) * n] for k in range(count)]


@define("Adagrad", dtypes="float")
def _adagrad(a, r, t, *rest):
    xs, gs, hs = _groups(rest, 3)
    rate = r / (1 + t.astype(r.dtype) * a.get("decay_factor", 0.0))
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = a.get("norm_coefficient", 0.0) * x + g
        h = h + g * g
        new_x.append((x - rate * g / (jnp.sqrt(h) + a.get("epsilon", 1e-6))).astype(x.dtype))
        new_h.append(h.astype(x.dtype))
    return tuple(new_x + new_h)


@define("Momentum", dtypes="float")
def _momentum(a, r, t, *rest):
    xs, gs, vs = _groups(rest, 3)
    alpha, beta = a["alpha"], a["beta"]
    beta_t = jnp.where(t > 0, beta, 1.0)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = a["norm_coefficient"] * x + g
        v = alpha * v + beta_t * g
        step = g + alpha * v if a["mode"] == "nesterov" else v
        new_x.append((x - r * step).astype(x.dtype))
        new_v.append(v.astype(x.dtype))
    return tuple(new_x + new_v)


@define("Adam", dtypes="float")
def _adam(a, r, t, *rest):
    xs, gs, vs, hs = _groups(rest, 4)
    alpha, beta = a.get("alpha", 0.9), a.get("beta", 0.999)
    tf = t.astype(r.dtype)
    rate = jnp.where(t > 0, r * jnp.sqrt(1 - beta ** tf) / (1 - alpha ** tf), r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = a.get("norm_coefficient", 0.0) * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        x_new = x - rate * v / (jnp.sqrt(h) + a.get("epsilon", 1e-6))
        x_new = (1 - a.get("norm_coefficient_post", 0.0)) * x_new
        new_x.append(x_new.astype(x.dtype))
        new_v.append(v.astype(x.dtype))
        new_h.append(h.astype(x.dtype))
    return tuple(new_x + new_v + new_h)


DOMAINS.update(dict.fromkeys(("Adagrad", "Momentum", "Adam"), "ai.onnx.preview.training"))
