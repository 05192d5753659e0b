"""Reading a graph's JSON: every field checked for its type, size and canonical form,
ops and functions looked up by name in their registries, nothing imported, evaluated
or unpickled (``json_format`` is the entry point)."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import re
import types
import typing
from typing import Any

import numpy as np

from ..core.errors import MlaxGraphError, SerializationError
from ..core.registry import lookup, near_op
from ..core.specs import TensorSpec, as_dim, as_dtype, has_control_characters, is_symbolic
from ..ir.graph import Graph, InputLayer
from ..ir.node import Node, Value
from ..ir.op import Layer
from .functions import lookup_function
from .json_schema import (
    _DIM_TEXT,
    _GRAPH_KEYS,
    _NODE_KEYS,
    _SOURCE_KEYS,
    _TAGS,
    DTYPE_NAMES,
    LIMITS,
    VERSION,
    RecordedSource,
    _encode_value,
)

__all__ = ["Reader", "expect_keys", "short", "is_int"]


class Reader:
    """Decodes the ``graph`` object, checking each field as it goes."""

    def __init__(self):
        self.nodes = 0

    def graph(self, data: Any, where: str, depth: int) -> Graph:
        if depth > LIMITS.block_depth:
            raise SerializationError(f"{where}: blocks are nested deeper than "
                                     f"{LIMITS.block_depth} levels")
        expect_keys(data, _GRAPH_KEYS, where)
        name = _name(data["name"], f"{where}.name")
        inputs = tuple(_name(n, f"{where}.inputs[{i}]")
                       for i, n in enumerate(_list(data["inputs"], f"{where}.inputs")))
        outputs = tuple(_value(v, f"{where}.outputs[{i}]")
                        for i, v in enumerate(_list(data["outputs"], f"{where}.outputs")))
        nodes: list[Node] = []
        ops_by_layer: dict[str, Layer] = {}
        for i, raw in enumerate(_list(data["nodes"], f"{where}.nodes")):
            self.nodes += 1
            if self.nodes > LIMITS.nodes:
                raise SerializationError(f"{where}: more than {LIMITS.nodes} nodes")
            node = self.node(raw, f"{where}.nodes[{i}]", depth)
            # Nodes sharing a layer share one op object, as the builder makes them.
            owner = ops_by_layer.setdefault(node.layer, node.op)
            if owner is not node.op and owner == node.op:
                node = node.replace(op=owner)
            nodes.append(node)
        try:
            return Graph.from_parts(nodes, inputs, outputs, name)
        except MlaxGraphError as e:
            raise SerializationError(f"{where}: {e}") from e

    def node(self, data: Any, where: str, depth: int) -> Node:
        expect_keys(data, _NODE_KEYS, where)
        name = _name(data["name"], f"{where}.name")
        where = f"{where} (node {name!r})"
        op_name = _name(data["op"], f"{where}.op")
        try:
            cls = lookup(op_name)
        except MlaxGraphError:
            raise SerializationError(f"{where}.op: unknown op {op_name!r}{near_op(op_name)}; ops are looked up "
                                     f"by name among the registered ops (import the module "
                                     f"that registers it before loading)") from None
        layer = _name(data["layer"], f"{where}.layer")
        attrs = data["attrs"]
        if not isinstance(attrs, dict):
            raise SerializationError(f"{where}.attrs: expected an object, got {_kind(attrs)}")
        op = self.op(cls, attrs, layer, f"{where}.attrs", depth)
        inputs = tuple(_value(v, f"{where}.inputs[{i}]")
                       for i, v in enumerate(_list(data["inputs"], f"{where}.inputs")))
        raw_outputs = _list(data["outputs"], f"{where}.outputs")
        if not raw_outputs or len(raw_outputs) > LIMITS.outputs:
            raise SerializationError(f"{where}.outputs: expected 1 to {LIMITS.outputs} specs, "
                                     f"got {len(raw_outputs)}")
        outputs = tuple(_spec(s, f"{where}.outputs[{i}]") for i, s in enumerate(raw_outputs))
        return Node(name, op, inputs, outputs, layer, _source(data["source"], f"{where}.source"))

    def op(self, cls: type[Layer], attrs: dict, layer: str, where: str, depth: int) -> Layer:
        fields = {f.name: f for f in dataclasses.fields(cls) if f.compare}
        for key in attrs:
            if key not in fields:
                raise SerializationError(f"{where}: op {cls.op_name!r} has no attribute "
                                         f"{key[:80]!r}; it has {', '.join(fields) or 'none'}")
        missing = [k for k, f in fields.items() if k not in attrs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise SerializationError(f"{where}: op {cls.op_name!r} needs the attributes "
                                     f"{', '.join(missing)}")
        if cls is InputLayer and "shape" in attrs:
            shape = _list(attrs["shape"], f"{where}.shape")
            if len(shape) > LIMITS.rank:
                raise SerializationError(f"{where}.shape: rank above {LIMITS.rank}")
        values = {k: self.value(v, f"{where}.{k}", depth, 0) for k, v in attrs.items()}
        hints = _field_types(cls)
        for key, value in values.items():
            if key in hints and not _matches(value, hints[key]):
                raise SerializationError(f"{where}.{key}: op {cls.op_name!r} declares it "
                                         f"{_type_name(hints[key])}, got {short(attrs[key])}")
        try:
            op = cls(**values, name=layer)
        except Exception as e:  # the op's validate raises mg errors; odd types anything
            raise SerializationError(f"{where}: op {cls.op_name!r} rejects these attributes: "
                                     f"{type(e).__name__}: {e}") from e
        if op.subgraph() is None:
            # Only the canonical form graph_to_json writes is accepted: what the op made
            # of the attributes must write back as the same values.
            for key, raw in attrs.items():
                try:
                    again = _encode_value(getattr(op, key), where, True)
                except SerializationError as e:
                    raise SerializationError(f"{where}.{key}: {e}") from None
                if not _same_json(again, raw):
                    raise SerializationError(
                        f"{where}.{key}: {short(raw)} is not in canonical form; op "
                        f"{cls.op_name!r} reads it as {short(again)}, write that")
        return op

    def value(self, data: Any, where: str, depth: int, level: int):
        if level > LIMITS.value_depth:
            raise SerializationError(f"{where}: nested deeper than {LIMITS.value_depth} levels")
        if data is None or isinstance(data, (bool, float)):
            if isinstance(data, float) and not math.isfinite(data):
                raise SerializationError(f"{where}: non-finite floats are written as "
                                         f"{{\"$float\": ...}}")
            return data
        if isinstance(data, int):
            if abs(data) > LIMITS.int_magnitude:
                raise SerializationError(f"{where}: the int {short(data)} is beyond "
                                         f"+-{LIMITS.int_magnitude}")
            return data
        if isinstance(data, str):
            return _string(data, where)
        if isinstance(data, list):
            return tuple(self.value(v, f"{where}[{i}]", depth, level + 1)
                         for i, v in enumerate(data))
        if not isinstance(data, dict):
            raise SerializationError(f"{where}: unexpected {_kind(data)}")
        if len(data) != 1 or next(iter(data)) not in _TAGS:
            raise SerializationError(f"{where}: an object attribute value must be one of "
                                     f"{', '.join(sorted(_TAGS))} with one key, got keys "
                                     f"{short(sorted(data)[:5])}")
        ((tag, inner),) = data.items()
        where = f"{where}.{tag}"
        if tag == "$dtype":
            return _dtype(inner, where)
        if tag == "$dim":
            return _dim(inner, where)
        if tag == "$float":
            if inner not in ("nan", "inf", "-inf"):
                raise SerializationError(f"{where}: expected 'nan', 'inf' or '-inf', got "
                                         f"{short(inner)}")
            return float(inner)
        if tag == "$list":
            return [self.value(v, f"{where}[{i}]", depth, level + 1)
                    for i, v in enumerate(_list(inner, where))]
        if tag == "$function":
            try:
                return lookup_function(_name(inner, where))
            except SerializationError as e:
                raise SerializationError(f"{where}: {e}") from None
        return self.graph(inner, where, depth + 1)  # "$graph"


# --- attribute types: each value must fit its op field's annotation ---------------------

_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of an op's fields (from mlaxgraph's or the op author's
    source, never from the file); empty when they cannot be resolved, leaving the
    checks to the op's own ``validate``."""
    if cls not in _FIELD_TYPES:
        try:
            _FIELD_TYPES[cls] = typing.get_type_hints(cls)
        except Exception:
            _FIELD_TYPES[cls] = {}
    return _FIELD_TYPES[cls]


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if hint is float:  # an int is a float's value too, as in Python's typing
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(map(_matches, value, args)))
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value) and not isinstance(value, (type, Graph))
    if isinstance(hint, type) and origin is None:
        return isinstance(value, hint)
    return True  # a typing form not checked here; the op's validate checks the value


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


# --- field readers ---------------------------------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an int", float: "a float", type(None): "null"}.get(type(value), type(value).__name__)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same_json(a: Any, b: Any) -> bool:
    """Equality of JSON values that tells ints, floats and bools apart."""
    if type(a) is not type(b) and not (isinstance(a, float) and is_int(b)):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, float) and is_int(b):
        return a == b  # a whole float written as an int: accepted, it reads the same
    return a == b


def expect_keys(data: Any, keys: frozenset, where: str) -> None:
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected an object, got {_kind(data)}")
    missing = sorted(keys - data.keys())
    if missing:
        raise SerializationError(f"{where}: missing the field{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(missing)}")
    extra = sorted(data.keys() - keys)
    if extra:
        raise SerializationError(f"{where}: unknown field {short(extra[0])}; schema version "
                                 f"{VERSION} has {', '.join(sorted(keys))}")


def _list(data: Any, where: str) -> list:
    if not isinstance(data, list):
        raise SerializationError(f"{where}: expected an array, got {_kind(data)}")
    return data


def _string(data: Any, where: str, limit: int | None = None) -> str:
    limit = LIMITS.string_chars if limit is None else limit
    if not isinstance(data, str):
        raise SerializationError(f"{where}: expected a string, got {_kind(data)}")
    if len(data) > limit:
        raise SerializationError(f"{where}: a string of {len(data)} characters, more than "
                                 f"the limit of {limit}")
    return data


def _name(data: Any, where: str) -> str:
    name = _string(data, where, LIMITS.name_chars)
    if not name or has_control_characters(name):
        raise SerializationError(f"{where}: a name must be non-empty, without control "
                                 f"characters, got {short(name)}")
    return name


def _index(data: Any, where: str) -> int:
    if not is_int(data) or not 0 <= data < 2**31:
        raise SerializationError(f"{where}: expected an output index (an int >= 0), got "
                                 f"{short(data)}")
    return data


def _value(data: Any, where: str) -> Value:
    if not isinstance(data, list) or len(data) != 2:
        raise SerializationError(f"{where}: expected [node name, output index], got {short(data)}")
    return Value(_name(data[0], f"{where}[0]"), _index(data[1], f"{where}[1]"))


def _dtype(data: Any, where: str) -> np.dtype:
    if data not in DTYPE_NAMES:
        raise SerializationError(f"{where}: unknown dtype {short(data)}; expected one of "
                                 f"{', '.join(DTYPE_NAMES)}")
    try:
        return as_dtype(data)
    except MlaxGraphError as e:
        raise SerializationError(f"{where}: {e}") from None


def _dim(data: Any, where: str):
    if is_int(data):
        if not 0 <= data <= LIMITS.dim:
            raise SerializationError(f"{where}: a dim must be in [0, {LIMITS.dim}], got "
                                     f"{short(data)}")
        return data
    text = _string(data, where, LIMITS.name_chars)
    if not _DIM_TEXT.fullmatch(text):
        raise SerializationError(f"{where}: a symbolic dim is a dimension expression such as "
                                 f"'batch' or '2*batch', got {short(text)}")
    if any(len(digits) > 13 or int(digits) > LIMITS.dim for digits in re.findall(r"\d+", text)):
        raise SerializationError(f"{where}: a constant in {short(text)} is beyond {LIMITS.dim}")
    try:
        dim = as_dim(text)
    except (MlaxGraphError, RecursionError) as e:
        raise SerializationError(f"{where}: {e}") from None
    if not is_symbolic(dim):
        raise SerializationError(f"{where}: {text!r} is the constant {dim}; write it as an int")
    if str(dim) != text:
        raise SerializationError(f"{where}: {text!r} is not in canonical form; write "
                                 f"{str(dim)!r}")
    return dim


def _spec(data: Any, where: str) -> TensorSpec:
    expect_keys(data, frozenset({"shape", "dtype"}), where)
    shape = _list(data["shape"], f"{where}.shape")
    if len(shape) > LIMITS.rank:
        raise SerializationError(f"{where}.shape: rank {len(shape)} is above {LIMITS.rank}")
    dims = tuple(_dim(d, f"{where}.shape[{i}]") for i, d in enumerate(shape))
    return TensorSpec(dims, _dtype(data["dtype"], f"{where}.dtype"))


def _source(data: Any, where: str) -> RecordedSource | None:
    if data is None:
        return None
    expect_keys(data, _SOURCE_KEYS, where)
    line = data["line"]
    if not is_int(line) or not 0 <= line < 2**31:
        raise SerializationError(f"{where}.line: expected a line number, got {short(line)}")
    file = _string(data["file"], f"{where}.file")
    function = _string(data["function"], f"{where}.function", LIMITS.name_chars)
    if any(ord(c) < 32 for c in file + function):
        raise SerializationError(f"{where}: control characters in a source location")
    return RecordedSource(file, line, function)
