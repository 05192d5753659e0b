"""Graph: the immutable IR, and its input op (``input``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import GraphError, capture_source
from ..core.registry import register
from ..core.specs import Dim, TensorSpec, as_dtype, has_control_characters
from .builder import Call, SymbolicTensor, trace_graph
from .node import Node, Value
from .op import Layer, field

if TYPE_CHECKING:
    from .block import Block

__all__ = ["Graph", "Input", "InputLayer"]


@register("input")
@dataclasses.dataclass(frozen=True)
class InputLayer(Layer):
    """A graph input. Made by ``mg.Input``; not called like other layers."""

    shape: tuple[Dim, ...] = field(converter=lambda value, layer: TensorSpec.of(value, "float32").shape)
    dtype: np.dtype = field(converter=lambda value, layer: as_dtype(value))
    axes: tuple[str | None, ...] | None = field(
        default=None, converter=lambda value, layer: None if value is None else tuple(value))

    def validate(self):
        if self.axes is not None and len(self.axes) != len(self.shape):
            self.invalid(f"axes {self.axes} name {len(self.axes)} dims but the shape "
                         f"{TensorSpec(self.shape, self.dtype)} has {len(self.shape)}")

    @property
    def default_name(self) -> str:
        return "input"

    def infer(self, inputs):
        return (TensorSpec(self.shape, self.dtype),)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


def Input(shape: Sequence[Any], dtype: Any = "float32", *, name: str | None = None,
          axes: Sequence[str | None] | None = None) -> SymbolicTensor:
    """A graph input: a symbolic tensor of the given shape and dtype.

    Args:
      shape: ints and names; a name (``"batch"``) is a symbolic dim.
      dtype: a dtype or its name; ``"float32"`` by default.
      name: the input's name (``input``, ``input_1``, ... when not given).
      axes: logical axis names of its dims, for sharding.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.Input(("batch", 784), name="pixels")
      SymbolicTensor(f32[batch,784], from 'pixels')
    """
    # Fields' converters take raw values (a bare name or int reaches the shape converter,
    # which rejects it with a ShapeError); mypy types a dataclass's __init__ with the
    # converted forms, so the raw shape goes in as Any.
    raw_shape: Any = tuple(shape) if not isinstance(shape, (str, int)) else shape
    layer = InputLayer(raw_shape, dtype, None if axes is None else tuple(axes), name=name)
    call = Call(layer, (), (TensorSpec(layer.shape, layer.dtype),), capture_source())
    return SymbolicTensor(call.outputs[0], call, 0)


class Graph:
    """An immutable, hashable graph of layers with typed shapes.

    Args:
      inputs: one symbolic tensor from ``mg.Input`` or a list of them.
      outputs: one symbolic tensor or a list of them.
      name: the graph's name; also the default name of the block it becomes when
        called on symbolic tensors.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 4), name="x")
      >>> g = mg.Graph(inputs=x, outputs=ops.relu(ops.Linear(3)(x)), name="tiny")
      >>> print(g)
      graph tiny(%x: f32[batch,4]) {
        %linear: f32[batch,3] = linear[features=3](%x)
        %relu: f32[batch,3] = relu(%linear)
        return %relu
      }
    """

    __slots__ = ("_nodes", "_inputs", "_outputs", "_name", "_index", "_hash", "_block", "_memo")
    # The slots, set once by _set (through object.__setattr__: the graph is immutable)
    # except the caches, filled on first use: the hash, the block, and the memo of
    # what is computed from the graph (rewrites, the use-def index, verification).
    _nodes: tuple[Node, ...]
    _inputs: tuple[str, ...]
    _outputs: tuple[Value, ...]
    _name: str
    _index: dict[str, Node]
    _hash: int | None
    _block: Block | None
    _memo: dict[str, Any]

    def __init__(self, inputs: Any, outputs: Any, name: str = "graph"):
        if not isinstance(name, str) or not name or has_control_characters(name):
            raise GraphError(f"a graph name must be a non-empty string, got {name!r} (without "
                             f"control characters, which files cannot store)")
        nodes, input_names, output_values = trace_graph(inputs, outputs)
        self._set(nodes, input_names, output_values, name)

    @classmethod
    def from_parts(cls, nodes: Sequence[Node], inputs: Sequence[str],
                   outputs: Sequence[Value], name: str) -> Graph:
        """A graph from its records, as passes and loaders make them (unverified)."""
        nodes, inputs, outputs = tuple(nodes), tuple(inputs), tuple(outputs)
        for node in nodes:
            if not isinstance(node, Node):
                raise GraphError(f"graph {name!r}: nodes must be mg.Node records, got {node!r}")
        graph = object.__new__(cls)
        graph._set(nodes, inputs, outputs, name)
        return graph

    def _set(self, nodes, inputs, outputs, name) -> None:
        set_ = object.__setattr__
        set_(self, "_nodes", nodes)
        set_(self, "_inputs", inputs)
        set_(self, "_outputs", outputs)
        set_(self, "_name", name)
        set_(self, "_index", {node.name: node for node in nodes})
        set_(self, "_hash", None)
        set_(self, "_block", None)
        set_(self, "_memo", {})

    def __setattr__(self, key, value):
        raise AttributeError("a Graph is immutable; passes return new graphs")

    # --- the records ------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes, inputs included, in topological (creation) order."""
        return self._nodes

    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the input nodes, in the order ``apply`` takes them."""
        return self._inputs

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self._outputs

    @property
    def name(self) -> str:
        return self._name

    def node(self, name: str) -> Node:
        try:
            return self._index[name]
        except KeyError:
            raise GraphError(f"graph {self._name!r} has no node named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Node]]:
        """Every node with its path (``block/layer``), nested blocks' nodes included,
        each block's nodes listed once, right after the block's first call."""
        for node in self._nodes:
            yield prefix + node.name, node
            inner = node.op.subgraph()
            if inner is not None and not node.shares_weights:
                yield from inner.walk(f"{prefix}{node.name}/")

    def spec(self, value: Value) -> TensorSpec:
        return self.node(value.node).outputs[value.index]

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self.node(name).outputs[0] for name in self._inputs)

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self.spec(v) for v in self._outputs)

    def input_specs_of(self, node: Node) -> tuple[TensorSpec, ...]:
        return tuple(self.spec(v) for v in node.inputs)

    def memo(self, key: str) -> dict:
        """A dict kept with this graph for what is computed from it, by ``key`` (the
        rewriter's results, the use-def index): valid as long as the graph lives."""
        table = self._memo.get(key)
        if table is None:
            table = self._memo[key] = {}
        return table

    def consumers(self) -> dict[str, tuple[Node, ...]]:
        """The use-def index: node name -> the nodes that read any of its outputs, in
        graph order (computed once per graph)."""
        memo = self.memo("consumers")
        index = memo.get("index")
        if index is None:
            readers: dict[str, list[Node]] = {n.name: [] for n in self._nodes}
            for node in self._nodes:
                for name in dict.fromkeys(v.node for v in node.inputs):
                    if name in readers:
                        readers[name].append(node)
            index = memo["index"] = {name: tuple(nodes) for name, nodes in readers.items()}
        return index

    def with_parts(self, *, nodes=None, inputs=None, outputs=None, name=None) -> Graph:
        """A graph with some of its records replaced (not verified here), as passes and
        loaders make them; users change graphs with ``replace`` and its kin."""
        return Graph.from_parts(
            self._nodes if nodes is None else nodes, self._inputs if inputs is None else inputs,
            self._outputs if outputs is None else outputs, self._name if name is None else name)

    # --- change: thin entry points to mlaxgraph.ir.surgery --------------------------

    def select(self, pattern: str | None = None, *, op: Any = None, where: Any = None) -> list[str]:
        """The paths of the layers that match (as in params: ``h.3/attn``), through
        nested blocks, in graph order (docs/surgery.md).

        Args:
          pattern: a glob over paths: ``*`` matches within one name, ``**`` across
            ``/`` (``"h.*/attn"``, ``"**/mlp.*"``; ``**/`` also stands for no name); None
            matches every layer.
          op: a registered op name (``"linear"``, a glob ``"quantized_*"``) or a tuple of them.
          where: a predicate on the layer (the op object).

        Example:
          >>> import mlaxgraph as mg
          >>> g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64})
          >>> g.select("h.*/attn"), g.select(op="layer_norm")[-1]
          (['h.0/attn', 'h.1/attn'], 'ln_f')
        """
        from .surgery import select

        return select(self, pattern, op=op, where=where)

    def replace(self, selection: Any, fn: Any) -> Graph:
        """A new graph where each selected layer's call is replaced by what
        ``fn(layer, *inputs)`` builds on its input tensors (it returns the new output
        tensor, or a tuple for several). A path inside a block changes only that call.

        Example:
          >>> import mlaxgraph as mg
          >>> from mlaxgraph import ops
          >>> g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64})
          >>> g2 = g.replace("h.1/mlp.act", lambda layer, x: ops.relu(x))
          >>> g2.node("h.1").op.graph.node("mlp.act").op.op_name, g2.node("h.0") == g.node("h.0")
          ('relu', True)
        """
        from .surgery import surgery

        return surgery(self, "replace", selection, fn)

    def insert_after(self, selection: Any, fn: Any) -> Graph:
        """A new graph where ``fn(output)`` is applied to each selected layer's output,
        its readers reading the result instead (a probe, a norm, an adapter)."""
        from .surgery import surgery

        return surgery(self, "insert_after", selection, fn)

    def insert_before(self, selection: Any, fn: Any) -> Graph:
        """A new graph where each selected layer reads ``fn(*inputs)`` (one tensor per
        input) instead of its inputs."""
        from .surgery import surgery

        return surgery(self, "insert_before", selection, fn)

    def remove(self, selection: Any) -> Graph:
        """A new graph without the selected layers, each one's readers reading its
        (first) input instead; the layer's output must have that input's spec."""
        from .surgery import surgery

        return surgery(self, "remove", selection, None)

    # --- value semantics ------------------------------------------------------------

    def _key(self):
        return (self._name, self._nodes, self._inputs, self._outputs)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Graph):
            return NotImplemented
        return hash(self) == hash(other) and self._key() == other._key()

    def __hash__(self) -> int:
        value = self._hash
        if value is None:
            value = hash(self._key())
            object.__setattr__(self, "_hash", value)
        return value

    def __reduce__(self):
        return (Graph.from_parts, (self._nodes, self._inputs, self._outputs, self._name))

    # --- use ------------------------------------------------------------------------

    def __call__(self, *inputs: Any):
        """Calls the graph on symbolic tensors as a nested block with its own name scope.

        Like any layer object, the same graph called twice shares its weights; use
        ``as_block(name=...)`` for a separately named block with weights of its own.
        """
        from .block import Block

        block = self._block
        if block is None:
            block = Block(self)
            object.__setattr__(self, "_block", block)
        return block(*inputs)

    def as_block(self, name: str | None = None):
        """A new block layer running this graph, with its own weights and ``name``."""
        from .block import Block

        return Block(self, name=name)

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.input_specs)
        outs = ", ".join(str(s) for s in self.output_specs)
        return f"<Graph {self._name!r}: ({ins}) -> ({outs}), {len(self._nodes)} nodes>"

    # --- see and save: thin entry points to mlaxgraph.render and mlaxgraph.io ----------

    def to_json(self, indent: int | None = None) -> str:
        """The graph as JSON text in the documented, versioned schema (docs/file_format.md)."""
        from ..io.json_format import graph_to_json
        return graph_to_json(self, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """A graph from ``to_json`` text; ops are looked up by name, no code runs."""
        from ..io.json_format import graph_from_json
        return graph_from_json(text)

    def to_onnx(self, path: Any, params: Any = None, state: Any = None, *, opset: int = 21, **unknown: Any):
        """The graph and its weights written as ONNX to ``path`` (``mlaxgraph.onnx.writer``)."""
        from ..onnx.writer import to_onnx
        return to_onnx(self, path, params, state, opset=opset, **unknown)

    def to_dot(self, **options: Any) -> str:
        """DOT text for Graphviz (no dependency); options as ``render``."""
        from ..render.dot import graph_to_dot
        return graph_to_dot(self, **options)

    def render(self, path: Any, format: str | None = None, **options: Any):
        """Renders the graph to ``path`` (svg, png or pdf, from the suffix or
        ``format``) with Graphviz's ``dot``; returns the path."""
        from ..render.graphviz import render_graph

        return render_graph(self, path, format=format, **options)

    def to_networkx(self):
        """The graph as a ``networkx.MultiDiGraph``."""
        from ..render.networkx import graph_to_networkx
        return graph_to_networkx(self)

    @classmethod
    def from_networkx(cls, nx_graph) -> Graph:
        """A graph from ``to_networkx`` output (possibly edited)."""
        from ..render.networkx import graph_from_networkx

        return graph_from_networkx(nx_graph)

    def _repr_svg_(self):
        from ..render.graphviz import repr_svg

        return repr_svg(self)

    def to_html(self, path: Any = None, **options: Any):
        """The interactive explorer page (self-contained HTML; docs/explorer.md): its
        text, or with ``path`` the page written there and its path. Options as
        ``mlaxgraph.render.html.page.to_html`` (``overlay=``, dims such as ``batch=8``)."""
        from ..render.html.page import to_html

        return to_html(self, path, **options)

    def to_model_explorer(self, path: Any, overlay: Any = None, **dims: int):
        """Writes the graph in Google Model Explorer's JSON graph format to ``path``, and
        a node-data file per overlay beside it; returns the paths written."""
        from ..render.html.model_explorer import write_model_explorer

        return write_model_explorer(self, path, overlay=overlay, **dims)

    def _repr_html_(self):
        from ..render.html.page import notebook_html

        return notebook_html(self.to_html())

    def summary(self, expand_nested: bool = False, **unknown: Any) -> str:
        """A table of layers: name, op, output shape, dtype, params, connected to; then
        the totals of trainable and non-trainable params (sizes at float32).

        Args:
          expand_nested: also list the layers of nested blocks, indented under them.
        """
        from ..render.summary import summarize

        return summarize(self, expand_nested=expand_nested, unknown=unknown)
