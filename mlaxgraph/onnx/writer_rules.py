"""How ``to_onnx`` writes each of mlaxgraph's layers: one rule per op name,
``rule(writer, node, args, weights, stats, path) -> output names``, adding nodes and
initializers through the writer (``mlaxgraph.onnx.writer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import SerializationError
from .dtypes import to_code
from .layer import decode_array

__all__ = ["RULES"]

def _linear(w: Any, node, args, weights, stats, path):
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


def _channels_first(w: Any, node, arg: str, path: str, spatial: int, last: bool) -> str:
    if not last:
        return arg
    (out,) = w.node("Transpose", [arg], path, part=True, perm=[0, spatial + 1, *range(1, spatial + 1)])
    return out


def _channels_back(w: Any, out: str, path: str, spatial: int, last: bool) -> list[str]:
    if not last:
        return [out]
    return w.node("Transpose", [out], path + "/out", part=True,
                  perm=[0, *range(2, spatial + 2), 1])


def _per_dim(value: Any, n: int) -> list[int]:
    return [int(value)] * n if isinstance(value, int) else [int(v) for v in value]


def _pads(padding: Any, spatial: int) -> dict:
    if padding == "SAME":
        return {"auto_pad": "SAME_UPPER"}
    if padding == "VALID":
        return {"pads": [0] * (2 * spatial)}
    return {"pads": [int(p[0]) for p in padding] + [int(p[1]) for p in padding]}


def _conv(w, node, args, weights, stats, path):
    op = node.op
    n = len(node.outputs[0].shape) - 2
    last = op.data_format.endswith("C")
    kernel = np.asarray(weights["kernel"])
    if last:  # O, spatial..., I -> O, I, spatial...
        kernel = np.transpose(kernel, (0, n + 1, *range(1, n + 1)))
    ins = [_channels_first(w, node, args[0], path, n, last), w.constant(f"{path}.kernel", kernel)]
    if op.use_bias:
        ins.append(w.constant(f"{path}.bias", np.asarray(weights["bias"])))
    (out,) = w.node("Conv", ins, path, part=last, strides=_per_dim(op.strides, n),
                    dilations=_per_dim(op.dilation, n), group=op.groups, **_pads(op.padding, n))
    return _channels_back(w, out, path, n, last)


def _pool(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op = node.op
        n = len(node.outputs[0].shape) - 2
        last = op.data_format.endswith("C")
        extra = {"count_include_pad": int(op.count_include_pad)} if op_type == "AveragePool" else {}
        (out,) = w.node(op_type, [_channels_first(w, node, args[0], path, n, last)], path,
                        part=last, kernel_shape=_per_dim(op.window, n), strides=_per_dim(op.strides, n),
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
    table = np.asarray(weights["embedding"])
    if w.input_specs[0].is_float:  # embedding.attend(h): h @ table.T, the tied head
        return w.node("MatMul", [args[0], w.constant(f"{path}.embedding_t", table.T)], path)
    return w.node("Gather", [w.constant(f"{path}.embedding", table), args[0]], path, axis=0)


def _attention(w, node, args, weights, stats, path):
    """``MultiHeadAttention`` as MatMul, Reshape, Transpose, Where and Softmax nodes."""
    op = node.op
    if op.rope is not None or op.kv_heads != op.num_heads:
        raise SerializationError(f"layer {node.name!r} (op {op.op_name}): rotary embeddings "
                                 f"and grouped key/value heads have no ONNX form here")
    dtype = node.outputs[0].dtype
    heads = op.num_heads

    def project(x: str, which: str, perm: list[int]) -> str:
        kernel = np.asarray(weights[which]["kernel"])
        d, h, k = kernel.shape
        (y,) = w.node("MatMul", [x, w.constant(f"{path}.{which}.kernel", kernel.reshape(d, h * k))],
                      f"{path}/{which}", part=True)
        if op.use_bias:
            bias = np.asarray(weights[which]["bias"]).reshape(h * k)
            (y,) = w.node("Add", [y, w.constant(f"{path}.{which}.bias", bias)], f"{path}/{which}",
                          part=True)
        shape = w.constant(f"{path}.{which}.shape", np.asarray([0, 0, h, k], np.int64))
        (y,) = w.node("Reshape", [y, shape], f"{path}/{which}", part=True)
        return w.node("Transpose", [y], f"{path}/{which}", part=True, perm=perm)[0]

    head_dim = np.asarray(weights["query"]["kernel"]).shape[-1]
    q = project(args[0], "query", [0, 2, 1, 3])
    q = w.node("Mul", [q, w.constant(f"{path}.scale", np.asarray(1 / np.sqrt(head_dim), dtype))],
               f"{path}/query", part=True)[0]
    k = project(args[1], "key", [0, 2, 3, 1])
    v = project(args[1], "value", [0, 2, 1, 3])
    (scores,) = w.node("MatMul", [q, k], f"{path}/scores", part=True)
    mask = None
    if len(args) > 2:
        mask = args[2]
        if len(w.input_specs[2].shape) == 3:
            axes = w.constant(f"{path}.mask_axes", np.asarray([1], np.int64))
            (mask,) = w.node("Unsqueeze", [mask, axes], f"{path}/mask", part=True)
    if op.causal:
        q_len, kv_len = w.input_specs[0].shape[1], w.input_specs[1].shape[1]
        rows = _positions(w, node, q_len, f"{path}/causal_rows", [1])
        cols = _positions(w, node, kv_len, f"{path}/causal_cols", [0])
        (causal,) = w.node("GreaterOrEqual", [rows, cols], f"{path}/causal", part=True)
        mask = causal if mask is None else w.node("And", [mask, causal], f"{path}/mask",
                                                  part=True)[0]
    if mask is not None:
        low = w.constant(f"{path}.low", np.asarray(np.finfo(dtype).min, dtype))
        (scores,) = w.node("Where", [mask, scores, low], f"{path}/scores", part=True)
    (probs,) = w.node("Softmax", [scores], f"{path}/scores", part=True, axis=-1)
    (y,) = w.node("MatMul", [probs, v], f"{path}/attend", part=True)
    (y,) = w.node("Transpose", [y], f"{path}/attend", part=True, perm=[0, 2, 1, 3])
    flat = w.constant(f"{path}.attend.shape", np.asarray([0, 0, heads * head_dim], np.int64))
    (y,) = w.node("Reshape", [y, flat], f"{path}/attend", part=True)
    out_kernel = np.asarray(weights["out"]["kernel"])
    (y,) = w.node("MatMul", [y, w.constant(f"{path}.out.kernel",
                                           out_kernel.reshape(heads * head_dim, -1))],
                  f"{path}/out", part=True)
    if op.use_bias:
        (y,) = w.node("Add", [y, w.constant(f"{path}.out.bias", np.asarray(weights["out"]["bias"]))],
                      f"{path}/out", part=True)
    return [y]


def _causal_mask(w, node, args, weights, stats, path):
    shape = node.outputs[0].shape
    if not all(isinstance(d, int) for d in shape):
        raise SerializationError(f"layer {node.name!r} (op causal_mask): a symbolic length "
                                 f"has no ONNX form here")
    return w.node("Identity", [w.constant(f"{path}.value", np.tril(np.ones(shape, bool)))], path)


def _global_pool(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op = node.op
        rank = len(w.input_specs[0].shape)
        axes = list(range(1, rank - 1)) if op.data_format.endswith("C") else list(range(2, rank))
        return w.node(op_type, [args[0], w.constant(f"{path}.axes", np.asarray(axes, np.int64))],
                      path, keepdims=int(op.keepdims))
    return write


def _rms_norm(w, node, args, weights, stats, path):
    dtype = node.outputs[0].dtype
    (sq,) = w.node("Mul", [args[0], args[0]], path, part=True)
    axes = w.constant(f"{path}.axes", np.asarray([-1], np.int64))
    (ms,) = w.node("ReduceMean", [sq, axes], path, part=True, keepdims=1)
    eps = w.constant(f"{path}.epsilon", np.asarray(node.op.epsilon, dtype))
    (ms,) = w.node("Add", [ms, eps], path, part=True)
    (rms,) = w.node("Sqrt", [ms], path, part=True)
    (y,) = w.node("Div", [args[0], rms], path, part=True)
    scale = w.constant(f"{path}.scale", np.asarray(weights["scale"]))
    return w.node("Mul", [y, scale], path + "/scale", part=True)


def _positions(w, node, n, path, axes) -> str:
    """``0 .. n-1`` (int64), with ``axes`` inserted, as a constant or, for a symbolic
    ``n``, computed from the shape of the graph input holding it."""
    if isinstance(n, int):
        return w.constant(path, np.expand_dims(np.arange(n, dtype=np.int64), axes))
    (out,) = _range(w, node, n, path)
    axes_name = w.constant(f"{path}.axes", np.asarray(axes, np.int64))
    return w.node("Unsqueeze", [out, axes_name], path, part=True)[0]


def _arange(w, node, args, weights, stats, path):
    (spec,) = node.outputs
    n = spec.shape[0]
    if isinstance(n, int):
        return [w.constant(path, np.arange(n, dtype=spec.dtype))]
    (out,) = _range(w, node, n, path)
    return w.node("Cast", [out], path, part=True, to=to_code(spec.dtype))


def _range(w, node, n, path) -> list[str]:
    if str(n) not in w.dims:
        raise SerializationError(f"layer {node.name!r} (op {node.op.op_name}): the length "
                                 f"{n} is no dim of the graph's inputs")
    source, axis = w.dims[str(n)]
    (shape,) = w.node("Shape", [source], path, part=True)
    index = w.constant(f"{path}.axis", np.asarray(axis, np.int64))
    (limit,) = w.node("Gather", [shape, index], path, part=True, axis=0)
    start = w.constant(f"{path}.start", np.asarray(0, np.int64))
    step = w.constant(f"{path}.step", np.asarray(1, np.int64))
    return w.node("Range", [start, limit, step], path, part=True)


def _where(w, node, args, weights, stats, path):
    op, dtype = node.op, node.outputs[0].dtype
    args = list(args)
    if op.x_constant is not None:
        args.insert(1, w.constant(f"{path}.x", np.asarray(op.x_constant, dtype)))
    if op.y_constant is not None:
        args.append(w.constant(f"{path}.y", np.asarray(op.y_constant, dtype)))
    return w.node("Where", args, path)


def _reshape(w, node, args, weights, stats, path):
    (spec,), source = node.outputs, w.input_specs[0].shape
    target = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, int):
            target.append(d)
        elif i < len(source) and source[i] == d:
            target.append(0)  # ONNX's "copy this dim of the input"
        else:
            target.append(-1)
    if target.count(-1) > 1:
        raise SerializationError(f"layer {node.name!r} (op reshape): two symbolic dims that "
                                 f"are not the input's have no ONNX form here")
    shape = w.constant(f"{path}.shape", np.asarray(target, np.int64))
    return w.node("Reshape", [args[0], shape], path)


def _transpose(w, node, args, weights, stats, path):
    return w.node("Transpose", args, path, perm=list(node.op.perm))


def _not_equal(w, node, args, weights, stats, path):
    (eq,) = _binary("Equal")(w, node, args, weights, stats, path + "/Equal")
    return w.node("Not", [eq], path)


def _axes_input(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        axes = node.op.axis if hasattr(node.op, "axis") else node.op.axes
        axes = [axes] if isinstance(axes, int) else list(axes)
        return w.node(op_type, [args[0], w.constant(f"{path}.axes", np.asarray(axes, np.int64))],
                      path)
    return write


RULES: dict[str, Callable] = {
    "linear": _linear, "param": _param, "onnx.constant": _constant, "cast": _cast,
    "relu": _unary("Relu"), "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"),
    "gelu": _gelu, "silu": _silu, "identity": _unary("Identity"), "neg": _unary("Neg"),
    "softmax": _axis_op("Softmax"), "log_softmax": _axis_op("LogSoftmax"),
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"), "div": _binary("Div"),
    "maximum": _binary("Max"), "minimum": _binary("Min"), "matmul": _binary("MatMul"),
    "layer_norm": _layer_norm, "flatten": _flatten, "concat": _axis_op("Concat"),
    "conv": _conv, "max_pool": _pool("MaxPool"), "avg_pool": _pool("AveragePool"),
    "batch_norm": _batch_norm, "embedding": _embedding, "dropout": _unary("Identity"),
    "multi_head_attention": _attention, "causal_mask": _causal_mask,
    "global_avg_pool": _global_pool("ReduceMean"), "global_max_pool": _global_pool("ReduceMax"),
    "rms_norm": _rms_norm, "arange": _arange, "reshape": _reshape, "transpose": _transpose,
    "equal": _binary("Equal"), "not_equal": _not_equal, "less": _binary("Less"),
    "less_equal": _binary("LessOrEqual"), "greater": _binary("Greater"),
    "greater_equal": _binary("GreaterOrEqual"), "pow": _binary("Pow"),
    "where": _where, "expand_dims": _axes_input("Unsqueeze"),
    "squeeze": _axes_input("Squeeze"),
}
