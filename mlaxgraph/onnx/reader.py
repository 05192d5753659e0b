"""``mg.from_onnx``: an ONNX model as a typed mlaxgraph graph, its weights as params.

The nodes are walked in dependency order. Each value is either a tensor of the graph
being built or a constant known now (a ``Constant`` node, an initializer, or the
result of a node whose inputs are all constants, folded when the graph is built: the
shape arithmetic exporters write around ``Shape`` nodes disappears this way). Float
initializers become weights (``params``); other constants used as tensors become
``onnx.constant`` layers. Every other node becomes a layer of the ``onnx`` family.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..core.errors import ConfigError, GraphError, MlaxGraphError, SerializationError, ShapeError
from ..core.signatures import unknown_keywords
from ..ir.graph import Graph, Input
from ..ops.param import Param
from .arguments import FROM_ONNX_HINTS, FROM_ONNX_SIGNATURE, check_sizes_are_ints
from .checks import check_kernel_shape, check_signature, not_static
from .dtypes import canonical, to_dtype
from .layer import TABLE, Constant, encode_array, op_class
from .ops_bounded import BOUNDED, check_sizes, read_sizes
from .ops_training import with_body
from .order import _reads, _toposort, static_inputs
from .patterns import match
from .protos import attribute_value, load_model, tensor_to_array
from .scopes import nest
from .sequences import check_tensors, flatten, read_sequence
from .signature import DimNames, check_declared, check_dims, check_shapes, input_shape, unnamed_hint
from .symbolic import read_range, read_shaped, track
from .versions import _DOMAINS, MIN_OPSET, _opset, check_attributes, domain_versions
from .weights import Weight as _Weight
from .weights import as_value, weight_view

__all__ = ["from_onnx", "read_model", "static_inputs", "MIN_OPSET"]

def _text(value: Any) -> str:
    """A string field of the proto (protobuf hands back bytes for invalid UTF-8)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _safe_name(raw: str, used: set[str], fallback: str) -> str:
    raw = _text(raw)
    name = re.sub(r"[/#]", ".", raw.strip("/")) or fallback
    name = re.sub(r"\s", "_", name)[:200]
    base, n = name, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def scope_of(raw: Any) -> tuple[tuple[str, ...], str]:
    """An exporter's node name as (scope path, last part): ``/layer1/conv1/Conv`` ->
    ``(("layer1", "conv1"), "Conv")``; each part a valid layer name."""
    parts = [re.sub(r"[#\s]", "_", p)[:100] for p in _text(raw).split("/") if p]
    if len(parts) < 2:
        return (), ""
    return tuple(parts[:-1]), parts[-1]


class _Reader:
    def __init__(self, model: Any, folder: str | None, dims: Mapping[str, int], layers: bool,
                 sizes: Mapping[str, Any] | None = None, shapes: Mapping[str, Any] | None = None):
        self.model, self.folder, self.dims, self.layers = model, folder, dict(dims), layers
        self.shapes = shapes
        self.sizes = read_sizes(sizes)
        self.state: dict[str, Any] = {}
        self.symbolic: list[str] = []
        #: layer name -> (scope path, name within it), for nesting (scopes.nest)
        self.places: dict[str, tuple[tuple[str, ...], str]] = {}
        #: the layers named after a module (a pattern's Linear ``fc`` of ``/fc/MatMul``)
        self.modules: set[str] = set()
        self.done: set[int] = set()
        self.consumers: dict[str, list] = {}
        self.outputs = {v.name for v in model.graph.output}
        for n in model.graph.node:
            for v in n.input:
                self.consumers.setdefault(v, []).append(n)
        self.opset = _opset(model)
        self.versions = domain_versions(model, self.opset)
        self.needed = static_inputs(model)  # the values that set shapes or indices
        self.values: dict[str, Any] = {}
        self.params: dict[str, Any] = {}
        self.used: set[str] = set()
        self.materialized: dict[str, Any] = {}
        self.aliases: dict[str, str] | None = None  # Identity outputs -> their weight (weights.py)
        self.shared: dict[tuple, Any] = {}  # the layers several nodes are (patterns.py)
        #: values known when the graph is built up to its symbolic dims (symbolic.py)
        self.dimvals: dict[str, np.ndarray] = {}

    def read(self) -> tuple[Graph, dict, dict]:
        g = self.model.graph
        for t in g.initializer:
            self.values[t.name] = as_value(t.name, tensor_to_array(t, self.folder))
        inputs = []
        shapes = check_shapes(self.shapes, [v.name for v in g.input if v.name not in self.values],
                              [v.name for v in g.input if v.name in self.values])
        dim_names: set[str] = set()
        self.namer = DimNames(g.input)
        for value in g.input:
            if value.name in self.values:
                continue  # an initializer listed as an input: its default, a weight here
            code = value.type.tensor_type.elem_type
            spec_dtype = canonical(to_dtype(code))
            name = _safe_name(value.name, self.used, "input")
            x = Input(input_shape(value, self.dims, shapes, dim_names, self.namer), spec_dtype,
                      name=name)
            self.symbolic += [str(d) for d in x.shape
                              if not isinstance(d, int) and str(d) not in self.symbolic]
            self.values[value.name] = x
            inputs.append(x)
        check_dims(self.dims, dim_names, self.namer)
        check_sizes(self.sizes, [(_text(n.name), n.output[:1], n.op_type) for n in g.node])
        # a Gradient node gets the part of the graph it differentiates as its body
        nodes = [with_body(g, n) if n.op_type == "Gradient" else n for n in g.node]
        for node in _toposort(nodes, set(self.values), set(self.values)):
            try:
                self.node(node)
            except ShapeError as e:  # a word on the dims the file gives no name
                raise unnamed_hint(e, self.namer) from None
            track(self, node, {a.name: attribute_value(a, self.folder, node.name)
                               for a in node.attribute})
        outputs = []
        self.layout: list = []  # a sequence output is its tensors (sequences.flatten)
        for value in g.output:
            if value.name not in self.values:
                raise GraphError(f"graph output {value.name!r} is computed by no node")
            names, layout = flatten(self, value.name)
            outputs += [self.tensor(v) for v in names]
            self.layout.append(layout)
            if value.type.WhichOneof("value") == "tensor_type" and len(names) == 1:
                check_declared(value, outputs[-1])
        name = _safe_name(g.name or "onnx", set(), "onnx")
        return Graph(inputs=inputs, outputs=outputs, name=name), self.params, self.state

    def tensor(self, name: str) -> Any:
        """The value as a tensor of the graph: constants become layers, once."""
        value = self.values[name]
        if not isinstance(value, (_Weight, np.ndarray)):
            return value
        if isinstance(value, _Weight):
            name = value.name  # one weight under several names (Identity) is one layer
        if name in self.materialized:
            return self.materialized[name]
        layer_name = _safe_name(name, self.used, "constant")
        layer: Param | Constant
        if isinstance(value, _Weight):
            array = value.array
            layer = Param(array.shape, dtype=canonical(array.dtype), name=layer_name)
            self.params[layer_name] = {"value": jax.numpy.asarray(array.astype(
                canonical(array.dtype)))}
        else:
            array = np.asarray(value)
            if array.dtype != canonical(array.dtype):
                array = array.astype(canonical(array.dtype))
            layer = Constant(encode_array(array), name=layer_name)
        out = layer()
        self.materialized[name] = out
        return out

    def node(self, node: Any) -> None:
        if id(node) in self.done:
            return
        where = f"node {_text(node.name) or '(unnamed)'!r} ({_text(node.op_type)})"
        attrs = {a.name: attribute_value(a, self.folder, node.name) for a in node.attribute}
        # the values a body (If, Loop, Scan) reads from around it: inputs after the node's own
        names = _reads(node)
        if len(names) > len(node.input):
            attrs["__outer__"] = tuple(names[len(node.input):])
        for v in names:
            if v and v not in self.values:
                raise GraphError(f"{where} reads {v!r}, which no node, input or initializer "
                                 f"provides")
        if node.domain not in _DOMAINS:
            raise GraphError(f"{where}: operators of the domain {node.domain!r} are not "
                             f"supported")
        check_attributes(node, self.versions, where)
        check_kernel_shape(node, attrs, self.values, where)
        check_signature(node, self.values, self.versions, where)
        if not any(node.output):
            raise GraphError(f"{where} has no outputs")
        if node.op_type in BOUNDED:
            attrs.update(self.bound(node))
        if node.op_type == "Constant":
            self.values[node.output[0]] = self.constant(attrs, where)
            return
        if read_sequence(self, node, attrs, where) or weight_view(self, node, attrs) or \
                self.inline_branch(node):
            return
        check_tensors(self, node, names, where)
        if read_range(self, node) or read_shaped(self, node):
            return
        matched = match(self, node, attrs)
        if matched is not None:
            for out_name, out in zip(*matched):
                if out_name:
                    self.values[out_name] = out
            return
        if node.op_type not in TABLE:
            raise GraphError(f"{where}: the ONNX operator {node.op_type} is not supported; "
                             f"supported: {', '.join(sorted(TABLE))}")
        op = TABLE[node.op_type]
        present = tuple(bool(v) for v in names)
        args = [self.values[v] if v else None for v in names]
        statics, tensors = [], []
        static = set(op.static)
        # small constants a body reads around it stay constants in it (an axis, a shape)
        static.update(p for p, value in enumerate(args) if p >= len(node.input)
                      and isinstance(value, np.ndarray) and value.size <= 256)
        for position, (v, value) in enumerate(zip(names, args)):
            if not v:
                continue
            if position in static:
                if not isinstance(value, (np.ndarray, _Weight)):
                    raise not_static(where, position, v, self.symbolic,
                                     any(i.name == v for i in self.model.graph.input))
                array = value.array if isinstance(value, _Weight) else value
                statics.append((position, encode_array(array)))
            else:
                tensors.append(v)
        n_out = len(node.output)
        folded = self.fold_shape(node.op_type, attrs, tensors)
        if folded is not None:
            self.values[node.output[0]] = folded
            return
        layer_cls = op_class(node.op_type)
        # weights fold too where the result sets a shape or an index (a Loop's trip
        # count computed from float initializers)
        fold = (np.ndarray, _Weight) if self.needed & set(node.output) else np.ndarray
        constant = all(isinstance(self.values[v], fold) for v in tensors) and not op.random
        name = _safe_name(node.name, self.used, node.op_type.lower())
        try:
            layer = layer_cls(attributes=tuple(sorted(attrs.items())), static=tuple(statics),
                              present=present, outputs=n_out, opset=self.opset, name=name)
            if constant:
                outs = layer.compute([np.asarray(getattr(self.values[v], "array", self.values[v]))
                                      for v in tensors])
                outs = tuple(np.asarray(o) for o in outs)
            else:
                result = layer(*[self.tensor(v) for v in tensors])
                outs = result if isinstance(result, tuple) else (result,)
                scope, last = scope_of(node.name)
                if scope:
                    self.places[name] = (scope, last)
        except MlaxGraphError:
            raise
        except Exception as e:  # the computation refused the constants it was given
            raise ShapeError(f"{where}: {type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:300]}") from None
        if len(outs) < len([o for o in node.output if o]):
            raise GraphError(f"{where} names {n_out} outputs; the operator gives {len(outs)}")
        for out_name, out in zip(node.output, outs):
            if out_name:
                self.values[out_name] = out

    def inline_branch(self, node: Any) -> bool:
        """An ``If`` whose condition is known when the graph is built is the branch it
        picks, read into the graph node by node: its constants fold (a shape it
        computes sets a shape downstream), and the other branch may give other types
        and shapes."""
        if node.op_type != "If" or not node.input or \
                not isinstance(self.values.get(node.input[0]), np.ndarray):
            return False
        cond = np.asarray(self.values[node.input[0]])
        if cond.size != 1:
            return False
        key = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = next((a.g for a in node.attribute if a.name == key), None)
        if branch is None:
            return False
        made = [o for n in branch.node for o in n.output if o] + [t.name for t in branch.initializer]
        if any(name in self.values for name in made) or \
                len(branch.output) != len(node.output):
            return False  # a branch shadowing a name around it: read as the operator
        for t in branch.initializer:
            self.values[t.name] = as_value(t.name, tensor_to_array(t, self.folder))
        for n in branch.node:
            for v in n.input:
                self.consumers.setdefault(v, []).append(n)
        for n in _toposort(list(branch.node), set(self.values)):
            self.node(n)
        for out_name, value in zip(node.output, branch.output):
            if value.name not in self.values:
                raise GraphError(f"node {_text(node.name) or '(unnamed)'!r} (If): its {key} "
                                 f"output {value.name!r} is computed by no node")
            if out_name:
                self.values[out_name] = self.values[value.name]
        return True

    def bound(self, node: Any) -> dict[str, Any]:
        """The static bound ``sizes`` gives a node of data-dependent output length, by
        its name, its first output's name or its type, as its ``size`` and
        ``fill_value`` attributes (``mlaxgraph.onnx.ops_bounded``)."""
        for key in (_text(node.name), node.output[0], node.op_type):
            if key in self.sizes:
                return self.sizes[key]
        return {}

    def fold_shape(self, op_type: str, attrs: dict, tensors: list[str]) -> np.ndarray | None:
        """``Shape`` and ``Size`` of a tensor whose shape is static, as constants."""
        if op_type not in ("Shape", "Size") or len(tensors) != 1:
            return None
        value = self.values[tensors[0]]
        shape = tuple(np.shape(value)) if isinstance(value, np.ndarray) else (
            value.array.shape if isinstance(value, _Weight) else tuple(value.shape))
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            return None
        if op_type == "Size":
            return np.asarray(int(np.prod(shape, dtype=np.int64)), np.int64)
        return np.asarray(shape[slice(attrs.get("start", 0), attrs.get("end"))], np.int64)

    def constant(self, attrs: dict, where: str) -> np.ndarray:
        for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                           ("value_int", np.int64), ("value_ints", np.int64)):
            if key in attrs:
                return np.asarray(attrs[key], dtype)
        if "value" in attrs:
            from .layer import decode_array
            return decode_array(attrs["value"])
        raise GraphError(f"{where} holds no value this reader takes (value, value_float(s), "
                         f"value_int(s))")


def from_onnx(source: Any, *, dims: Mapping[str, int] | None = None,
              layers: bool = True, blocks: bool = True,
              sizes: Mapping[str, Any] | None = None,
              shapes: Mapping[str, Any] | None = None,
              **unknown: Any) -> tuple[Graph, dict, dict]:
    """An ONNX model as ``(graph, params, state)``.

    Args:
      source: a path to a ``.onnx`` file (its external data is read from its folder,
        and only from there), its bytes, or an ``onnx.ModelProto``.
      dims: sizes for the symbolic dims (``dim_param``) of the graph inputs, by name;
        dims left out stay symbolic. A node whose shape argument depends on a symbolic
        dim (a ``Reshape`` to a computed shape) needs it bound here. A name that is no
        symbolic dim of the inputs is an ``mg.GraphError`` naming the near ones.
      shapes: shapes for graph inputs, by the input's name in the file, each dim an
        int or a name (``{"x": ("batch", 3)}``): needed for an input the file gives no
        shape (unknown rank); for one it gives a shape, it must agree with it (the
        same rank, the same fixed sizes; a symbolic dim may be fixed or renamed).
      layers: read the recognisable patterns as mlaxgraph's layers (MatMul + Add of
        constant weights as ``Linear``, ``Conv``, ``LayerNorm``, ``BatchNorm``:
        ``mlaxgraph.onnx.patterns``); False keeps every node an ``onnx`` family op.
      blocks: group the nodes into nested blocks by the scopes of their names
        (``/layer1/layer1.0/conv1/Conv``: ``mlaxgraph.onnx.scopes``); False keeps the
        graph flat, each layer named by its whole path (``layer1.layer1.0.conv1``).
      sizes: static bounds for the operators whose output length depends on values
        (NonZero, Unique, NonMaxSuppression), as ``jnp.nonzero(x, size=n,
        fill_value=v)``: ``{key: n}`` or ``{key: (n, v)}``, the key a node's name, its
        first output's name or the operator type (every such node). Their outputs are
        cut or padded to ``n`` (padding: ``v``, default 0; Unique's ``indices`` -1 and
        ``counts`` 0). Without a bound, such a node on values the graph computes is an
        ``mg.ShapeError``; a key naming no such node is an ``mg.GraphError``.

    Returns:
      The typed graph, its weights (``params[layer]["value"]`` for each float
      initializer a node reads, ``params[layer]["kernel"]`` ... for the layers the
      patterns made) and its state (a ``BatchNorm``'s statistics). A ``BatchNorm``
      computes as ONNX's inference form with ``apply(..., inference_mode=True)``.
      ONNX sequences whose structure is known when the graph is built are read as
      their tensors (``mlaxgraph.onnx.sequences``): a graph output that is a sequence
      is one graph output per tensor, in order; an empty optional output is none.

    Raises:
      mg.SerializationError: the file is not a valid ONNX model or its data is
        damaged; mg.GraphError: an unsupported operator, a cycle, a missing value, a
        value two nodes write, an attribute the operator does not have;
        mg.ShapeError / mg.DTypeError: a node that cannot take its inputs, an input of
        unknown rank without ``shapes``, a graph output declared of another dtype
        than its nodes compute (another declared shape is a warning, as in
        onnxruntime).

    Example:
      >>> import mlaxgraph as mg
      >>> from onnx import TensorProto, helper
      >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
      >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
      >>> relu = helper.make_node("Relu", ["x"], ["y"], name="/act/Relu")
      >>> graph, params, state = mg.from_onnx(helper.make_model(
      ...     helper.make_graph([relu], "g", [x], [y])))
      >>> graph.output_specs
      (f32[batch,4],)
    """
    if unknown:
        raise ConfigError(unknown_keywords("from_onnx", unknown, FROM_ONNX_SIGNATURE,
                                           FROM_ONNX_HINTS))
    check_sizes_are_ints(dims)
    return read_model(source, dims=dims, layers=layers, blocks=blocks, sizes=sizes,
                      shapes=shapes)[:3]


def read_model(source: Any, *, dims: Mapping[str, int] | None = None, layers: bool = True,
               blocks: bool = True, sizes: Mapping[str, Any] | None = None,
               shapes: Mapping[str, Any] | None = None) -> tuple:
    """``from_onnx``'s ``(graph, params, state)`` and the layout of the ONNX outputs
    over the graph's (``sequences.regroup`` gathers a sequence output's tensors back)."""
    model, folder = load_model(source)
    try:
        reader = _Reader(model, folder, dims or {}, layers, sizes, shapes)
        graph, params, state = reader.read()
        if blocks:
            graph, params, state = nest(graph, reader.places, params, state, reader.modules)
        return graph, params, state, reader.layout
    except RecursionError:
        raise GraphError("the ONNX graph nests too deeply to be read") from None
    except MlaxGraphError:
        raise
    except (TypeError, UnicodeError, AttributeError, OverflowError) as e:
        # fields a damaged file fills with what the proto allows but no model holds
        raise SerializationError(f"the ONNX model is damaged: {type(e).__name__}: "
                                 f"{(str(e).splitlines() or [''])[0][:200]}") from None
