"""The JSON schema of a graph, written: its constants and limits, and how each node,
spec and attribute value is encoded (docs/file_format.md). ``json_format`` is the
entry point; ``json_reader`` reads and checks what this writes."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from ..core.errors import MlaxGraphError, SerializationError, SourceInfo
from ..core.registry import lookup
from ..core.specs import TensorSpec, is_symbolic
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Layer
from .functions import function_name, unregistered_message

__all__ = ["FORMAT", "VERSION", "Limits", "LIMITS", "RecordedSource", "graph_to_dict"]

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
