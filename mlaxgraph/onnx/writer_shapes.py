"""Sizes that ``to_onnx`` writes as tensors: a dim as an int64 scalar or 1-D tensor
(a constant when it is an int, else read from the shape of a graph input holding it or
of a tensor at hand), ``0 .. n - 1`` positions and whole shapes. Shared by the rules of
``writer_rules`` and ``writer_attention``."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..core.errors import SerializationError

__all__ = ["dim_value", "positions", "length_range", "shape_tensor"]


def dim_value(w: Any, node: Any, d: Any, path: str, *, source: tuple[str, int] | None = None,
              vector: bool = False) -> str:
    """``d`` as an int64 scalar (``vector``: shape ``(1,)``): a constant for an int;
    else the size at ``source`` (tensor name, axis) or, without one, at the graph input
    holding the symbolic dim, or an expression of such dims (``floordiv(h, 2) + 1``)
    computed from them."""
    if isinstance(d, (int, np.integer)):
        return w.constant(f"{path}.size", np.asarray([d] if vector else d, np.int64))
    if source is None and str(d) not in w.dims:
        value = _Expression(w, node, str(d), path).value()
        if not vector:
            return value
        axes = w.constant(f"{path}.vector", np.asarray([0], np.int64))
        return w.node("Unsqueeze", [value, axes], path, part=True)[0]
    tensor, axis = source or w.dims[str(d)]
    (shape,) = w.node("Shape", [tensor], path, part=True)
    index = w.constant(f"{path}.axis", np.asarray([axis] if vector else axis, np.int64))
    return w.node("Gather", [shape, index], path, part=True, axis=0)[0]


class _Expression:
    """A symbolic dim's expression, as JAX writes it (``- 2*floordiv(h, 2) + w``: sums
    of products of ints, dims of the graph's inputs and ``floordiv``, ``mod``, ``max``,
    ``min``), as int64 operators; ``floordiv`` rounds down, as JAX's."""

    _TOKENS = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|(\S))")
    _CALLS = {"mod": "Mod", "max": "Max", "min": "Min", "floordiv": "Div"}

    def __init__(self, w: Any, node: Any, text: str, path: str):
        self.w, self.node, self.text, self.path = w, node, text, path
        self.tokens = [m.groups() for m in self._TOKENS.finditer(text)]
        self.at = self.count = 0

    def value(self) -> str:
        out = self._sum()
        if self.at != len(self.tokens):
            self._fail()
        return out

    def _fail(self) -> None:
        raise SerializationError(f"layer {self.path!r} (op {self.node.op.op_name}): the length "
                                 f"{self.text} is no expression of the graph's inputs' dims")

    def _peek(self) -> str | None:
        return self.tokens[self.at][2] if self.at < len(self.tokens) else None

    def _take(self, symbol: str) -> None:
        if self._peek() != symbol:
            self._fail()
        self.at += 1

    def _where(self) -> str:  # each node of the expression named apart
        self.count += 1
        return f"{self.path}/e{self.count}"

    def _op(self, op_type: str, *args: str) -> str:
        return self.w.node(op_type, list(args), self._where(), part=True)[0]

    def _sum(self) -> str:
        out = self._product()
        while self._peek() in ("+", "-"):
            sign = self._peek()
            self.at += 1
            out = self._op("Add" if sign == "+" else "Sub", out, self._product())
        return out

    def _product(self) -> str:
        if self._peek() == "-":
            self.at += 1
            return self._op("Neg", self._product())
        out = self._factor()
        while self._peek() == "*":
            self.at += 1
            out = self._op("Mul", out, self._factor())
        return out

    def _factor(self) -> str:
        if self.at >= len(self.tokens):
            self._fail()
        number, name, symbol = self.tokens[self.at]
        self.at += 1
        if number is not None:
            return self.w.constant(f"{self._where()}.int", np.asarray(int(number), np.int64))
        if symbol == "(":
            out = self._sum()
            self._take(")")
            return out
        if name is None:
            self._fail()
        if self._peek() != "(":
            if name not in self.w.dims:
                self._fail()
            return dim_value(self.w, self.node, name, self._where())
        if name not in self._CALLS:
            self._fail()
        self._take("(")
        a = self._sum()
        self._take(",")
        b = self._sum()
        self._take(")")
        if name != "floordiv":
            return self._op(self._CALLS[name], a, b)
        return self._op("Div", self._op("Sub", a, self._op("Mod", a, b)), b)


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
