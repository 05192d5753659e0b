"""Sizes that ``to_onnx`` writes as tensors: a dim as an int64 scalar or 1-D tensor
(a constant when it is an int, else read from the shape of a graph input holding it or
of a tensor at hand), ``0 .. n - 1`` positions and whole shapes. Shared by the rules of
``writer_rules`` and ``writer_attention``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import SerializationError

__all__ = ["dim_value", "positions", "length_range", "shape_tensor"]


def dim_value(w: Any, node: Any, d: Any, path: str, *, source: tuple[str, int] | None = None,
              vector: bool = False) -> str:
    """``d`` as an int64 scalar (``vector``: shape ``(1,)``): a constant for an int;
    else the size at ``source`` (tensor name, axis) or, without one, at the graph input
    holding the symbolic dim."""
    if isinstance(d, (int, np.integer)):
        return w.constant(f"{path}.size", np.asarray([d] if vector else d, np.int64))
    if source is None:
        if str(d) not in w.dims:
            raise SerializationError(f"layer {path!r} (op {node.op.op_name}): the length "
                                     f"{d} is no dim of the graph's inputs")
        source = w.dims[str(d)]
    tensor, axis = source
    (shape,) = w.node("Shape", [tensor], path, part=True)
    index = w.constant(f"{path}.axis", np.asarray([axis] if vector else axis, np.int64))
    return w.node("Gather", [shape, index], path, part=True, axis=0)[0]


def length_range(w: Any, node: Any, n: Any, path: str, *, source: tuple[str, int] | None = None) -> str:
    """``0 .. n - 1`` (int64) for a symbolic ``n``, as Range."""
    limit = dim_value(w, node, n, path, source=source)
    start = w.constant(f"{path}.start", np.asarray(0, np.int64))
    step = w.constant(f"{path}.step", np.asarray(1, np.int64))
    return w.node("Range", [start, limit, step], path, part=True)[0]


def positions(w: Any, node: Any, n: Any, path: str, axes: list[int], *,
              source: tuple[str, int] | None = None) -> str:
    """``0 .. n-1`` (int64), with ``axes`` inserted, as a constant or, for a symbolic
    ``n``, computed from a shape (see ``dim_value``)."""
    if isinstance(n, int):
        return w.constant(path, np.expand_dims(np.arange(n, dtype=np.int64), axes))
    out = length_range(w, node, n, path, source=source)
    axes_name = w.constant(f"{path}.axes", np.asarray(axes, np.int64))
    return w.node("Unsqueeze", [out, axes_name], path, part=True)[0]


def shape_tensor(w: Any, node: Any, shape: tuple, path: str) -> str:
    """``shape`` as a 1-D int64 tensor: a constant when every dim is an int, else the
    concatenation of its dims (the symbolic ones read from the graph's inputs)."""
    if all(isinstance(d, (int, np.integer)) for d in shape):
        return w.constant(f"{path}.shape", np.asarray(shape, np.int64))
    parts = [dim_value(w, node, d, f"{path}/dim{i}", vector=True) for i, d in enumerate(shape)]
    return w.node("Concat", parts, path + "/shape", part=True, axis=0)[0]
