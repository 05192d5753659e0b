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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..core.errors import SerializationError
from ..core.specs import is_symbolic
from ..ir.graph import Graph
from .dtypes import to_code
from .layer import OnnxOp, decode_array
from .protos import require_onnx

__all__ = ["to_onnx", "DEFAULT_OPSET"]

DEFAULT_OPSET = 21


class _Writer:
    def __init__(self, opset: int):
        self.onnx = require_onnx()
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.names: set[str] = set()

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

    def node(self, op_type: str, inputs: list[str], path: str, outputs: int = 1,
             part: bool = False, **attrs: Any) -> list[str]:
        """One node named ``/path`` (``/path/Op`` when it is one ``part`` of a layer
        written as several nodes, the exporters' form, read back as one layer)."""
        outs = [self.fresh(f"{path}:{i}" if outputs > 1 else path) for i in range(outputs)]
        name = f"/{path}/{op_type}" if part else f"/{path}"
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, outs, name=name,
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
            path = prefix + node.name
            weights = params.get(node.layer, {}) if isinstance(params, Mapping) else {}
            stats = state.get(node.layer, {}) if isinstance(state, Mapping) else {}
            sub = node.op.subgraph()
            if sub is not None:
                outs = self.graph(sub, args, weights, stats, path + "/")
            else:
                outs = self.layer(node, args, weights, stats, path)
            for i, out in enumerate(outs):
                env[(node.name, i)] = out
        return [env[(v.node, v.index)] for v in graph.outputs]

    def layer(self, node: Any, args: list[str], weights: Mapping, stats: Mapping,
              path: str) -> list[str]:
        op = node.op
        if isinstance(op, OnnxOp):
            full, it = [], iter(args)
            statics = dict(op.static)
            for position, given in enumerate(op.present or (True,) * (len(args) + len(statics))):
                if not given:
                    full.append("")
                elif position in statics:
                    full.append(self.constant(f"{path}.in{position}", decode_array(statics[position])))
                else:
                    full.append(next(it))
            attrs = {k: _attr(v) for k, v in op.attributes}
            return self.node(op.onnx_type, full, path, op.outputs, **attrs)
        rule = _RULES.get(op.op_name)
        if rule is None:
            raise SerializationError(f"layer {node.name!r} (op {op.op_name}) has no ONNX form; "
                                     f"to_onnx writes: {', '.join(sorted(_RULES))} and the "
                                     f"onnx family")
        return rule(self, node, args, weights, stats, path)


def _attr(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        from onnx import numpy_helper

        return numpy_helper.from_array(decode_array(value))
    return list(value) if isinstance(value, tuple) else value


def _linear(w: _Writer, node, args, weights, stats, path):
    kernel = w.constant(f"{path}.kernel", np.asarray(weights["kernel"]))
    (out,) = w.node("MatMul", [args[0], kernel], path, part=True)
    if node.op.use_bias:
        bias = w.constant(f"{path}.bias", np.asarray(weights["bias"]))
        (out,) = w.node("Add", [out, bias], path, part=True)
    return [out]


def _unary(op_type: str, **attrs: Any) -> Callable:
    return lambda w, node, args, weights, stats, path: w.node(op_type, args, path, **attrs)


def _binary(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op = node.op
        if getattr(op, "constant", None) is not None:
            spec = node.outputs[0]
            value = w.constant(f"{path}.constant", np.asarray(op.constant, spec.dtype))
            args = [value, args[0]] if op.reverse else [args[0], value]
        return w.node(op_type, args, path)
    return write


def _param(w, node, args, weights, stats, path):
    value = np.asarray(weights["value"]).astype(node.outputs[0].dtype)
    return [w.constant(path, value)]


def _constant(w, node, args, weights, stats, path):
    return [w.constant(path, decode_array(node.op.value))]


def _cast(w, node, args, weights, stats, path):
    return w.node("Cast", args, path, to=to_code(node.outputs[0].dtype))


def _layer_norm(w, node, args, weights, stats, path):
    scale = w.constant(f"{path}.scale", np.asarray(weights["scale"]))
    bias = w.constant(f"{path}.bias", np.asarray(weights["bias"]))
    return w.node("LayerNormalization", [args[0], scale, bias], path, axis=node.op.axis,
                  epsilon=float(node.op.epsilon))


def _axis_op(op_type: str) -> Callable:
    return lambda w, node, args, weights, stats, path: w.node(op_type, args, path,
                                                              axis=node.op.axis)


def _gelu(w, node, args, weights, stats, path):
    if w.opset >= 20:
        return w.node("Gelu", args, path, approximate="tanh" if node.op.approximate else "none")
    raise SerializationError(f"layer {node.name!r} (op gelu) needs opset 20 or newer")


def _silu(w, node, args, weights, stats, path):
    (s,) = w.node("Sigmoid", args, path, part=True)
    return w.node("Mul", [args[0], s], path, part=True)


def _flatten(w, node, args, weights, stats, path):
    return w.node("Flatten", args, path, axis=1)


def _channels_first(w: _Writer, node, arg: str, path: str, spatial: int, last: bool) -> str:
    if not last:
        return arg
    (out,) = w.node("Transpose", [arg], path, part=True, perm=[0, spatial + 1, *range(1, spatial + 1)])
    return out


def _channels_back(w: _Writer, out: str, path: str, spatial: int, last: bool) -> list[str]:
    if not last:
        return [out]
    return w.node("Transpose", [out], path + "/out", part=True,
                  perm=[0, *range(2, spatial + 2), 1])


def _pads(padding: Any, spatial: int) -> dict:
    if padding == "SAME":
        return {"auto_pad": "SAME_UPPER"}
    if padding == "VALID":
        return {"pads": [0] * (2 * spatial)}
    return {"pads": [int(p[0]) for p in padding] + [int(p[1]) for p in padding]}


def _conv(w, node, args, weights, stats, path):
    op = node.op
    n = len(op.kernel_size)
    last = op.data_format.endswith("C")
    kernel = np.asarray(weights["kernel"])
    if last:  # O, spatial..., I -> O, I, spatial...
        kernel = np.transpose(kernel, (0, n + 1, *range(1, n + 1)))
    ins = [_channels_first(w, node, args[0], path, n, last), w.constant(f"{path}.kernel", kernel)]
    if op.use_bias:
        ins.append(w.constant(f"{path}.bias", np.asarray(weights["bias"])))
    (out,) = w.node("Conv", ins, path, part=last, strides=list(op.strides),
                    dilations=list(op.dilation), group=op.groups, **_pads(op.padding, n))
    return _channels_back(w, out, path, n, last)


def _pool(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op = node.op
        n = len(op.window)
        last = op.data_format.endswith("C")
        extra = {"count_include_pad": int(op.count_include_pad)} if op_type == "AveragePool" else {}
        (out,) = w.node(op_type, [_channels_first(w, node, args[0], path, n, last)], path,
                        part=last, kernel_shape=list(op.window), strides=list(op.strides),
                        **_pads(op.padding, n), **extra)
        return _channels_back(w, out, path, n, last)
    return write


def _batch_norm(w, node, args, weights, stats, path):
    # the inference form: x * a + b, per channel of the layer's axis
    op = node.op
    rank = len(node.outputs[0].shape)
    axis = op.axis % rank
    var, mean = np.asarray(stats["var"], np.float64), np.asarray(stats["mean"], np.float64)
    scale = np.asarray(weights["scale"], np.float64) if op.use_scale else 1.0
    bias = np.asarray(weights["bias"], np.float64) if op.use_bias else 0.0
    a = scale / np.sqrt(var + op.epsilon)
    b = bias - mean * a
    shape = [1] * rank
    shape[axis] = -1
    dtype = node.outputs[0].dtype
    a_name = w.constant(f"{path}.a", a.reshape(shape).astype(dtype))
    b_name = w.constant(f"{path}.b", b.reshape(shape).astype(dtype))
    (out,) = w.node("Mul", [args[0], a_name], path, part=True)
    return w.node("Add", [out, b_name], path, part=True)


def _embedding(w, node, args, weights, stats, path):
    table = w.constant(f"{path}.embedding", np.asarray(weights["embedding"]))
    return w.node("Gather", [table, args[0]], path, axis=0)


_RULES: dict[str, Callable] = {
    "linear": _linear, "param": _param, "onnx.constant": _constant, "cast": _cast,
    "relu": _unary("Relu"), "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"),
    "gelu": _gelu, "silu": _silu, "identity": _unary("Identity"), "neg": _unary("Neg"),
    "softmax": _axis_op("Softmax"), "log_softmax": _axis_op("LogSoftmax"),
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"), "div": _binary("Div"),
    "maximum": _binary("Max"), "minimum": _binary("Min"), "matmul": _binary("MatMul"),
    "layer_norm": _layer_norm, "flatten": _flatten, "concat": _axis_op("Concat"),
    "conv": _conv, "max_pool": _pool("MaxPool"), "avg_pool": _pool("AveragePool"),
    "batch_norm": _batch_norm, "embedding": _embedding, "dropout": _unary("Identity"),
}


def _value_info(onnx: Any, name: str, spec: Any) -> Any:
    shape = [str(d).replace(" ", "") if is_symbolic(d) else int(d) for d in spec.shape]
    return onnx.helper.make_tensor_value_info(name, to_code(spec.dtype), shape)


def to_onnx(graph: Graph, path: Any, params: Mapping | None = None, state: Mapping | None = None,
            *, opset: int = DEFAULT_OPSET) -> Any:
    """Writes ``graph`` with its weights as an ONNX model to ``path`` (None: only
    returned) and returns the ``onnx.ModelProto``."""
    writer = _Writer(opset)
    onnx = writer.onnx
    inputs = [writer.fresh(name) for name in graph.inputs]
    outputs = writer.graph(graph, inputs, params or {}, state or {}, "")
    out_names = []
    for i, out in enumerate(outputs):
        if out in inputs or out in out_names or any(t.name == out for t in writer.initializers):
            (out,) = writer.node("Identity", [out], f"output_{i}")
        out_names.append(out)
    body = onnx.helper.make_graph(
        writer.nodes, graph.name, [_value_info(onnx, n, s) for n, s in zip(inputs, graph.input_specs)],
        [_value_info(onnx, n, s) for n, s in zip(out_names, graph.output_specs)],
        initializer=writer.initializers)
    model = onnx.helper.make_model(body, producer_name="mlaxgraph",
                                   opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    if path is not None:
        data = model.SerializeToString()
        with open(os.fspath(path), "wb") as f:
            f.write(data)
    return model
