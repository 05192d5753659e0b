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

from ..core.errors import DTypeError, GraphError, SerializationError, ShapeError, user_stacklevel
from ..core.specs import as_dim
from .dtypes import CODES, to_dtype

__all__ = ["input_shape", "check_shapes", "check_dims", "check_declared", "DimNames",
           "unnamed_hint"]


#: JAX's words in symbolic shapes (``mod(a, b)``; ``_`` takes the size of a "like" shape)
_RESERVED = frozenset({"mod", "max", "min", "floordiv", "non_negative", "_"})
_WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "over", "%": "mod"}


def _spelling(raw: str) -> str:
    """A ``dim_param`` as an identifier (``batch size`` -> ``batch_size``, ``N+1`` ->
    ``N_plus_1``); not yet unique."""
    parts = re.split(r"([+\-*/%])", raw.strip())
    name = "_".join(p for p in (_WORDS.get(p) or re.sub(r"\W", "_", p).strip("_")
                                for p in parts) if p)
    name = name if not name[:1].isdigit() else f"d_{name}"
    return f"{name}_" if name in _RESERVED else name


class DimNames:
    """The names of the graph's symbolic dims: each ``dim_param`` spelling one name of
    its own (unique, none of JAX's reserved words), so that ``dims=`` binds it by
    either; a dim the file leaves without a name (no ``dim_param``, or ``?``) one of
    its own, ``<input>_<axis>``, after the named ones."""

    def __init__(self, inputs: Any = ()):
        self.of: dict[str, str] = {}  # a spelling (of the file, or of shapes=) -> its name
        self.used: set[str] = set()
        self.unnamed: set[str] = set()
        for value in inputs:
            for d in value.type.tensor_type.shape.dim if value.type.HasField(
                    "tensor_type") else ():
                if d.HasField("dim_param") and not _unknown(d.dim_param):
                    self.name(d.dim_param)

    def name(self, raw: str) -> str:
        if raw not in self.of:
            self.of[raw] = self._fresh(_spelling(raw) or "d")
        return self.of[raw]

    def new(self, base: str) -> str:
        name = self._fresh(_spelling(base) or "d")
        self.unnamed.add(name)
        return name

    def _fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.used:
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return name

    def size(self, dims: Mapping[str, int], raw: str, name: str) -> int | None:
        """The size ``dims`` gives the dim, by the file's spelling or by its name."""
        return dims.get(raw, dims.get(name))


def _unknown(raw: str) -> bool:
    """A ``dim_param`` that names no dim (``?``, ``_``): each such dim is its own."""
    return not re.search(r"[^\W_]", raw)


def input_shape(value: Any, dims: Mapping[str, int], shapes: Mapping[str, Any],
                names: set[str], namer: DimNames | None = None) -> tuple:
    """The shape of a graph input: the file's (``dim_param`` as symbolic dims, bound by
    ``dims``) or the one ``shapes`` gives, which must agree with the file's; the
    names of its symbolic dims are added to ``names``."""
    namer = namer if namer is not None else DimNames()
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
        declared = [int(d.dim_value) if d.HasField("dim_value") else
                    d.dim_param if d.HasField("dim_param") and not _unknown(d.dim_param) else
                    (i,) for i, d in enumerate(value.type.tensor_type.shape.dim)]
    if given is not None:
        if len(given) != len(declared) or any(
                isinstance(f, int) and g != f for f, g in zip(declared, given)):
            raise ShapeError(f"from_onnx(shapes=...) gives graph input {value.name!r} the shape "
                             f"{tuple(given)}; the file declares "
                             f"{tuple(f if isinstance(f, (int, str)) else '?' for f in declared)}")
        declared = list(given)
    shape = []
    for d in declared:
        if isinstance(d, int):
            shape.append(int(d))
            continue
        name = namer.name(d) if isinstance(d, str) else namer.new(f"{value.name}_{d[0]}")
        names.add(name)
        size = namer.size(dims, d, name) if isinstance(d, str) else dims.get(name)
        shape.append(int(size) if size is not None else as_dim(name))
    return tuple(shape)


def unnamed_hint(error: Exception, namer: DimNames) -> Exception:
    """``error`` with a word on the dims the file leaves without a name, when it names
    some (two inputs' unknown batch dims are two dims, which may not broadcast)."""
    text = str(error)
    if not isinstance(error, ShapeError):
        return error
    unnamed = sorted(n for n in namer.unnamed if re.search(rf"\b{re.escape(n)}\b", text))
    if not unnamed:
        named = sorted(n for n in namer.used if re.search(rf"\b{re.escape(n)}\b", text))
        if len(named) < 2 or "broadcast" not in text:
            return error
        return ShapeError(f"{text}\n  note: {', '.join(named)} are symbolic dims of their "
                          f"own, which broadcast only when they are one dim: bind them "
                          f"with from_onnx(..., dims={{{named[0]!r}: size, ...}})")
    return ShapeError(f"{text}\n  note: {', '.join(unnamed)} "
                      f"{'are dims' if len(unnamed) > 1 else 'is a dim'} the file gives no "
                      f"name (each its own dim): name the dims that are one with "
                      f"from_onnx(..., shapes={{input: (\"n\", ...)}}), the same name in "
                      f"each input, or bind them with dims={{{unnamed[0]!r}: size}}")


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


def check_dims(dims: Mapping[str, Any], names: set[str], namer: DimNames | None = None) -> None:
    """A ``dims`` key naming no symbolic dim of the graph inputs (``{"n": 4}`` for
    ``N``) is a ``GraphError`` naming the near ones: left unbound, the dim would
    silently stay symbolic. A key may be a dim's name or its spelling in the file."""
    spelled = {raw for raw, name in (namer.of.items() if namer else ()) if name in names}
    for key in dims:
        if key not in names and key not in spelled:
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
                      f"what the nodes compute)", UserWarning, stacklevel=user_stacklevel())
