"""ONNX sequences and optionals as ``from_onnx`` reads them: values whose structure
is known when the graph is built. The typed graph holds tensors only; a sequence is
held by the reader as the list of the names of its tensors (``Seq``), an optional as
the name of its value or nothing (``Opt``). The sequence operators move names around
(``SequenceInsert``, ``SequenceErase``, ``SequenceAt``: positions known when the
graph is built, negative ones counted from the end as ONNX defines them), count them
(``SequenceLength``: a constant) or become the tensor operators they stand for:
``ConcatFromSequence`` a ``Concat`` (of ``Unsqueeze`` s with ``new_axis=1``),
``SplitToSequence`` a ``Split`` (and ``Squeeze`` s with ``keepdims=0``); a
``SequenceMap`` and a ``Loop`` carrying a sequence are their bodies read once per
element or iteration (``sequence_bodies``). A sequence whose pieces depend on
values computed at run time (a split by a tensor the graph computes) knows only its
length; reading a piece of it is an ``mg.ShapeError`` naming the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import GraphError, ShapeError
from .protos import require_onnx

__all__ = ["Seq", "Opt", "read_sequence", "STATIC", "STRUCTURAL", "OPS", "check_tensors",
           "flatten", "regroup"]

#: input positions that must be known when the graph is built (a position, a split)
STATIC = {"SequenceInsert": (2,), "SequenceErase": (1,), "SequenceAt": (1,),
          "SplitToSequence": (1,)}
#: operators that read only the structure of their input, not its values
STRUCTURAL = ("SequenceLength", "OptionalHasElement")
OPS = ("SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt",
       "SequenceLength", "ConcatFromSequence", "SplitToSequence", "SequenceMap", "Optional",
       "OptionalHasElement", "OptionalGetElement")


class Seq:
    """A sequence: the names of its tensors in the reader's values, or only its length
    (``names`` None) when its pieces are computed at run time (``origin`` names the
    node that made it)."""

    def __init__(self, names: list[str] | None, length: int | None = None, origin: str = ""):
        self.names, self.origin = names, origin
        self.length = len(names) if names is not None else int(length or 0)

    def items(self, where: str) -> list[str]:
        if self.names is None:
            raise ShapeError(f"{where} reads the pieces of the sequence {self.origin} makes, "
                             f"whose sizes are computed at run time; only its length is "
                             f"known when the graph is built")
        return list(self.names)


class Opt:
    """An optional: the name of its value, or None when it is empty."""

    def __init__(self, name: str | None):
        self.name = name


def check_tensors(reader: Any, node: Any, names: list[str], where: str) -> None:
    """A tensor operator given a sequence or an optional is an ``mg.GraphError``."""
    for v in names:
        value = reader.values.get(v) if v else None
        if isinstance(value, (Seq, Opt)):
            kind = "sequence" if isinstance(value, Seq) else "optional"
            raise GraphError(f"{where} reads the {kind} {v!r} as a tensor; sequences and "
                             f"optionals are read by their own operators, an Identity, a "
                             f"SequenceMap, and an If or a Loop whose condition and trip "
                             f"count are known when the graph is built")


def _position(reader: Any, node: Any, index: int, where: str, size: int, insert: bool,
              default: int) -> int:
    name = node.input[index] if len(node.input) > index else ""
    if not name:
        return default
    value = reader.values[name]
    array = getattr(value, "array", value)
    if not isinstance(array, np.ndarray):
        raise ShapeError(f"{where}: its position ({name!r}) must be known when the graph is "
                         f"built (it picks a tensor of a sequence), but it is computed from "
                         f"the graph's inputs")
    if array.size != 1 or array.dtype.kind not in "iu":
        raise ShapeError(f"{where}: its position {name!r} is not one integer "
                         f"({array.dtype.name}[{','.join(map(str, array.shape))}])")
    position = int(array.reshape(-1)[0])
    high = size if insert else size - 1
    if not -size <= position <= high:
        raise ShapeError(f"{where}: position {position} is out of range for a sequence of "
                         f"{size} tensors (from {-size} to {high})")
    return position + size if position < 0 else position


def _sequence(reader: Any, name: str, where: str) -> Seq:
    value = reader.values[name]
    if isinstance(value, Opt) and value.name is not None:
        value = reader.values[value.name]
    if not isinstance(value, Seq):
        raise GraphError(f"{where} reads {name!r} as a sequence, but it is a tensor")
    return value


def _node(reader: Any, op: str, inputs: list[str], outputs: list[str], name: Any,
          **attrs: Any) -> None:
    """A tensor operator read in place of a sequence operator (its node's name, so it
    lands in the same scope)."""
    helper = require_onnx().helper
    reader.node(helper.make_node(op, inputs, outputs, name=name, **attrs))


def _constant(reader: Any, name: str, array: Any) -> str:
    reader.values[name] = np.asarray(array, np.int64)
    return name


def _axes(reader: Any, op: str, x: str, out: str, axis: int, name: Any) -> None:
    """``Squeeze`` / ``Unsqueeze`` of one axis, as the model's opset writes them."""
    if reader.opset >= 13:
        _node(reader, op, [x, _constant(reader, f"{out}__axes", [axis])], [out], name)
    else:
        _node(reader, op, [x], [out], name, axes=[axis])


def read_sequence(reader: Any, node: Any, attrs: dict, where: str) -> bool:
    """Whether ``node`` is a sequence or optional operator (or an ``Identity`` of such a
    value), then read into ``reader.values``."""
    op, values, out = node.op_type, reader.values, node.output[0]
    if op == "Identity" and node.input and isinstance(values.get(node.input[0]), (Seq, Opt)):
        values[out] = values[node.input[0]]
        return True
    if op == "Loop" and any(isinstance(values.get(v), (Seq, Opt)) for v in node.input[2:]) or \
            op == "Loop" and any(n.op_type in OPS for a in node.attribute if a.name == "body"
                                 for n in a.g.node):
        from .sequence_bodies import unroll
        unroll(reader, node, where)
        return True
    if op not in OPS:
        return False
    if op == "SequenceEmpty":
        values[out] = Seq([])
    elif op == "SequenceConstruct":
        check_tensors(reader, node, list(node.input), where)
        values[out] = Seq([v for v in node.input if v])
    elif op == "SequenceInsert":
        check_tensors(reader, node, [node.input[1]], where)
        names = _sequence(reader, node.input[0], where).items(where)
        at = _position(reader, node, 2, where, len(names), True, len(names))
        values[out] = Seq(names[:at] + [node.input[1]] + names[at:])
    elif op == "SequenceErase":
        names = _sequence(reader, node.input[0], where).items(where)
        if not names:
            raise ShapeError(f"{where} erases from an empty sequence")
        at = _position(reader, node, 1, where, len(names), False, len(names) - 1)
        values[out] = Seq(names[:at] + names[at + 1:])
    elif op == "SequenceAt":
        names = _sequence(reader, node.input[0], where).items(where)
        values[out] = values[names[_position(reader, node, 1, where, len(names), False, 0)]]
    elif op == "SequenceLength":
        values[out] = np.asarray(_sequence(reader, node.input[0], where).length, np.int64)
    elif op == "ConcatFromSequence":
        _concat(reader, node, attrs, where)
    elif op == "SplitToSequence":
        _split(reader, node, attrs, where)
    elif op == "SequenceMap":
        from .sequence_bodies import sequence_map
        sequence_map(reader, node, where)
    else:
        _optional(reader, node, where)
    return True


def _concat(reader: Any, node: Any, attrs: dict, where: str) -> None:
    names = _sequence(reader, node.input[0], where).items(where)
    if not names:
        raise ShapeError(f"{where} concatenates an empty sequence (its result has no "
                         f"shape or dtype)")
    if "axis" not in attrs:
        raise GraphError(f"{where} has no axis attribute")
    axis, out = int(attrs["axis"]), node.output[0]
    if attrs.get("new_axis", 0):
        rank = len(_shape(reader.values[names[0]]))
        axis = axis + rank + 1 if axis < 0 else axis
        if not 0 <= axis <= rank:
            raise ShapeError(f"{where}: axis {attrs['axis']} is out of range for stacking "
                             f"tensors of rank {rank}")
        stacked = [f"{out}__{i}" for i in range(len(names))]
        for name, piece in zip(names, stacked):
            _axes(reader, "Unsqueeze", name, piece, axis, node.name)
        names = stacked
    _node(reader, "Concat", names, [out], node.name, axis=axis)


def _shape(value: Any) -> tuple:
    return tuple(np.shape(getattr(value, "array", value))) if isinstance(value, np.ndarray) or \
        hasattr(value, "array") else tuple(value.shape)


def _split(reader: Any, node: Any, attrs: dict, where: str) -> None:
    check_tensors(reader, node, list(node.input), where)
    x, out = node.input[0], node.output[0]
    shape = _shape(reader.values[x])
    axis = int(attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"{where}: axis {axis} is out of range for a tensor of rank "
                         f"{len(shape)}")
    axis %= len(shape)
    size = shape[axis]
    split_name = node.input[1] if len(node.input) > 1 else ""
    split = reader.values[split_name] if split_name else None
    split = getattr(split, "array", split)
    if split is not None and not isinstance(split, np.ndarray):
        if len(split.shape) == 1 and isinstance(split.shape[0], int):  # only its length known
            reader.values[out] = Seq(None, split.shape[0], origin=where)
            return
        raise ShapeError(f"{where}: its split ({split_name!r}) must be known when the graph "
                         f"is built (it sets the sizes of the pieces), but it is computed "
                         f"from the graph's inputs")
    if not isinstance(size, (int, np.integer)):
        raise ShapeError(f"{where}: the size of axis {axis} ({size}) must be known when the "
                         f"graph is built to split it; bind it with from_onnx(..., dims=...)")
    if split is None:
        sizes = [1] * int(size)
    elif split.ndim == 0:
        chunk = int(split)
        if chunk <= 0:
            raise ShapeError(f"{where}: split {chunk} is not a positive size")
        sizes = [min(chunk, size - i) for i in range(0, size, chunk)]
    else:
        sizes = [int(v) for v in split.reshape(-1)]
        if sum(sizes) != size or any(s < 0 for s in sizes):
            raise ShapeError(f"{where}: split sizes {sizes} do not add up to the axis' size "
                             f"{size}")
    if not sizes:
        reader.values[out] = Seq([])
        return
    squeeze = split is None and not attrs.get("keepdims", 1)
    pieces = [f"{out}__{i}" for i in range(len(sizes))]
    parts = [f"{p}__kept" for p in pieces] if squeeze else pieces
    if reader.opset >= 13:  # its sizes an input; before, an attribute
        _node(reader, "Split", [x, _constant(reader, f"{out}__split", sizes)], parts,
              node.name, axis=axis)
    else:
        _node(reader, "Split", [x], parts, node.name, axis=axis, split=sizes)
    if squeeze:
        for part, piece in zip(parts, pieces):
            _axes(reader, "Squeeze", part, piece, axis, node.name)
    reader.values[out] = Seq(pieces)


def _optional(reader: Any, node: Any, where: str) -> None:
    op, values, out = node.op_type, reader.values, node.output[0]
    given = node.input[0] if node.input else ""
    if op == "Optional":
        values[out] = Opt(given or None)
        return
    value = values[given] if given else Opt(None)
    if op == "OptionalHasElement":
        values[out] = np.asarray(not isinstance(value, Opt) or value.name is not None)
        return
    if isinstance(value, Opt):  # OptionalGetElement
        if value.name is None:
            raise GraphError(f"{where} reads the element of an empty optional ({given!r})")
        value = values[value.name]
    values[out] = value


def flatten(reader: Any, name: str) -> tuple[list[str], Any]:
    """A graph output's tensors (a sequence's, in order; an empty optional's none) and
    its layout for ``regroup``: ``"tensor"``, ``("sequence", n)`` or ``("optional",
    layout or None)``."""
    value = reader.values[name]
    if isinstance(value, Seq):
        names = value.items(f"the graph output {name!r}")
        return names, ("sequence", len(names))
    if isinstance(value, Opt):
        if value.name is None:
            return [], ("optional", None)
        names, inner = flatten(reader, value.name)
        return names, ("optional", inner)
    return [name], "tensor"


def regroup(flat: list, layouts: list) -> list:
    """The values of the graph's outputs as ONNX gives them: a list for a sequence,
    None for an empty optional."""
    flat, out = list(flat), []
    for layout in layouts:
        out.append(_take(flat, layout))
    return out


def _take(flat: list, layout: Any) -> Any:
    if layout == "tensor":
        return flat.pop(0)
    kind, inner = layout
    if kind == "sequence":
        return [flat.pop(0) for _ in range(inner)]
    return None if inner is None else _take(flat, inner)
