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

import json
from typing import Any

from ..compiler.passes.infer_shapes import infer_shapes
from ..compiler.passes.verify import verify
from ..core.errors import MlaxGraphError, SerializationError
from ..ir.builder import weight_shapes
from ..ir.graph import Graph
from .json_reader import Reader, expect_keys, is_int, short
from .json_schema import (
    _TOP_KEYS,
    FORMAT,
    LIMITS,
    VERSION,
    Limits,
    RecordedSource,
    graph_to_dict,
)

__all__ = ["FORMAT", "VERSION", "graph_to_json", "graph_from_json", "graph_to_dict",
           "graph_from_dict", "RecordedSource", "Limits", "LIMITS"]


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
    expect_keys(data, _TOP_KEYS, "the file")
    fmt = data["format"]
    if fmt != FORMAT:
        raise SerializationError(f"format: expected {FORMAT!r}, got {short(fmt)}; this is "
                                 f"not an mlaxgraph graph file")
    version = data["version"]
    if not is_int(version) or version < 1:
        raise SerializationError(f"version: expected a positive int, got {short(version)}")
    if version > VERSION:
        raise SerializationError(f"version: the file has schema version {version}, but this "
                                 f"mlaxgraph reads versions up to {VERSION}; upgrade mlaxgraph")
    reader = Reader()
    try:
        graph = reader.graph(data["graph"], "graph", 0)
    except RecursionError:
        raise SerializationError("the graph is nested too deeply to read") from None
    return _check(graph)


def _check(graph: Graph) -> Graph:
    """Runs the structural and shape checks on a graph read from a file."""
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


def _check_weight_sizes(graph: Graph, weight_shapes) -> None:
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        for path, shape in weight_shapes(node.op, graph.input_specs_of(node)).items():
            size = 1
            for d in shape:
                size *= int(d)
            if any(int(d) > LIMITS.dim for d in shape) or size > LIMITS.weight_elements:
                raise SerializationError(
                    f"layer {node.name!r} (op {node.op.op_name}) would have a weight "
                    f"{path!r} of shape {tuple(shape)}, beyond the limits of {LIMITS.dim} "
                    f"per dim and {LIMITS.weight_elements} elements")
