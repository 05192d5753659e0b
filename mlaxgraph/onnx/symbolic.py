"""Sizes known when the graph is built up to its symbolic dims: the shape arithmetic
around a ``Shape`` of a tensor with symbolic dims (``Gather``, ``Unsqueeze``,
``Concat``, ``Slice``, ``Add`` ...), followed alongside the graph the reader builds,
so that a ``Range`` whose length is such a size (``to_onnx``'s ``0 .. seq - 1``:
``Range(0, Gather(Shape(x), 1), 1)``) is read as ``ops.arange(seq)`` with its
symbolic length, without binding ``seq`` by ``from_onnx(dims=...)``. The tensors the
arithmetic computes stay in the graph for every other reader of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.specs import is_symbolic
from ..ops.creation import Arange, BroadcastTo
from ..ops.elementwise import broadcast_shapes
from ..ops.shape import Reshape
from .dtypes import canonical

__all__ = ["track", "read_range", "read_shaped"]


def _known(reader: Any, name: str) -> np.ndarray | None:
    """The value ``name`` holds as an object array of ints and symbolic dims, or None."""
    if not name:
        return None
    value = reader.values.get(name)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value.astype(object)
    return reader.dimvals.get(name)


def _array(value: Any) -> np.ndarray:
    """``value`` as an object array: numpy gives a scalar index's element (a symbolic
    dim) as itself, not as a 0-d array."""
    if isinstance(value, np.ndarray):
        return value
    out = np.empty((), object)
    out[()] = value
    return out


def _axes(reader: Any, node: Any, attrs: dict) -> list[int] | None:
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(node.input) > 1 and node.input[1]:
        axes = reader.values.get(node.input[1])
        return [int(a) for a in np.ravel(axes)] if isinstance(axes, np.ndarray) else None
    return []


def _compute(reader: Any, node: Any, attrs: dict) -> np.ndarray | None:
    op, ins = node.op_type, list(node.input)
    if op == "Shape":
        tensor = reader.values.get(ins[0])
        shape = getattr(tensor, "shape", None)
        if shape is None or isinstance(tensor, np.ndarray):
            return None
        return np.asarray(list(shape), object)[slice(attrs.get("start", 0), attrs.get("end"))]
    data = _known(reader, ins[0]) if ins else None
    if data is None:
        return None
    if op in ("Identity", "Cast") and (op == "Identity" or attrs.get("to") in (6, 7)):
        return data
    if op == "Gather":
        index = reader.values.get(ins[1])
        if not isinstance(index, np.ndarray):
            return None
        return _array(np.take(data, index.astype(np.int64), axis=int(attrs.get("axis", 0))))
    if op in ("Unsqueeze", "Squeeze"):
        axes = _axes(reader, node, attrs)
        if axes is None:
            return None
        if op == "Squeeze":
            return np.squeeze(data, axis=tuple(axes) if axes else None)
        out = data
        for axis in sorted(a % (data.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, axis)
        return out
    if op == "Slice":
        parts = [reader.values.get(v) if v else None for v in ins[1:5]]
        if "starts" in attrs:  # before opset 10: attributes
            parts = [attrs.get("starts"), attrs.get("ends"), attrs.get("axes"), None]
        if any(p is not None and not isinstance(p, (np.ndarray, list, tuple))
               for p in parts) or parts[0] is None or parts[1] is None:
            return None
        starts, ends = np.ravel(parts[0]), np.ravel(parts[1])
        along = np.ravel(parts[2]) if len(parts) > 2 and parts[2] is not None else \
            np.arange(len(starts))
        steps = np.ravel(parts[3]) if len(parts) > 3 and parts[3] is not None else \
            np.ones(len(starts), np.int64)
        index = [slice(None)] * data.ndim
        for start, end, axis, step in zip(starts, ends, along, steps):
            index[int(axis)] = slice(int(start), int(end), int(step))
        return data[tuple(index)]
    if op == "Concat":
        pieces = [_known(reader, v) for v in ins]
        known = [p for p in pieces if p is not None]
        if len(known) != len(pieces):
            return None
        return np.concatenate(known, axis=int(attrs.get("axis", 0)))
    if op in ("Add", "Sub", "Mul") and len(ins) == 2:
        other = _known(reader, ins[1])
        if other is None:
            return None
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](data, other)
    return None


def track(reader: Any, node: Any, attrs: dict) -> None:
    """Records the sizes ``node`` computes from symbolic dims (``reader.dimvals``)."""
    out = node.output[0] if node.output else ""
    if not out or isinstance(reader.values.get(out), np.ndarray):
        return  # folded to a constant already
    first = node.input[0] if node.input else ""
    # any input known up to symbolic dims (a Concat's may come after constants)
    if not first or not (any(v in reader.dimvals for v in node.input if v) or
                         (node.op_type == "Shape" and hasattr(reader.values.get(first), "shape"))):
        return
    try:
        value = _compute(reader, node, attrs)
    except (ValueError, TypeError, IndexError):
        return
    if value is not None:
        reader.dimvals[out] = _array(value)


def _name(reader: Any, node: Any) -> str:
    """The name of the layer a ``Range`` becomes, in its node's scope."""
    from .reader import _safe_name, scope_of

    name = _safe_name(node.name, reader.used, "arange")
    scope, last = scope_of(node.name)
    if scope:
        reader.places[name] = (scope, last)
    return name


def read_range(reader: Any, node: Any) -> bool:
    """A ``Range`` of step 1 from a constant start to a length known up to symbolic dims
    as ``ops.arange`` (plus the start); False leaves it to the operator's reading."""
    if node.op_type != "Range" or len(node.input) != 3 or \
            not any(v in reader.dimvals for v in node.input):
        return False
    start, limit, step = (_known(reader, v) for v in node.input)
    if start is None or limit is None or step is None or \
            not all(np.size(v) == 1 for v in (start, limit, step)):
        return False
    start, limit, step = (np.ravel(v)[0] for v in (start, limit, step))
    constant = reader.values.get(node.input[0])
    if step != 1 or not isinstance(start, (int, np.integer)) or \
            not isinstance(constant, np.ndarray):
        return False
    out = Arange(limit - start, dtype=canonical(constant.dtype), name=_name(reader, node))()
    reader.values[node.output[0]] = out + int(start) if start else out
    return True


def read_shaped(reader: Any, node: Any) -> bool:
    """An ``Expand`` or ``Reshape`` whose shape is known up to symbolic dims (exporters'
    ``Concat(Gather(Shape(x), 0), ...)``, ``to_onnx``'s ``broadcast_to``) as
    ``ops.broadcast_to`` to the broadcast shape, or ``ops.reshape`` keeping the batch
    axis; False leaves it to the operator's reading (which asks for ``dims=``)."""
    if node.op_type not in ("Expand", "Reshape") or len(node.input) != 2 or \
            node.input[1] not in reader.dimvals or \
            isinstance(reader.values.get(node.input[1]), np.ndarray):
        return False
    x = reader.tensor(node.input[0])
    dims = [d if is_symbolic(d) else int(d) for d in np.ravel(reader.dimvals[node.input[1]])]
    if node.op_type == "Expand":
        shape = broadcast_shapes(tuple(x.shape), tuple(dims))
        if shape is None:
            return False
        reader.values[node.output[0]] = BroadcastTo(shape, name=_name(reader, node))(x)
        return True
    allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
    if not allow_zero:  # 0 copies the input's dim
        dims = [x.shape[i] if not is_symbolic(d) and d == 0 and i < len(x.shape) else d
                for i, d in enumerate(dims)]
    if not dims or len(x.shape) < 1 or not _same_dim(dims[0], x.shape[0]) or \
            any(is_symbolic(d) for d in dims[1:]):
        return False
    reader.values[node.output[0]] = Reshape(tuple(dims[1:]), name=_name(reader, node))(x)
    return True


def _same_dim(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (jax's inconclusive comparison)
        return False
