"""How ``to_onnx`` writes each of mlaxgraph's layers: one rule per op name,
``rule(writer, node, args, weights, stats, path) -> output names``, adding nodes and
initializers through the writer (``mlaxgraph.onnx.writer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import SerializationError
from ..ops.conv_transpose import transpose_crops
from .dtypes import to_code
from .layer import decode_array
from .writer_attention import attention
from .writer_norms import batch_norm, group_norm, layer_norm, rms_norm
from .writer_shapes import dim_value, length_range, shape_tensor

__all__ = ["RULES"]

def _accumulating(w: Any, node, names: list[str], path: str) -> tuple[list[str], Any]:
    """The operands cast to the layer's ``preferred_element_type`` (the dtype its dot or
    convolution accumulates and returns in, before the cast back to the input's), and
    that dtype (None when the layer has none or it is the input's)."""
    acc, dtype = node.op.preferred_element_type, w.input_specs[0].dtype
    if acc is None or np.dtype(acc) == np.dtype(dtype):
        return names, None
    return [w.node("Cast", [n], f"{path}/acc{i}", part=True, to=to_code(acc))[0]
            for i, n in enumerate(names)], acc


def _cast_back(w: Any, node, out: str, acc: Any, path: str) -> str:
    if acc is None:
        return out
    return w.node("Cast", [out], path + "/back", part=True, to=to_code(w.input_specs[0].dtype))[0]


def _linear(w: Any, node, args, weights, stats, path):
    kernel = w.weight("kernel", f"{path}.kernel", np.asarray(weights["kernel"]))
    operands, acc = _accumulating(w, node, [args[0], kernel], path)
    (out,) = w.node("MatMul", operands, path, part=True)
    if node.op.use_bias:
        (bias,), _ = _accumulating(w, node, [w.weight("bias", f"{path}.bias", np.asarray(weights["bias"]))],
                                   path + "/bias")
        (out,) = w.node("Add", [out, bias], path, part=True)
    return [_cast_back(w, node, out, acc, path)]


def _unary(op_type: str, **attrs: Any) -> Callable:
    return lambda w, node, args, weights, stats, path: w.node(op_type, args, path, **attrs)


def _binary(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op = node.op
        if getattr(op, "constant", None) is not None:
            # in the input's dtype (a comparison's output is bool)
            value = w.constant(f"{path}.constant", np.asarray(op.constant, w.input_specs[0].dtype))
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


def _reduce(op_type: str) -> Callable:
    def write(w, node, args, weights, stats, path):
        op, (x,) = node.op, args
        if op_type == "ReduceSum" and w.input_specs[0].dtype == np.dtype(bool):
            (x,) = w.node("Cast", [x], path, part=True, to=to_code(node.outputs[0].dtype))
        ins = [x]
        if op.axis is not None:
            rank = len(w.input_specs[0].shape)
            ins.append(w.constant(f"{path}.axes", np.asarray([a % rank for a in op.axis], np.int64)))
        return w.node(op_type, ins, path, part=x != args[0], keepdims=int(op.keepdims))
    return write


def _split(w, node, args, weights, stats, path):
    axis = node.op.axis % len(w.input_specs[0].shape)
    sizes = [int(spec.shape[axis]) for spec in node.outputs]
    return w.node("Split", [args[0], w.constant(f"{path}.split", np.asarray(sizes, np.int64))],
                  path, len(sizes), axis=axis)


def _pad(w, node, args, weights, stats, path):
    """Pad: each amount a constant, or a symbolic one that is a dim of the graph's
    inputs read from its shape; ``reflect`` and ``edge`` as ONNX's modes."""
    op = node.op
    amounts = [lo for lo, _ in op.pad_width] + [hi for _, hi in op.pad_width]
    if all(isinstance(a, (int, np.integer)) for a in amounts):
        pads = w.constant(f"{path}.pads", np.asarray(amounts, np.int64))
    else:
        parts = [dim_value(w, node, a, f"{path}/pad{i}", vector=True) for i, a in enumerate(amounts)]
        (pads,) = w.node("Concat", parts, path + "/pads", part=True, axis=0)
    ins = [args[0], pads]
    if op.mode == "constant":
        ins.append(w.constant(f"{path}.value", np.asarray(op.value, node.outputs[0].dtype)))
    return w.node("Pad", ins, path, mode=op.mode)


def _axis_op(op_type: str) -> Callable:
    return lambda w, node, args, weights, stats, path: w.node(op_type, args, path,
                                                              axis=node.op.axis)


def _gelu(w, node, args, weights, stats, path):
    if w.opset >= 20:
        return w.node("Gelu", args, path, approximate="tanh" if node.op.approximate else "none")
    raise SerializationError(f"layer {path!r} (op gelu) needs opset 20 or newer")


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
    ins = [_channels_first(w, node, args[0], path, n, last), w.weight("kernel", f"{path}.kernel", kernel)]
    if op.use_bias:
        ins.append(w.weight("bias", f"{path}.bias", np.asarray(weights["bias"])))
    ins, acc = _accumulating(w, node, ins, path)
    (out,) = w.node("Conv", ins, path, part=last or acc is not None, strides=_per_dim(op.strides, n),
                    dilations=_per_dim(op.dilation, n), group=op.groups, **_pads(op.padding, n))
    return _channels_back(w, _cast_back(w, node, out, acc, path), path, n, last)


def _conv_transpose(w, node, args, weights, stats, path):
    """ConvTranspose: the kernel ``(O, I, ...)`` as ONNX's ``(I, O, ...)``; the crops of
    each axis as ``pads``, a negative high crop (an extension) as ``output_padding``."""
    op = node.op.resolved(w.input_specs)
    n = len(node.outputs[0].shape) - 2
    last = op.channels_last
    kernel = np.asarray(weights["kernel"])
    kernel = np.transpose(kernel, (n + 1, 0, *range(1, n + 1)) if last else (1, 0, *range(2, n + 2)))
    strides, dilation = _per_dim(op.strides, n), _per_dim(op.dilation, n)
    padding = op.padding if not isinstance(op.padding, str) else (op.padding,) * n
    crops = [transpose_crops(k, s, p, d) for k, s, p, d in zip(kernel.shape[2:], strides, padding, dilation)]
    if any(lo < 0 or -hi >= max(s, d) for (lo, hi), s, d in zip(crops, strides, dilation)):
        raise SerializationError(f"layer {path!r} (op conv_transpose): the padding "
                                 f"{op.padding!r} extends the output beyond what ONNX's pads "
                                 f"and output_padding express")
    ins = [_channels_first(w, node, args[0], path, n, last), w.weight("kernel", f"{path}.kernel", kernel)]
    if op.use_bias:
        ins.append(w.weight("bias", f"{path}.bias", np.asarray(weights["bias"])))
    extra = [max(-hi, 0) for _, hi in crops]
    (out,) = w.node("ConvTranspose", ins, path, part=last, strides=strides, dilations=dilation,
                    kernel_shape=list(kernel.shape[2:]),
                    pads=[lo for lo, _ in crops] + [max(hi, 0) for _, hi in crops],
                    output_padding=extra if any(extra) else None)
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


def _embedding(w, node, args, weights, stats, path):
    # one initializer for the lookup and a tied head (embedding.attend(h): h @ table.T,
    # through a Transpose), as exporters write a tied table; read back as both
    table = w.weight("embedding", f"{path}.embedding", np.asarray(weights["embedding"]))
    if w.input_specs[0].is_float:
        dtype = w.input_specs[0].dtype
        if np.dtype(dtype) != np.asarray(weights["embedding"]).dtype:
            # the head computes in the policy's dtype, the table is stored as the lookup reads it
            (table,) = w.node("Cast", [table], path, part=True, to=to_code(dtype))
        (transposed,) = w.node("Transpose", [table], path, part=True, perm=[1, 0])
        return w.node("MatMul", [args[0], transposed], path, part=True)
    return w.node("Gather", [table, args[0]], path, axis=0)


def _causal_mask(w, node, args, weights, stats, path):
    shape = node.outputs[0].shape
    if not all(isinstance(d, int) for d in shape):
        raise SerializationError(f"layer {path!r} (op causal_mask): a symbolic length "
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


def _arange(w, node, args, weights, stats, path):
    (spec,) = node.outputs
    n = spec.shape[0]
    if isinstance(n, int):
        return [w.constant(path, np.arange(n, dtype=spec.dtype))]
    out = length_range(w, node, n, path)
    return w.node("Cast", [out], path, part=True, to=to_code(spec.dtype))


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
        raise SerializationError(f"layer {path!r} (op reshape): two symbolic dims that "
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


_END = np.iinfo(np.int64).max  # Slice's "to the end"


def _getitem(w, node, args, weights, stats, path):
    """``x[index]``: Slice over the sliced and indexed axes, Squeeze of the indexed
    ones, Unsqueeze of the new (None) ones."""
    rank = len(w.input_specs[0].shape)
    entries = list(node.op.index)
    full = (None, None, None)
    missing = rank - len([e for e in entries if e is not None and e != "..."])
    if "..." in entries:
        at = entries.index("...")
        entries[at:at + 1] = [full] * missing
    else:
        entries += [full] * missing
    sliced: list[tuple[int, int, int, int]] = []  # (start, end, axis, step)
    drop, new = [], []
    axis = out = 0
    for e in entries:
        if e is None:
            new.append(out)
            out += 1
            continue
        if isinstance(e, int):
            sliced.append((e, _END if e == -1 else e + 1, axis, 1))
            drop.append(axis)
        else:
            out += 1
            if e != full:
                start, stop, step = e
                sliced.append((start or 0, _END if stop is None else stop, axis, step or 1))
        axis += 1
    (x,) = args
    if sliced:
        bounds = [w.constant(f"{path}.{what}", np.asarray(v, np.int64))
                  for what, v in zip(("starts", "ends", "axes", "steps"), zip(*sliced))]
        (x,) = w.node("Slice", [x, *bounds], path, part=True)
    for op_type, which, values in (("Squeeze", "drop", drop), ("Unsqueeze", "new", new)):
        if values:
            (x,) = w.node(op_type, [x, w.constant(f"{path}.{which}", np.asarray(values, np.int64))],
                          path, part=True)
    return [x] if x != args[0] else w.node("Identity", [x], path)


def _broadcast_to(w, node, args, weights, stats, path):
    return w.node("Expand", [args[0], shape_tensor(w, node, node.outputs[0].shape, path)], path)


def write_bounded(w, op, inputs: list[str], attrs: dict, path: str) -> list[str]:
    """A NonZero, Unique or NonMaxSuppression read with a static bound
    (``from_onnx(sizes=...)``): the operator, then each output of data-dependent length
    padded by the bound and cut to it (Pad, Slice), the padding as ``ops_bounded``
    computes it."""
    size, fill = int(attrs.pop("size")), attrs.pop("fill_value")
    outs = w.node(op.onnx_type, inputs, path, op.outputs, part=True, **attrs)
    # (output, its rank, the axis of data-dependent length, the padding, its dtype)
    if op.onnx_type == "Unique":
        axis = attrs.get("axis")
        rank = 1 if axis is None else len(w.input_specs[0].shape)
        plan = [(0, rank, (axis or 0) % rank, fill, w.input_specs[0].dtype),
                (1, 1, 0, -1, np.int64), (3, 1, 0, 0, np.int64)]
    else:  # NonZero (rank, count); NonMaxSuppression (count, 3)
        plan = [(0, 2, 1 if op.onnx_type == "NonZero" else 0, fill, np.int64)]
    for i, rank, along, value, kind in plan:
        if i >= len(outs):
            continue
        pads = np.zeros(2 * rank, np.int64)
        pads[rank + along] = size
        where = f"{path}/bound{i}"
        (padded,) = w.node("Pad", [outs[i], w.constant(f"{where}.pads", pads),
                                   w.constant(f"{where}.fill", np.asarray(value, kind))],
                           where, part=True)
        bounds = [w.constant(f"{where}.{n}", np.asarray([v], np.int64))
                  for n, v in (("start", 0), ("end", size), ("axis", along))]
        (outs[i],) = w.node("Slice", [padded, *bounds], where, part=True)
    return outs


RULES: dict[str, Callable] = {
    "linear": _linear, "param": _param, "onnx.constant": _constant, "cast": _cast,
    "relu": _unary("Relu"), "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"),
    "gelu": _gelu, "silu": _silu, "identity": _unary("Identity"), "neg": _unary("Neg"),
    "softmax": _axis_op("Softmax"), "log_softmax": _axis_op("LogSoftmax"),
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"), "div": _binary("Div"),
    "maximum": _binary("Max"), "minimum": _binary("Min"), "matmul": _binary("MatMul"),
    "layer_norm": layer_norm, "flatten": _flatten, "concat": _axis_op("Concat"),
    "conv": _conv, "max_pool": _pool("MaxPool"), "avg_pool": _pool("AveragePool"),
    "batch_norm": batch_norm, "embedding": _embedding, "dropout": _unary("Identity"),
    "multi_head_attention": attention, "causal_mask": _causal_mask,
    "global_avg_pool": _global_pool("ReduceMean"), "global_max_pool": _global_pool("ReduceMax"),
    "rms_norm": rms_norm, "arange": _arange, "reshape": _reshape, "transpose": _transpose,
    "equal": _binary("Equal"), "not_equal": _not_equal, "less": _binary("Less"),
    "less_equal": _binary("LessOrEqual"), "greater": _binary("Greater"),
    "greater_equal": _binary("GreaterOrEqual"), "pow": _binary("Pow"),
    "where": _where, "expand_dims": _axes_input("Unsqueeze"),
    "squeeze": _axes_input("Squeeze"), "getitem": _getitem, "broadcast_to": _broadcast_to,
    "conv_transpose": _conv_transpose, "group_norm": group_norm, "sum": _reduce("ReduceSum"),
    "mean": _reduce("ReduceMean"), "max": _reduce("ReduceMax"), "split": _split, "pad": _pad,
}
