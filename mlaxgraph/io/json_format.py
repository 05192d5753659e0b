"""The JSON form of a graph: a versioned, documented schema (docs/file_format.md).

Writing is deterministic: object keys are sorted, lists keep the graph's order, and
the text is ASCII, so equal graphs with equal recorded sources give byte-identical
text (``sources=False`` leaves sources out, making the text a function of the graph's
value alone).

Reading trusts nothing in the text. Ops are looked up in the op registry by name and
functions in the function registry (``mlaxgraph.io.functions``) by name; nothing is
imported, evaluated, looked up as an attribute or unpickled. Every field is checked
for its type and size, the file must be in the canonical form ``graph_to_json`` writes,
and the graph is then verified and its shapes re-inferred, so a file cannot claim
shapes its ops do not produce. Any problem raises ``SerializationError`` (whose
``__cause__`` is the specific ``GraphError``/``ShapeError``/``DTypeError`` when there is
one), naming the place in the file (``graph.nodes[3].attrs.features``).

Example:
  >>> import mlaxgraph as mg
  >>> from mlaxgraph import ops
  >>> x = mg.Input(("batch", 4), name="x")
  >>> g = mg.Graph(x, ops.Linear(2, name="fc")(x), name="tiny")
  >>> text = graph_to_json(g, sources=False)
  >>> text[:60]
  '{"format":"mlaxgraph.graph","graph":{"inputs":["x"],"name":"'
  >>> graph_from_json(text) == g
  True
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import re
import types
import typing
from typing import Any

import numpy as np

from ..errors import MlaxGraphError, SerializationError, SourceInfo
from ..ir.graph import Block, Graph, InputLayer
from ..ir.node import Node, Value
from ..ops.base import Layer
from ..ops.registry import lookup
from ..specs import TensorSpec, as_dim, as_dtype, is_symbolic
from .functions import function_name, lookup_function, unregistered_message

__all__ = ["FORMAT", "VERSION", "graph_to_json", "graph_from_json", "graph_to_dict",
           "graph_from_dict", "RecordedSource", "Limits", "LIMITS"]

#: The value of the file's ``format`` field.
FORMAT = "mlaxgraph.graph"
#: The schema version this code writes, and the newest it reads.
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Limits:
    """Sizes beyond which a file is rejected rather than read (documented in
    docs/file_format.md)."""

    text_bytes: int = 64 * 2**20      # the whole JSON text
    nodes: int = 100_000              # nodes in all graphs, nested ones included
    block_depth: int = 16             # graphs nested in blocks
    value_depth: int = 32             # nesting of an attribute value (tuples in tuples)
    name_chars: int = 256             # node, layer, graph, op and function names
    string_chars: int = 4096          # other strings (attribute values, source paths)
    dim: int = 2**40                  # one dimension of a tensor or a weight
    weight_elements: int = 2**40      # elements of one weight
    rank: int = 64                    # dims of a tensor
    outputs: int = 4096               # outputs of one node
    int_magnitude: int = 2**63 - 1    # any integer attribute


LIMITS = Limits()

# The dtypes a file may name: numpy/ml_dtypes names, as ``np.dtype(...).name`` prints them.
DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
               "complex128", "float8_e4m3fn", "float8_e5m2")

_DIM_TEXT = re.compile(r"[A-Za-z0-9_+\-*(), ]+")
_NODE_KEYS = frozenset({"name", "op", "attrs", "inputs", "outputs", "layer", "source"})
_GRAPH_KEYS = frozenset({"name", "inputs", "outputs", "nodes"})
_TOP_KEYS = frozenset({"format", "version", "graph"})
_SOURCE_KEYS = frozenset({"file", "line", "function"})
_TAGS = frozenset({"$dtype", "$dim", "$float", "$list", "$graph", "$function"})


@dataclasses.dataclass(frozen=True)
class RecordedSource(SourceInfo):
    """A source location read from a file. Error messages show ``file:line`` but never
    open the file: a path in a file is data, not something to read."""

    def code(self) -> str:
        return ""


# ======================================================================================
# Writing
# ======================================================================================


def graph_to_json(graph: Graph, indent: int | None = None, *, sources: bool = True) -> str:
    """The graph as JSON text in schema version 1.

    Args:
      graph: the graph.
      indent: None for compact one-line text, or spaces per level.
      sources: whether to record each node's source location (``file``, ``line``,
        ``function`` where the user created it); without, ``source`` is null.

    Raises:
      SerializationError: the graph holds something the format cannot hold: a
        function that is not registered (``mg.register_function``), or an attribute
        value of a type the schema does not have.
    """
    if indent is not None and (not isinstance(indent, int) or isinstance(indent, bool) or indent < 0):
        raise SerializationError(f"indent must be None or an int >= 0, got {indent!r}")
    data = graph_to_dict(graph, sources=sources)
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(data, sort_keys=True, indent=indent, separators=separators,
                      ensure_ascii=True, allow_nan=False)


def graph_to_dict(graph: Graph, *, sources: bool = True) -> dict:
    """The JSON-ready dict of ``graph_to_json`` (before ``json.dumps``)."""
    if not isinstance(graph, Graph):
        raise SerializationError(f"expected an mg.Graph, got {type(graph).__name__}")
    return {"format": FORMAT, "version": VERSION, "graph": _encode_graph(graph, sources)}


def _encode_graph(graph: Graph, sources: bool) -> dict:
    return {
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": [[v.node, v.index] for v in graph.outputs],
        "nodes": [_encode_node(graph, node, sources) for node in graph.nodes],
    }


def _encode_node(graph: Graph, node: Node, sources: bool) -> dict:
    op = node.op
    where = f"layer {node.name!r} (op {getattr(op, 'op_name', '?')}) of graph {graph.name!r}"
    if not isinstance(op, Layer):
        raise SerializationError(f"{where} holds {type(op).__name__}, not a layer")
    try:
        registered = lookup(op.op_name)
    except MlaxGraphError:
        registered = None
    if registered is not type(op):
        raise SerializationError(f"{where}: its class {type(op).__qualname__} is not the op "
                                 f"registered as {op.op_name!r}, so a reader could not rebuild "
                                 f"it; register it with mlaxgraph.ops.register")
    source = None
    if sources and node.source is not None:
        source = {"file": node.source.file, "line": node.source.line,
                  "function": node.source.function}
    return {
        "name": node.name,
        "op": op.op_name,
        "attrs": {name: _encode_value(value, f"{where}, attribute {name!r}", sources)
                  for name, value in op.attrs().items()},
        "inputs": [[v.node, v.index] for v in node.inputs],
        "outputs": [_encode_spec(s) for s in node.outputs],
        "layer": node.layer,
        "source": source,
    }


def _encode_spec(spec: TensorSpec) -> dict:
    return {"shape": [_encode_dim(d) for d in spec.shape], "dtype": spec.dtype.name}


def _encode_dim(dim: Any):
    return str(dim) if is_symbolic(dim) else int(dim)


def _is_dim_expr(value: Any) -> bool:
    return hasattr(value, "_get_vars") and hasattr(value, "scope")


def _encode_value(value: Any, where: str, sources: bool, depth: int = 0):
    """One attribute value as JSON: tuples are arrays, other types tagged objects."""
    if depth > LIMITS.value_depth:
        raise SerializationError(f"{where}: nested deeper than {LIMITS.value_depth} levels")
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, str):
        return value
    if isinstance(value, np.dtype):
        return {"$dtype": value.name}
    if _is_dim_expr(value):
        return {"$dim": str(value)}
    if isinstance(value, tuple):
        return [_encode_value(v, where, sources, depth + 1) for v in value]
    if isinstance(value, list):
        return {"$list": [_encode_value(v, where, sources, depth + 1) for v in value]}
    if isinstance(value, Graph):
        return {"$graph": _encode_graph(value, sources)}
    if callable(value) and not isinstance(value, type):
        name = function_name(value)
        if name is None:
            raise SerializationError(unregistered_message(value, where))
        return {"$function": name}
    raise SerializationError(
        f"{where} holds a value of type {type(value).__name__} ({value!r:.80}); the file "
        f"format holds None, bools, ints, floats, strings, dtypes, symbolic dims, tuples, "
        f"lists, graphs and registered functions")


# ======================================================================================
# Reading
# ======================================================================================


def graph_from_json(text: str | bytes | bytearray) -> Graph:
    """A graph from ``graph_to_json`` text. Nothing in the text is executed.

    Raises:
      SerializationError: for anything that is not a valid graph in a schema version
        this mlaxgraph reads, naming the offending field.
    """
    if isinstance(text, (bytes, bytearray)):
        if len(text) > LIMITS.text_bytes:
            raise SerializationError(f"the graph JSON is {len(text)} bytes, more than the "
                                     f"limit of {LIMITS.text_bytes}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SerializationError(f"the graph JSON is not UTF-8 text: {e}") from None
    if not isinstance(text, str):
        raise SerializationError(f"graph_from_json takes str or bytes, got {type(text).__name__}")
    if len(text) > LIMITS.text_bytes:
        raise SerializationError(f"the graph JSON is {len(text)} characters, more than the "
                                 f"limit of {LIMITS.text_bytes}")
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except SerializationError:
        raise
    except RecursionError:
        raise SerializationError("the graph JSON is nested too deeply to read") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise SerializationError(f"the graph text is not valid JSON: {e}") from None
    return graph_from_dict(data)


def _unique_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise SerializationError(f"the graph JSON repeats the key {key[:80]!r} in one object")
        result[key] = value
    return result


def _no_constant(name):
    raise SerializationError(f"the graph JSON holds {name}, which is not JSON; non-finite "
                             f"floats are written as {{\"$float\": \"nan\"}}")


def graph_from_dict(data: Any) -> Graph:
    """A graph from the dict ``graph_to_dict`` returns (as ``json.loads`` gives it),
    checked as ``graph_from_json`` checks text."""
    _expect_keys(data, _TOP_KEYS, "the file")
    fmt = data["format"]
    if fmt != FORMAT:
        raise SerializationError(f"format: expected {FORMAT!r}, got {_short(fmt)}; this is "
                                 f"not an mlaxgraph graph file")
    version = data["version"]
    if not _is_int(version) or version < 1:
        raise SerializationError(f"version: expected a positive int, got {_short(version)}")
    if version > VERSION:
        raise SerializationError(f"version: the file has schema version {version}, but this "
                                 f"mlaxgraph reads versions up to {VERSION}; upgrade mlaxgraph")
    reader = _Reader()
    try:
        graph = reader.graph(data["graph"], "graph", 0)
    except RecursionError:
        raise SerializationError("the graph is nested too deeply to read") from None
    return _check(graph)


def _check(graph: Graph) -> Graph:
    """Runs the structural and shape checks on a graph read from a file."""
    from ..ir.builder import weight_shapes
    from ..passes.infer_shapes import infer_shapes
    from ..passes.verify import verify

    try:
        verify(graph)
        infer_shapes(graph)
        _check_weight_sizes(graph, weight_shapes)
    except SerializationError:
        raise
    except MlaxGraphError as e:
        raise SerializationError(f"the graph in the file is not valid: {e}") from e
    except Exception as e:  # an op's own checks may raise anything on odd hyperparameters
        raise SerializationError(f"the graph in the file is not valid: "
                                 f"{type(e).__name__}: {e}") from e
    return graph


def _check_weight_sizes(graph: Graph, weight_shapes, prefix: str = "") -> None:
    for node in graph.nodes:
        if isinstance(node.op, Block):
            _check_weight_sizes(node.op.graph, weight_shapes, f"{prefix}{node.name}/")
            continue
        if node.name in graph.inputs:
            continue
        for path, shape in weight_shapes(node.op, graph.input_specs_of(node)).items():
            size = 1
            for d in shape:
                size *= int(d)
            if any(int(d) > LIMITS.dim for d in shape) or size > LIMITS.weight_elements:
                raise SerializationError(
                    f"layer {prefix}{node.name!r} (op {node.op.op_name}) would have a weight "
                    f"{path!r} of shape {tuple(shape)}, beyond the limits of {LIMITS.dim} "
                    f"per dim and {LIMITS.weight_elements} elements")


class _Reader:
    """Decodes the ``graph`` object, checking each field as it goes."""

    def __init__(self):
        self.nodes = 0

    def graph(self, data: Any, where: str, depth: int) -> Graph:
        if depth > LIMITS.block_depth:
            raise SerializationError(f"{where}: blocks are nested deeper than "
                                     f"{LIMITS.block_depth} levels")
        _expect_keys(data, _GRAPH_KEYS, where)
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
        _expect_keys(data, _NODE_KEYS, where)
        name = _name(data["name"], f"{where}.name")
        where = f"{where} (node {name!r})"
        op_name = _name(data["op"], f"{where}.op")
        try:
            cls = lookup(op_name)
        except MlaxGraphError:
            raise SerializationError(f"{where}.op: unknown op {op_name!r}; ops are looked up "
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

    def op(self, cls: type, attrs: dict, layer: str, where: str, depth: int) -> Layer:
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
                                         f"{_type_name(hints[key])}, got {_short(attrs[key])}")
        if cls is Block and not isinstance(values.get("graph"), Graph):
            raise SerializationError(f"{where}.graph: a block holds a graph "
                                     f"({{\"$graph\": {{...}}}})")
        try:
            op = cls(**values, name=layer)
        except Exception as e:  # the op's validate raises mg errors; odd types anything
            raise SerializationError(f"{where}: op {cls.op_name!r} rejects these attributes: "
                                     f"{type(e).__name__}: {e}") from e
        if cls is not Block:
            # Only the canonical form graph_to_json writes is accepted: what the op made
            # of the attributes must write back as the same values.
            for key, raw in attrs.items():
                try:
                    again = _encode_value(getattr(op, key), where, True)
                except SerializationError as e:
                    raise SerializationError(f"{where}.{key}: {e}") from None
                if not _same_json(again, raw):
                    raise SerializationError(
                        f"{where}.{key}: {_short(raw)} is not in canonical form; op "
                        f"{cls.op_name!r} reads it as {_short(again)}, write that")
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
                raise SerializationError(f"{where}: the int {_short(data)} is beyond "
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
                                     f"{_short(sorted(data)[:5])}")
        ((tag, inner),) = data.items()
        where = f"{where}.{tag}"
        if tag == "$dtype":
            return _dtype(inner, where)
        if tag == "$dim":
            return _dim(inner, where)
        if tag == "$float":
            if inner not in ("nan", "inf", "-inf"):
                raise SerializationError(f"{where}: expected 'nan', 'inf' or '-inf', got "
                                         f"{_short(inner)}")
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
        return _is_int(value)
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
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "")


# --- field readers ---------------------------------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an int", float: "a float", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same_json(a: Any, b: Any) -> bool:
    """Equality of JSON values that tells ints, floats and bools apart."""
    if type(a) is not type(b) and not (isinstance(a, float) and _is_int(b)):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, float) and _is_int(b):
        return a == b  # a whole float written as an int: accepted, it reads the same
    return a == b


def _expect_keys(data: Any, keys: frozenset, where: str) -> None:
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected an object, got {_kind(data)}")
    missing = sorted(keys - data.keys())
    if missing:
        raise SerializationError(f"{where}: missing the field{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(missing)}")
    extra = sorted(data.keys() - keys)
    if extra:
        raise SerializationError(f"{where}: unknown field {_short(extra[0])}; schema version "
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
    if not name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise SerializationError(f"{where}: a name must be non-empty, without control "
                                 f"characters, got {_short(name)}")
    return name


def _index(data: Any, where: str) -> int:
    if not _is_int(data) or not 0 <= data < 2**31:
        raise SerializationError(f"{where}: expected an output index (an int >= 0), got "
                                 f"{_short(data)}")
    return data


def _value(data: Any, where: str) -> Value:
    if not isinstance(data, list) or len(data) != 2:
        raise SerializationError(f"{where}: expected [node name, output index], got {_short(data)}")
    return Value(_name(data[0], f"{where}[0]"), _index(data[1], f"{where}[1]"))


def _dtype(data: Any, where: str) -> np.dtype:
    if data not in DTYPE_NAMES:
        raise SerializationError(f"{where}: unknown dtype {_short(data)}; expected one of "
                                 f"{', '.join(DTYPE_NAMES)}")
    try:
        return as_dtype(data)
    except MlaxGraphError as e:
        raise SerializationError(f"{where}: {e}") from None


def _dim(data: Any, where: str):
    if _is_int(data):
        if not 0 <= data <= LIMITS.dim:
            raise SerializationError(f"{where}: a dim must be in [0, {LIMITS.dim}], got "
                                     f"{_short(data)}")
        return data
    text = _string(data, where, LIMITS.name_chars)
    if not _DIM_TEXT.fullmatch(text):
        raise SerializationError(f"{where}: a symbolic dim is a dimension expression such as "
                                 f"'batch' or '2*batch', got {_short(text)}")
    if any(len(digits) > 13 or int(digits) > LIMITS.dim for digits in re.findall(r"\d+", text)):
        raise SerializationError(f"{where}: a constant in {_short(text)} is beyond {LIMITS.dim}")
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
    _expect_keys(data, frozenset({"shape", "dtype"}), where)
    shape = _list(data["shape"], f"{where}.shape")
    if len(shape) > LIMITS.rank:
        raise SerializationError(f"{where}.shape: rank {len(shape)} is above {LIMITS.rank}")
    dims = tuple(_dim(d, f"{where}.shape[{i}]") for i, d in enumerate(shape))
    return TensorSpec(dims, _dtype(data["dtype"], f"{where}.dtype"))


def _source(data: Any, where: str) -> RecordedSource | None:
    if data is None:
        return None
    _expect_keys(data, _SOURCE_KEYS, where)
    line = data["line"]
    if not _is_int(line) or not 0 <= line < 2**31:
        raise SerializationError(f"{where}.line: expected a line number, got {_short(line)}")
    file = _string(data["file"], f"{where}.file")
    function = _string(data["function"], f"{where}.function", LIMITS.name_chars)
    if any(ord(c) < 32 for c in file + function):
        raise SerializationError(f"{where}: control characters in a source location")
    return RecordedSource(file, line, function)
