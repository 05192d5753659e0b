"""Structural checks ``from_onnx`` makes of a node before reading it, as
``onnx.checker`` and ONNX's shape inference make them, where reading on would give a
graph that computes something else than the file means: a convolution's
``kernel_shape`` that its weight contradicts (the weight's shape wins in the
computation, so the file's meaning is unknown)."""

from __future__ import annotations

from typing import Any

from ..core.errors import ShapeError

__all__ = ["check_kernel_shape"]

#: The operators with a ``kernel_shape`` attribute and a weight: the weight's input.
_WEIGHTED = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3,
             "DeformConv": 1}


def _shape(value: Any) -> tuple | None:
    array = getattr(value, "array", value)  # a weight (weights.Weight) holds its array
    shape = getattr(array, "shape", None)
    return None if shape is None else tuple(shape)


def check_kernel_shape(node: Any, attrs: dict, values: dict, where: str) -> None:
    """A ``kernel_shape`` other than the weight's spatial dims is a ``ShapeError``
    naming the node, both shapes and the weight."""
    position = _WEIGHTED.get(node.op_type)
    if position is None or "kernel_shape" not in attrs or len(node.input) <= position:
        return
    shape = _shape(values.get(node.input[position]))
    if shape is None or len(shape) < 2:
        return
    spatial, kernel = shape[2:], tuple(int(k) for k in attrs["kernel_shape"])
    if all(isinstance(d, int) for d in spatial) and tuple(int(d) for d in spatial) != kernel:
        raise ShapeError(f"{where}: kernel_shape {list(kernel)} disagrees with its weight "
                         f"{node.input[position]!r} of shape {list(shape)}, whose spatial "
                         f"dims are {list(spatial)}; onnx.checker refuses the file (fix "
                         f"kernel_shape or drop it: it is read from the weight)")
