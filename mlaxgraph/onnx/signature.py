"""The signature ``from_onnx`` reads: the graph inputs' shapes (the file's, bound by
``dims``, or those ``shapes`` gives) and the check of the declared outputs against
what the nodes compute, as onnxruntime makes it."""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.errors import DTypeError, GraphError, SerializationError, ShapeError
from ..core.specs import as_dim
from .dtypes import CODES, to_dtype

__all__ = ["input_shape", "check_shapes", "check_dims", "check_declared"]


def _dim_name(raw: str, fallback: str) -> str:
    """A ``dim_param`` as the name of a symbolic dim (``batch size`` -> ``batch_size``)."""
    name = re.sub(r"\W", "_", raw) or fallback
    return name if not name[0].isdigit() else f"d_{name}"


def input_shape(value: Any, dims: Mapping[str, int], shapes: Mapping[str, Any],
                 names: set[str]) -> tuple:
    """The shape of a graph input: the file's (``dim_param`` as symbolic dims, bound by
    ``dims``) or the one ``shapes`` gives, which must agree with the file's; the
    names of its symbolic dims are added to ``names``."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise SerializationError(f"graph input {value.name!r} is a {kind or 'value without type'}"
                                 f"; mlaxgraph reads tensors")
    given = shapes.get(value.name)
    if not value.type.tensor_type.HasField("shape"):
        if given is None:
            raise ShapeError(f"graph input {value.name!r} has no shape in the file (its rank "
                             f"is unknown; onnxruntime takes any): give it with "
                             f"from_onnx(..., shapes={{{value.name!r}: (\"batch\", 3)}}), "
                             f"each dim an int or a name")
        declared: list = [None] * len(given)
    else:
        declared = []
        for i, d in enumerate(value.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                declared.append(int(d.dim_value))
            else:
                raw = d.dim_param if d.HasField("dim_param") else f"{value.name}_{i}"
                declared.append(_dim_name(raw, f"d{i}"))
    if given is not None:
        if len(given) != len(declared) or any(
                isinstance(f, int) and g != f for f, g in zip(declared, given)):
            raise ShapeError(f"from_onnx(shapes=...) gives graph input {value.name!r} the shape "
                             f"{tuple(given)}; the file declares "
                             f"{tuple('?' if f is None else f for f in declared)}")
        declared = list(given)
    shape = []
    for d in declared:
        if isinstance(d, str):
            names.add(d)
            shape.append(int(dims[d]) if d in dims else as_dim(d))
        else:
            shape.append(int(d))
    return tuple(shape)


def check_shapes(shapes: Any, inputs: list[str], defaults: Sequence[str] = ()) -> dict[str, tuple]:
    """``from_onnx(shapes=...)``: graph input name -> its shape, each dim an int >= 0
    or a name; ``defaults`` the graph inputs that have an initializer (read as it)."""
    if not shapes:
        return {}
    if not isinstance(shapes, Mapping):
        raise GraphError(f"from_onnx(shapes=...) takes a mapping {{input name: shape}}, got "
                         f"{type(shapes).__name__}")
    out = {}
    for key, shape in shapes.items():
        if key in defaults:
            raise GraphError(f"from_onnx(shapes=...) names {key!r}, a graph input the file "
                             f"gives an initializer: it is read as that initializer (a weight "
                             f"whose value params give, or a constant), not as an input")
        if key not in inputs:
            raise GraphError(f"from_onnx(shapes=...) names {key!r}, which is no graph input "
                             f"of the model; its inputs: {', '.join(inputs) or 'none'}"
                             f"{_near(str(key), inputs)}")
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__") or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer, str)) or
                (not isinstance(d, str) and d < 0) for d in shape):
            raise ShapeError(f"from_onnx(shapes=...)[{key!r}] must be a tuple of dims, each an "
                             f"int >= 0 or a name, got {shape!r}")
        out[key] = tuple(d if isinstance(d, str) else int(d) for d in shape)
    return out


def _near(name: str, known: Any) -> str:
    """``; near: ...`` naming the known names close to ``name`` (case aside)."""
    lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.5)
    return f"; near: {', '.join(lower[c] for c in close)}" if close else ""


def check_dims(dims: Mapping[str, Any], names: set[str]) -> None:
    """A ``dims`` key naming no symbolic dim of the graph inputs (``{"n": 4}`` for
    ``N``) is a ``GraphError`` naming the near ones: left unbound, the dim would
    silently stay symbolic."""
    for key in dims:
        if key not in names:
            raise GraphError(f"from_onnx(dims=...) names {key!r}, which is no symbolic dim of "
                             f"the graph inputs; their symbolic dims: "
                             f"{', '.join(sorted(names)) or 'none'}{_near(str(key), names)}")


def check_declared(value: Any, out: Any) -> None:
    """A graph output's declared type against what its nodes compute, as onnxruntime
    takes it: another dtype is a ``DTypeError`` (onnxruntime refuses the file);
    another rank or fixed size a warning (onnxruntime warns and gives what the nodes
    compute, as mlaxgraph does)."""
    tensor = value.type.tensor_type
    if tensor.elem_type:
        declared = to_dtype(tensor.elem_type)  # as JAX narrows it
        if np.dtype(declared) != np.dtype(out.dtype):
            raise DTypeError(f"graph output {value.name!r} is declared "
                             f"{CODES.get(tensor.elem_type, declared)}"
                             f", but its nodes compute {np.dtype(out.dtype).name} "
                             f"{list(out.shape)}; onnxruntime refuses the file too (fix "
                             f"the declared elem_type)")
    if not tensor.HasField("shape"):
        return
    dims = [int(d.dim_value) if d.HasField("dim_value") else None for d in tensor.shape.dim]
    shape = tuple(out.shape)
    if len(dims) != len(shape) or any(isinstance(s, int) and d is not None and d != s
                                      for d, s in zip(dims, shape)):
        declared_shape = ", ".join("?" if d is None else str(d) for d in dims)
        warnings.warn(f"graph output {value.name!r} is declared [{declared_shape}], but its "
                      f"nodes compute {list(shape)}; read as computed (onnxruntime too gives "
                      f"what the nodes compute)", UserWarning, stacklevel=4)
