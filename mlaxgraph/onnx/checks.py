"""Structural checks ``from_onnx`` makes of a node before reading it, as
``onnx.checker`` and ONNX's shape inference make them, where reading on would give a
graph that computes something else than the file means: a convolution's
``kernel_shape`` that its weight contradicts (the weight's shape wins in the
computation, so the file's meaning is unknown); a node with more or fewer inputs or
outputs than its operator takes; inputs of one type parameter (``Add``'s ``T``) of two
dtypes (mlaxgraph would promote them where ONNX never does)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..core.errors import DTypeError, GraphError, ShapeError
from .dtypes import canonical
from .protos import require_onnx

__all__ = ["check_kernel_shape", "check_signature", "not_static"]

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


@functools.cache
def _schema(op_type: str, domain: str, version: int) -> Any:
    try:
        return require_onnx().defs.get_schema(op_type, version, domain)
    except Exception:  # noqa: BLE001  (onnx.defs.SchemaError: no such operator there)
        return None


def _count(what: str, given: int, low: int, high: int) -> str | None:
    if low <= given <= high:
        return None
    takes = f"{low}" if low == high else (f"at least {low}" if high >= 2**31 - 1 else
                                          f"{low} to {high}")
    return f"takes {takes} {what if (low, high) != (1, 1) else what[:-1]}, got {given}"


def _dtype(value: Any) -> Any:
    array = getattr(value, "array", value)  # a weight (weights.Weight) holds its array
    try:
        return canonical(array.dtype) if isinstance(array, np.ndarray) else \
            getattr(value, "dtype", None)
    except TypeError:  # no JAX dtype (strings, objects): left to the operator
        return None


def check_signature(node: Any, values: dict, versions: dict[str, int], where: str) -> None:
    """The node against its operator's schema, as ``onnx.checker`` checks it: as many
    inputs and outputs as the operator takes (a ``GraphError``), and the inputs of one
    type parameter of one dtype (a ``DTypeError``: ``Add(float32, int32)``)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = versions.get(domain)
    schema = None if version is None else _schema(node.op_type, domain, version)
    if schema is None:
        return
    for what, given, low, high in (("inputs", len(node.input), schema.min_input, schema.max_input),
                                   ("outputs", len(node.output), schema.min_output,
                                    schema.max_output)):
        problem = _count(what, given, low, high)
        if problem:
            raise GraphError(f"{where}: {node.op_type} of opset {version} {problem}; "
                             f"onnx.checker refuses the file")
    formals, params = schema.inputs, {t.type_param_str for t in schema.type_constraints}
    seen: dict[str, tuple[str, Any]] = {}
    for position, name in enumerate(node.input):
        formal = formals[min(position, len(formals) - 1)] if formals else None
        if not name or formal is None or formal.type_str not in params or \
                not formal.is_homogeneous:
            continue
        dtype = _dtype(values.get(name))
        if dtype is None:
            continue
        first = seen.setdefault(formal.type_str, (name, dtype))
        if np.dtype(first[1]) != np.dtype(dtype):
            raise DTypeError(f"{where}: its inputs {first[0]!r} ({np.dtype(first[1]).name}) "
                             f"and {name!r} ({np.dtype(dtype).name}) are of the operator's "
                             f"one type {formal.type_str}; ONNX never promotes, and "
                             f"onnx.checker and onnxruntime refuse the file (add a Cast)")


def not_static(where: str, position: int, name: str, symbolic: list[str],
               is_input: bool) -> ShapeError:
    """The error for an input that sets a shape or an index (a ``Reshape``'s shape, a
    ``Loop``'s trip count) but that the graph computes: what would make it known."""
    if is_input:
        how = (f"it is the graph input {name!r}: make it an initializer (or a Constant) "
               f"in the file")
    elif symbolic:
        how = (f"it is computed from the graph's inputs: from their shapes, bind the "
               f"symbolic dims ({', '.join(symbolic)}) with from_onnx(..., dims={{name: "
               f"size}}); from their values, it must be a constant in the file")
    else:
        how = ("it is computed from the values of the graph's inputs (their shapes are "
               "all known): it must be a constant in the file")
    return ShapeError(f"{where}: input {position} ({name!r}) must be known when the graph "
                      f"is built (it sets a shape or an index), but {how}")
