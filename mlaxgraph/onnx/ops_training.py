"""The ``onnx`` family's training operators (ONNX's ``ai.onnx.preview.training``
domain): Adagrad, Momentum and Adam, each updating any number of tensors in one
node: inputs ``R`` (learning rate), ``T`` (update count), then the tensors, their
gradients and their optimizer states; outputs the new tensors and states. And
``Gradient``: the derivatives of a value ``y`` of the graph with respect to ``xs``,
computed by ``jax.vjp`` of the part of the graph between them, which the reader
gives the node as a body (``with_body``), as ``If``'s branches are."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .layer import DOMAINS, define
from .ops_control import _run, _split


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


def with_body(graph: Any, node: Any) -> Any:
    """A ``Gradient`` node with the nodes computing its ``y`` from its ``xs`` and ``zs``
    as the body ``__body__`` (inputs the ``xs`` then the ``zs``, output ``y``; what
    else it reads comes from the graph around it, as a branch's reads do)."""
    from .protos import require_onnx

    helper = require_onnx().helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    xs = [v.decode() if isinstance(v, bytes) else v for v in attrs.get("xs", [])]
    zs = [v.decode() if isinstance(v, bytes) else v for v in attrs.get("zs", [])]
    y = attrs.get("y", b"")
    y = y.decode() if isinstance(y, bytes) else y
    producers = {out: n for n in graph.node for out in n.output if out}
    stop, wanted, picked = set(xs) | set(zs), [y], set()
    while wanted:
        value = wanted.pop()
        if value in stop or value not in producers or id(producers[value]) in picked:
            continue
        picked.add(id(producers[value]))
        wanted.extend(producers[value].input)
    body = helper.make_graph(
        [n for n in graph.node if id(n) in picked], "gradient",
        [helper.make_empty_tensor_value_info(v) for v in xs + zs],
        [helper.make_empty_tensor_value_info(y)])
    out = type(node)()
    out.CopyFrom(node)
    out.attribute.append(helper.make_attribute("__body__", body))
    return out


@define("Gradient", flops="input")
def _gradient(a, *inputs):
    """d sum(y) / d x for each x of ``xs`` (inputs: the ``xs``, the ``zs``, then the
    values the body reads around it)."""
    formals, outers = _split(a, inputs)
    n = len(a["xs"])

    def y_of(xs):
        return _run(a, "__body__", list(xs) + formals[n:], outers)[0]

    y, pullback = jax.vjp(y_of, tuple(formals[:n]))
    return tuple(pullback(jnp.ones_like(y))[0])


DOMAINS.update(dict.fromkeys(("Adagrad", "Momentum", "Adam", "Gradient"),
                             "ai.onnx.preview.training"))
