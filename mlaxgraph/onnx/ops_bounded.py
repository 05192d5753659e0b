"""The ``onnx`` family's operators whose output length depends on the input's values:
NonZero, Unique and NonMaxSuppression. On constants (folded when the graph is read)
they give the exact length. On tensors of the graph a typed graph needs a static
length: a bound given to ``from_onnx(..., sizes={node: n})`` (as ``jnp.nonzero(x,
size=n, fill_value=...)``), held as the node's ``size`` and ``fill_value`` attributes
(``to_onnx`` writes them as Pad and Slice after the operator); the results are cut to
the bound or padded to it. Without a bound the node is an ``mg.ShapeError`` saying so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import GraphError, ShapeError
from .dtypes import int64
from .layer import define

__all__ = ["BOUNDED", "read_sizes", "check_sizes"]

#: The operators that take a static bound.
BOUNDED = ("NonZero", "Unique", "NonMaxSuppression")


def read_sizes(sizes: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``sizes`` as ``{key: {"size": n, "fill_value": v}}``; a malformed entry is an
    ``mg.GraphError``."""
    if sizes is None:
        return {}
    if not isinstance(sizes, Mapping):
        raise GraphError(f"from_onnx(sizes=...) takes a mapping {{node: n or (n, fill_value)}}, "
                         f"got {type(sizes).__name__}")
    out = {}
    for key, value in sizes.items():
        size, fill = (value if isinstance(value, tuple) and len(value) == 2 else (value, 0))
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0 \
                or isinstance(fill, bool) or not isinstance(fill, (int, float, np.number)):
            raise GraphError(f"from_onnx(sizes=...)[{key!r}] must be a size n >= 0 or "
                             f"(n, fill_value), got {value!r}")
        out[str(key)] = {"size": int(size), "fill_value": fill}
    return out



def check_sizes(sizes: Mapping[str, Any], nodes: list[tuple[str, Any, str]]) -> None:
    """A key of ``sizes`` naming no bounded node (by name, first output or type) of
    ``nodes`` (``(name, outputs, type)``) is an ``mg.GraphError``."""
    known = {key for name, outputs, kind in nodes if kind in BOUNDED
             for key in (name, *outputs, kind)}
    unused = sorted(set(sizes) - known)
    if unused:
        raise GraphError(f"from_onnx(sizes=...) names {', '.join(map(repr, unused))}: no "
                         f"{', '.join(BOUNDED[:-1])} or {BOUNDED[-1]} node has that name, "
                         f"output or type")

def _length(a, op_type: str, x, count) -> int:
    """The output length: the bound, or the exact count for a constant input."""
    size = a.get("size")
    if size is not None:
        return int(size)
    if isinstance(x, jax.core.Tracer):
        raise ShapeError(f"{op_type}'s output length depends on the values of its input, "
                         f"which the graph computes; give it a static bound: "
                         f"from_onnx(..., sizes={{node name or {op_type!r}: n}})",
                         expected="a constant input, or a bound in from_onnx(sizes=...)")
    return int(count)


def _fit(values, length: int, fill, axis: int = -1):
    """``values`` cut or padded (with ``fill``) to ``length`` along ``axis``."""
    axis = axis % values.ndim
    have = values.shape[axis]
    if have >= length:
        return jax.lax.slice_in_dim(values, 0, length, axis=axis)
    pad = [(0, 0)] * values.ndim
    pad[axis] = (0, length - have)
    return jnp.pad(values, pad, constant_values=jnp.asarray(fill, values.dtype))


@define("NonZero", flops="input")
def _nonzero(a, x):
    if x.ndim == 0:
        x = x.reshape(1)  # ONNX reads a scalar as one element
    fill = a.get("fill_value", 0)
    every = jnp.stack(jnp.nonzero(x, size=x.size, fill_value=fill)).astype(int64())
    every = every.reshape(x.ndim, x.size)
    return _fit(every, _length(a, "NonZero", x, jnp.count_nonzero(x)), fill)


@define("Unique", flops="input")
def _unique(a, x):
    """Y (the distinct values, sorted or in order of first occurrence), indices (of the
    first occurrences), inverse_indices (each element's entry in Y) and counts; the
    padding of a bound holds ``fill_value`` in Y, -1 in indices and 0 in counts."""
    axis = a.get("axis")
    flat = axis is None
    v = x.reshape(-1) if flat else x
    axis = 0 if flat else axis % x.ndim
    n = v.shape[axis]
    y, index, inverse, counts = jnp.unique(v, return_index=True, return_inverse=True,
                                           return_counts=True, size=n, axis=None if flat else axis)
    inverse = inverse.reshape(-1)
    real = counts > 0
    if not a.get("sorted", 1):  # the distinct values in order of first occurrence
        order = jnp.argsort(jnp.where(real, index, n))
        y, index, counts = jnp.take(y, order, axis=axis), index[order], counts[order]
        inverse = jnp.argsort(order)[inverse]
        real = counts > 0
    length = _length(a, "Unique", x, jnp.sum(real))
    fill = a.get("fill_value", 0)
    shape = [1] * y.ndim
    shape[axis] = n
    y = jnp.where(real.reshape(shape), y, jnp.asarray(fill, y.dtype))
    index = jnp.where(real, index, -1)
    i64 = int64()
    return (_fit(y, length, fill, axis), _fit(index.astype(i64), length, -1),
            inverse.astype(i64), _fit(counts.astype(i64), length, 0))


def _overlaps(boxes, center: bool, threshold):
    """``(batch, n, n)``: whether box ``i`` suppresses box ``j`` (IoU above the
    threshold; boxes of no area suppress nothing), as onnxruntime decides."""
    if center:
        cx, cy, w, h = (boxes[..., i] for i in range(4))
        x0, x1, y0, y1 = cx - w / 2, cx + w / 2, cy - h / 2, cy + h / 2
    else:  # (y1, x1, y2, x2), either corner first
        y0, y1 = jnp.minimum(boxes[..., 0], boxes[..., 2]), jnp.maximum(boxes[..., 0], boxes[..., 2])
        x0, x1 = jnp.minimum(boxes[..., 1], boxes[..., 3]), jnp.maximum(boxes[..., 1], boxes[..., 3])
    area = (x1 - x0) * (y1 - y0)

    def pair(v):
        return v[:, :, None], v[:, None, :]

    (ax0, bx0), (ax1, bx1), (ay0, by0), (ay1, by1) = map(pair, (x0, x1, y0, y1))
    inter = (jnp.maximum(jnp.minimum(ax1, bx1) - jnp.maximum(ax0, bx0), 0)
             * jnp.maximum(jnp.minimum(ay1, by1) - jnp.maximum(ay0, by0), 0))
    a1, a2 = pair(area)
    union = a1 + a2 - inter
    ok = (inter > 0) & (a1 > 0) & (a2 > 0) & (union > 0)
    return ok & (inter / jnp.where(ok, union, 1) > threshold)


@define("NonMaxSuppression", dtypes="float", flops="input")
def _nms(a, boxes, scores, max_per_class=None, iou=None, score_min=None):
    """``(selected, 3)`` rows ``[batch, class, box]``: per batch and class, boxes by
    falling score (ties: the first box), each kept unless a kept box overlaps it by
    more than ``iou``, at most ``max_per_class``; padded rows hold ``fill_value``."""
    batch, classes, n = scores.shape
    limit = 0 if max_per_class is None else jnp.asarray(max_per_class).reshape(())
    threshold = 0.0 if iou is None else jnp.asarray(iou).reshape(())
    order = jnp.argsort(-scores, axis=-1, stable=True)  # (batch, classes, n)
    ranked = jnp.take_along_axis(scores, order, axis=-1)
    candidate = (ranked > jnp.asarray(score_min).reshape(())) if score_min is not None else \
        jnp.ones(ranked.shape, bool)
    suppress = _overlaps(boxes, bool(a.get("center_point_box", 0)), threshold)  # (batch, n, n)
    # in ranked order: (batch, classes, n, n)
    s = suppress[jnp.arange(batch)[:, None, None, None], order[..., :, None], order[..., None, :]]

    def step(i, kept):
        hit = jnp.any(kept & s[:, :, i, :], axis=-1)
        room = jnp.sum(kept, axis=-1) < limit
        return kept.at[:, :, i].set(candidate[:, :, i] & ~hit & room)

    kept = jax.lax.fori_loop(0, n, step, jnp.zeros((batch, classes, n), bool))
    b, c = jnp.meshgrid(jnp.arange(batch), jnp.arange(classes), indexing="ij")
    rows = jnp.stack([jnp.broadcast_to(b[..., None], order.shape),
                      jnp.broadcast_to(c[..., None], order.shape), order], -1).reshape(-1, 3)
    flat = kept.reshape(-1)
    length = _length(a, "NonMaxSuppression", scores, jnp.sum(flat))
    (at,) = jnp.nonzero(flat, size=max(length, 1), fill_value=0)
    fill = a.get("fill_value", 0)
    count = jnp.sum(flat)
    picked = jnp.where((jnp.arange(at.shape[0]) < count)[:, None], rows[at], fill)
    return picked[:length].astype(int64())
