"""How ``to_onnx`` writes the normalizations (one rule each, as in ``writer_rules``):
LayerNorm and RMSNorm over an axis, GroupNorm decomposed, BatchNorm in its inference
form."""

from __future__ import annotations

import numpy as np

__all__ = ["layer_norm", "group_norm", "batch_norm", "rms_norm"]


def layer_norm(w, node, args, weights, stats, path):
    """LayerNormalization over the last axis; mlaxgraph's one ``axis`` elsewhere moved
    last and back (ONNX's ``axis=k`` normalizes over axes k to the last); a missing
    scale written as ones, a missing bias left out."""
    op, dtype = node.op, node.outputs[0].dtype
    rank = len(node.outputs[0].shape)
    axis = op.axis % rank
    features = node.outputs[0].shape[axis]
    scale = np.asarray(weights["scale"]) if op.use_scale else np.ones(features, dtype)
    ins = [args[0], w.constant(f"{path}.scale", scale)]
    if op.use_bias:
        ins.append(w.constant(f"{path}.bias", np.asarray(weights["bias"])))
    if axis == rank - 1:
        return w.node("LayerNormalization", ins, path, axis=-1, epsilon=float(op.epsilon))
    perm = [i for i in range(rank) if i != axis] + [axis]
    (ins[0],) = w.node("Transpose", [args[0]], path, part=True, perm=perm)
    (y,) = w.node("LayerNormalization", ins, path, part=True, axis=-1, epsilon=float(op.epsilon))
    return w.node("Transpose", [y], path + "/out", part=True, perm=[int(i) for i in np.argsort(perm)])


def group_norm(w, node, args, weights, stats, path):
    """GroupNorm of ``(batch, ..., channels)``: reshaped to ``(batch, -1, groups,
    channels / groups)``, normalized over axes 1 and 3, reshaped back, then scale and
    bias per channel."""
    op, dtype = node.op, node.outputs[0].dtype
    channels = int(node.outputs[0].shape[-1])
    target = np.asarray([0, -1, op.num_groups, channels // op.num_groups], np.int64)
    (x,) = w.node("Reshape", [args[0], w.constant(f"{path}.groups", target)], path, part=True)
    axes = w.constant(f"{path}.axes", np.asarray([1, 3], np.int64))
    (mean,) = w.node("ReduceMean", [x, axes], path + "/mean", part=True, keepdims=1)
    (centred,) = w.node("Sub", [x, mean], path, part=True)
    (square,) = w.node("Mul", [centred, centred], path, part=True)
    (var,) = w.node("ReduceMean", [square, axes], path + "/var", part=True, keepdims=1)
    eps = w.constant(f"{path}.epsilon", np.asarray(op.epsilon, dtype))
    (var,) = w.node("Add", [var, eps], path, part=True)
    (std,) = w.node("Sqrt", [var], path, part=True)
    (y,) = w.node("Div", [centred, std], path, part=True)
    (shape,) = w.node("Shape", [args[0]], path, part=True)
    (y,) = w.node("Reshape", [y, shape], path + "/back", part=True)
    (y,) = w.node("Mul", [y, w.constant(f"{path}.scale", np.asarray(weights["scale"]))],
                  path + "/scale", part=True)
    return w.node("Add", [y, w.constant(f"{path}.bias", np.asarray(weights["bias"]))],
                  path + "/bias", part=True)


def batch_norm(w, node, args, weights, stats, path):
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


def rms_norm(w, node, args, weights, stats, path):
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
