"""``graph.to_onnx``: a graph written as an ONNX model with its weights.

Layers of the ``onnx`` family are written back as the operator they hold (static
inputs as initializers); weights (``param`` layers and the weights of mlaxgraph's
own layers) as initializers; a ``Linear`` as MatMul + Add, a cast as Cast; symbolic
dims as ``dim_param``. Nested blocks are written inline, their nodes named by their
path (``block/layer``), the form exporters use, so reading the file back keeps the
names. A layer with no ONNX form is an ``mg.SerializationError`` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..compiler.flatten import flatten
from ..compiler.program import get_in, set_in
from ..compiler.weights import check_weights
from ..core.errors import ConfigError, GraphError, SerializationError
from ..core.signatures import unknown_keywords
from ..core.specs import flatten_specs, is_symbolic
from ..ir.graph import Graph
from ..ops.activation import activation_layer
from .dtypes import to_code
from .layer import DOMAINS, OnnxOp, decode_array
from .ops_bounded import BOUNDED
from .protos import require_onnx
from .versions import MIN_OPSET
from .writer_rules import RULES, write_bounded
from .writer_types import narrow_outputs, widen_inputs
from .writer_versions import differs, write_converted

__all__ = ["to_onnx", "DEFAULT_OPSET", "MIN_WRITE_OPSET"]

DEFAULT_OPSET = 21
#: The oldest operator set mlaxgraph's own layers are written in: the forms their
#: rules write (a reduction's axes as an input, as ``ReduceMean`` takes them from opset
#: 18) are those of 18 on. A graph of ``onnx`` family layers alone (a file read) is
#: written from the oldest set read (``MIN_OPSET``); the newest is the newest the
#: installed ``onnx`` knows.
MIN_WRITE_OPSET = 18
#: The layers written in the same form at every opset.
_ANY_OPSET = ("input", "param", "onnx.constant")


def _oldest(graph: Graph) -> int:
    """The oldest opset ``graph``'s layers can be written in."""
    for node in graph.nodes:
        sub = node.op.subgraph()
        if sub is not None:
            if _oldest(sub) > MIN_OPSET:
                return MIN_WRITE_OPSET
        elif not isinstance(node.op, OnnxOp) and node.op.op_name not in _ANY_OPSET:
            return MIN_WRITE_OPSET
    return MIN_OPSET


def _check_opset(graph: Graph, opset: Any) -> int:
    newest, oldest = require_onnx().defs.onnx_opset_version(), _oldest(graph)
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise ConfigError(f"to_onnx(opset={opset!r}): the opset is an int from "
                          f"{oldest} to {newest}, got a {type(opset).__name__}")
    if not oldest <= opset <= newest:
        why = ("" if oldest == MIN_OPSET else
               f"; mlaxgraph's own layers are written in the forms of {MIN_WRITE_OPSET} on")
        raise ConfigError(f"to_onnx(opset={opset}): graph {graph.name!r} is written in ONNX "
                          f"operator sets {oldest} to {newest} (the newest the installed "
                          f"onnx knows){why}; the default is {DEFAULT_OPSET}")
    return int(opset)


class _Writer:
    def __init__(self, opset: int):
        self.onnx = require_onnx()
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.names: set[str] = set()
        self.input_specs: list = []
        #: symbolic dim name -> (graph input, axis) holding it, for sizes written as Shape
        self.dims: dict[str, tuple[str, int]] = {}
        #: the operator domains other than ONNX's the nodes written use
        self.domains: set[str] = set()
        #: the path of the layer whose weights the layer being written reads (a shared
        #: layer's later calls name the first), and the initializers written per weight
        self.owner = ""
        self.shared: dict[str, str] = {}

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def constant(self, base: str, array: Any) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, key: str, base: str, array: Any) -> str:
        """The initializer of the owner layer's weight ``key``, written once for all
        the calls of a shared layer (a tied embedding table)."""
        full = f"{self.owner}/{key}"
        if full not in self.shared:
            self.shared[full] = self.constant(base, array)
        return self.shared[full]

    def node(self, op_type: str, inputs: list[str], path: str, outputs: int = 1,
             part: bool = False, **attrs: Any) -> list[str]:
        """One node named ``/path/Op``, the exporters' form (``from_onnx`` reads the
        path back as the layer's name and scope; ``part`` marks one node of several
        a layer is written as)."""
        outs = [self.fresh(f"{path}:{i}" if outputs > 1 else path) for i in range(outputs)]
        name = f"/{path}/{op_type}"
        domain = DOMAINS.get(op_type, "")
        if domain:
            self.domains.add(domain)
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, outs, name=name,
                                                     domain=domain or None,
                                                     **{k: v for k, v in attrs.items()
                                                        if v is not None}))
        return outs

    def graph(self, graph: Graph, inputs: list[str], params: Mapping, state: Mapping,
              prefix: str) -> list[str]:
        env: dict[tuple[str, int], str] = {}
        for name, value in zip(graph.inputs, inputs):
            env[(name, 0)] = value
        for node in graph.nodes:
            if node.name in graph.inputs:
                continue
            args = [env[(v.node, v.index)] for v in node.inputs]
            self.input_specs = [graph.spec(v) for v in node.inputs]
            path = prefix + node.name
            weights = params.get(node.layer, {}) if isinstance(params, Mapping) else {}
            stats = state.get(node.layer, {}) if isinstance(state, Mapping) else {}
            sub = node.op.subgraph()
            self.owner = prefix + node.layer
            if sub is not None:
                outer = self.dims  # the block's own dims name its inputs' sizes inside it
                self.dims = {**outer, **input_dims(args, sub.input_specs)}
                outs = self.graph(sub, args, weights, stats, path + "/")
                self.dims = outer
            else:
                outs = self.layer(node, args, weights, stats, path)
            for i, out in enumerate(outs):
                env[(node.name, i)] = out
        return [env[(v.node, v.index)] for v in graph.outputs]

    def layer(self, node: Any, args: list[str], weights: Mapping, stats: Mapping,
              path: str) -> list[str]:
        op = node.op
        if isinstance(op, OnnxOp):
            inner = dict(op.attributes)
            if inner.get("__outer__") or "__body__" in inner:
                # Its body reads values around it by the names of the file it came from
                # (or is a body the reader made): the node would not be valid ONNX.
                raise SerializationError(
                    f"layer {path!r} (op {op.op_name}) has a body that reads values of "
                    f"the graph around it ({', '.join(inner.get('__outer__', ())) or 'a gradient'}); "
                    f"to_onnx cannot write such a body")
            full, specs, it = [], [], iter(zip(args, self.input_specs))
            statics = dict(op.static)
            for position, given in enumerate(op.present or (True,) * (len(args) + len(statics))):
                name, spec = "", None
                if given and position in statics:
                    name = self.constant(f"{path}.in{position}", decode_array(statics[position]))
                elif given:
                    name, spec = next(it)
                full.append(name)
                specs.append(spec)
            widened = widen_inputs(self, op.onnx_type, full,
                                   [None if s is None else s.dtype for s in specs], path)
            specs = [None if s is None else (s.shape, s.dtype if a == b else np.dtype(np.int64))
                     for a, b, s in zip(full, widened, specs)]  # (shape, dtype) as written
            full = widened
            attrs = {k: _attr(v) for k, v in op.attributes}
            if op.onnx_type in BOUNDED and "size" in attrs:
                outs = write_bounded(self, op, full, attrs, path)
            elif differs(self.onnx, op, self.opset):
                outs = write_converted(self, op, full, specs, attrs, node.outputs, path)
            else:
                outs = self.node(op.onnx_type, full, path, op.outputs, **attrs)
            return narrow_outputs(self, op.onnx_type, outs, node.outputs, path)
        rule = RULES.get(op.op_name)
        if rule is None and (op.op_name.startswith("quantized_")
                             or op.op_name in ("quantize", "dequantize")):
            raise SerializationError(
                f"layer {path!r} (op {op.op_name}) is a quantized layer, which to_onnx does "
                f"not write (docs/quantization.md, Files): write the float graph with its "
                f"float params, and quantize in the runtime that reads the file")
        if rule is None:
            raise SerializationError(f"layer {path!r} (op {op.op_name}) has no ONNX form; "
                                     f"to_onnx writes: {', '.join(sorted(RULES))} and the "
                                     f"onnx family")
        outs = rule(self, node, args, weights, stats, path)
        if getattr(op, "activation", None) is not None:  # Linear's and Conv's activation=
            act = activation_layer(op.activation)
            outs = RULES[act.op_name](self, SimpleNamespace(op=act, outputs=node.outputs), outs, {}, {},
                                      path + "/act")
        return outs


def input_dims(names: list[str], specs: Any) -> dict[str, tuple[str, int]]:
    """Each symbolic dim of the inputs -> (the input, the axis) first holding it."""
    dims: dict[str, tuple[str, int]] = {}
    for name, spec in zip(names, specs):
        for axis, d in enumerate(spec.shape):
            if is_symbolic(d):
                dims.setdefault(str(d), (name, axis))
    return dims


def _attr(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        from onnx import numpy_helper

        return numpy_helper.from_array(decode_array(value))
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "graph":
        from onnx import GraphProto  # a body (If, Loop, Scan), as it was read

        body = GraphProto()
        body.ParseFromString(bytes.fromhex(value[1]))
        return body
    return list(value) if isinstance(value, tuple) else value


def _checked_weights(graph: Graph, params: Any, state: Any) -> tuple[Any, Any]:
    """``params`` and ``state`` checked as ``apply`` checks them (a missing weight, one
    of another shape: the error naming the layer and the weight), each float weight
    whose dtype the layer leaves to the policy in the dtype the layer computes in, as
    ``apply`` casts it (float64 or bfloat16 weights of a float32 graph are float32 in
    the file, whose operators take one dtype)."""
    program = flatten(graph)
    if params is None and any(step.param_specs for step in program.owners()):
        raise GraphError(f"to_onnx writes graph {graph.name!r}'s weights into the file: pass "
                         f"them, graph.to_onnx(path, params, state), as init or a loader gives "
                         f"them")
    params, state = params or {}, state or {}
    check_weights(program, params, state)
    trees = {"params": params, "state": state}
    for step in program.owners():
        dtype = np.dtype(step.output_specs[0].dtype)
        for which, specs in (("params", step.param_specs), ("state", step.state_specs)):
            for path, spec in flatten_specs(specs):
                keys = step.weights + tuple(path.split("/"))
                leaf = get_in(trees[which], keys)
                if spec.dtype is None and np.dtype(leaf.dtype) != dtype and \
                        jnp.issubdtype(dtype, jnp.floating):
                    trees[which] = set_in(trees[which], keys, np.asarray(leaf).astype(dtype))
    return trees["params"], trees["state"]


def _value_info(onnx: Any, name: str, spec: Any) -> Any:
    shape = [str(d).replace(" ", "") if is_symbolic(d) else int(d) for d in spec.shape]
    return onnx.helper.make_tensor_value_info(name, to_code(spec.dtype), shape)


#: ``torch.onnx.export``'s spellings of what ``to_onnx`` does another way.
_TORCH_EXPORT_NAMES = {
    "opset_version": "torch.onnx.export's opset_version is opset=",
    "dynamic_axes": "the graph's symbolic dims are written as dim_param: they are dynamic already",
    "input_names": "the inputs are named after the graph's Inputs (mg.Input(..., name=))",
    "output_names": "the outputs are named after the layers that make them (name= of the layer)",
    "export_params": "the weights are written when params (and state) are given",
}


def to_onnx(graph: Graph, path: Any, params: Mapping | None = None, state: Mapping | None = None,
            *, opset: int = DEFAULT_OPSET, **unknown: Any) -> Any:
    """Writes ``graph`` with its weights as an ONNX model to ``path`` (None: only
    returned) and returns the ``onnx.ModelProto``: symbolic dims as ``dim_param``, a
    ``Linear`` as MatMul + Add, casts as Cast, each node named ``/layer path/Op``
    (docs/onnx.md lists every layer's form). Needs ``pip install mlaxgraph[onnx]``.

    Raises:
      mg.SerializationError: a layer with no ONNX form, named.
      mg.ConfigError: an ``opset`` outside the operator sets written: 18 to the newest
        the installed ``onnx`` knows (6 on for a graph of ``onnx`` family layers
        alone, as ``from_onnx`` reads them).
      mg.GraphError / mg.ShapeError / mg.DTypeError: ``params`` or ``state`` lacks a
        weight of a layer, or holds one of another shape or dtype than the layer
        takes (``apply``'s check), naming the layer and the weight; nothing is
        written then.

    Example:
      >>> import jax
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 4), name="x")
      >>> graph = mg.Graph(x, ops.relu(ops.Linear(2, name="fc")(x)))
      >>> params, state = mg.compile(graph).init(jax.random.key(0))
      >>> proto = graph.to_onnx(None, params, state)
      >>> [node.name for node in proto.graph.node]
      ['/fc/MatMul', '/fc/Add', '/relu/Relu']
    """
    if unknown:
        raise ConfigError(unknown_keywords("to_onnx", unknown,
                                           "to_onnx(path, params=None, state=None, opset=21)",
                                           _TORCH_EXPORT_NAMES))
    writer = _Writer(_check_opset(graph, opset))
    onnx = writer.onnx
    inputs = [writer.fresh(name) for name in graph.inputs]
    writer.dims = input_dims(inputs, graph.input_specs)
    params, state = _checked_weights(graph, params, state)
    outputs = writer.graph(graph, inputs, params, state, "")
    out_names = []
    for i, out in enumerate(outputs):
        if out in inputs or out in out_names or any(t.name == out for t in writer.initializers):
            (out,) = writer.node("Identity", [out], f"output_{i}")
        out_names.append(out)
    body = onnx.helper.make_graph(
        writer.nodes, graph.name, [_value_info(onnx, n, s) for n, s in zip(inputs, graph.input_specs)],
        [_value_info(onnx, n, s) for n, s in zip(out_names, graph.output_specs)],
        initializer=writer.initializers)
    domains = [onnx.helper.make_opsetid(d, onnx.defs.onnx_opset_version() if d == "" else
                                        max(onnx.defs.get_schema(n.op_type, domain=d).since_version
                                            for n in writer.nodes if n.domain == d))
               for d in sorted(writer.domains)]
    model = onnx.helper.make_model(body, producer_name="mlaxgraph",
                                   opset_imports=[onnx.helper.make_opsetid("", opset)] + domains)
    model.ir_version = min(model.ir_version, 10)
    if path is not None:
        data = model.SerializeToString()
        try:
            with open(os.fspath(path), "wb") as f:
                f.write(data)
        except OSError as e:  # a missing folder, a folder given as the file, no permission
            raise SerializationError(f"to_onnx cannot write {os.fspath(path)!r}: {e.strerror}"
                                     + (" (its folder does not exist)" if isinstance(
                                         e, FileNotFoundError) else "")) from None
    return model
