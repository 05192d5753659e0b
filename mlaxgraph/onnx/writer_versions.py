"""An operator read at one ONNX operator set, written at another.

A layer of the ``onnx`` family computes as the opset of the file it was read from says
(``Softmax(axis=1)`` of opset 11 normalizes over every axis from 1 on; of opset 13 over
axis 1 alone; ``Squeeze``'s axes are an attribute before 13 and an input after). When
``to_onnx`` writes at another opset and the operator's definition differs between the
two, the node is converted by ONNX's own version converter (``onnx.version_converter``,
on a model holding that node alone), so the file computes what the layer computes. A
node the converter cannot carry across is an ``mg.SerializationError`` naming the
layer and the opset it can be written at. ``Softmax``, ``LogSoftmax`` and ``Hardmax``
across opset 13, and ``Upsample`` and opset 10's ``Resize`` written as a later
``Resize``, are converted here: the converter's forms of them compute otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import SerializationError
from ..core.specs import is_symbolic
from .dtypes import to_code
from .layer import DOMAINS, OnnxOp

__all__ = ["differs", "write_converted"]


def _definition(onnx: Any, op_type: str, opset: int) -> tuple | None:
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # noqa: BLE001  (not defined at that opset)
        return None
    return schema.since_version, schema.deprecated


def _has_body(op: OnnxOp) -> bool:
    return any(isinstance(v, tuple) and len(v) == 2 and v[0] == "graph" for _, v in op.attributes)


def differs(onnx: Any, op: OnnxOp, opset: int) -> bool:
    """Whether ``op``, read at ``op.opset``, is defined otherwise at ``opset`` (a body's
    nodes, read at the same opset, may be: a node with a body counts as differing)."""
    if op.opset == opset or DOMAINS.get(op.onnx_type):
        return False
    return _has_body(op) or _definition(onnx, op.onnx_type, op.opset) != \
        _definition(onnx, op.onnx_type, opset)


def _info(onnx: Any, name: str, shape: Any, dtype: Any) -> Any:
    dims = [str(d).replace(" ", "") if is_symbolic(d) else int(d) for d in shape]
    return onnx.helper.make_tensor_value_info(name, to_code(np.dtype(dtype)), dims)


#: Normalize over the axes from ``axis`` on (the input coerced to 2-d) before opset 13,
#: over ``axis`` alone from 13 (ONNX's converter leaves Hardmax's node as it was).
_SOFTMAX_FAMILY = ("Softmax", "LogSoftmax", "Hardmax")


def _softmax_family(w: Any, op: OnnxOp, inputs: list[str], rank: int, attrs: dict,
                    path: str) -> list[str]:
    before = op.opset < 13
    axis = int(attrs.get("axis", 1 if before else -1)) % rank
    if axis == rank - 1:  # the last axis: the same at every opset
        return w.node(op.onnx_type, inputs[:1], path, axis=axis)
    if before:  # coerced to 2-d: flattened from the axis on, normalized, shaped back
        (shape,) = w.node("Shape", inputs[:1], f"{path}/shape", part=True)
        (flat,) = w.node("Flatten", inputs[:1], f"{path}/flatten", part=True, axis=axis)
        (out,) = w.node(op.onnx_type, [flat], f"{path}/normalized", part=True, axis=1)
        return w.node("Reshape", [out, shape], path)
    perm = [i for i in range(rank) if i != axis] + [axis]  # the axis moved last and back
    (moved,) = w.node("Transpose", inputs[:1], f"{path}/to_last", part=True, perm=perm)
    (out,) = w.node(op.onnx_type, [moved], f"{path}/normalized", part=True, axis=rank - 1)
    return w.node("Transpose", [out], path, perm=[perm.index(i) for i in range(rank)])


def _as_resize(w: Any, op: OnnxOp, inputs: list[str], attrs: dict, path: str) -> list[str]:
    """``Upsample``, or ``Resize`` of opset 10 (both asymmetric coordinates, nearest
    values as onnxruntime's "simple" mode picks them), as ``Resize`` of ``w.opset``
    (ONNX's converter leaves the coordinates to opset 11's default, half_pixel)."""
    from onnx import numpy_helper

    if "scales" in attrs:
        scales = np.asarray(attrs["scales"], np.float32)
    else:
        known = {t.name: t for t in w.initializers}
        if len(inputs) < 2 or inputs[1] not in known:
            raise SerializationError(f"layer {path!r} (op {op.op_name}): its scales are computed "
                                     f"when the model runs; write it at to_onnx(..., "
                                     f"opset={op.opset})")
        scales = numpy_helper.to_array(known[inputs[1]]).astype(np.float32)
    mode = {"bilinear": "linear"}.get(attrs.get("mode", "nearest"), attrs.get("mode", "nearest"))
    if w.opset < 11:
        return w.node("Resize", [inputs[0], w.constant(f"{path}.scales", scales)], path, mode=mode)
    shrink, grow = bool((scales < 1).any()), bool((scales > 1).any())
    if mode == "nearest" and shrink and grow:
        raise SerializationError(f"layer {path!r} (op {op.op_name}) enlarges some axes and shrinks "
                                 f"others, whose nearest values no Resize of opset 11 on picks "
                                 f"alike; write it at to_onnx(..., opset={op.opset})")
    nearest = {"nearest_mode": "ceil" if shrink else "floor"} if mode == "nearest" else {}
    roi = w.constant(f"{path}.roi", np.zeros((0,), np.float32))
    return w.node("Resize", [inputs[0], roi, w.constant(f"{path}.scales", scales)], path,
                  mode=mode, coordinate_transformation_mode="asymmetric", **nearest)


def write_converted(w: Any, op: OnnxOp, inputs: list[str], specs: list[Any], attrs: dict,
                    out_specs: Any, path: str) -> list[str]:
    """The nodes of ``op`` at ``w.opset``: the node as read (``inputs``, their ``specs``
    as ``(shape, dtype)``, None for an absent input or a constant the writer holds), converted from
    ``op.opset``; returns its outputs' names."""
    onnx = w.onnx
    if op.onnx_type in _SOFTMAX_FAMILY and (op.opset < 13) != (w.opset < 13):
        return _softmax_family(w, op, inputs, len(specs[0][0]), attrs, path)
    if w.opset >= 10 and (op.onnx_type == "Upsample" or op.onnx_type == "Resize" and op.opset < 11):
        return _as_resize(w, op, inputs, attrs, path)
    outs = [w.fresh(f"{path}:{i}" if op.outputs > 1 else path) for i in range(op.outputs)]
    known = {t.name: t for t in w.initializers}
    graph_inputs, initializers = [], []
    for name, spec in zip(inputs, specs):
        if not name:
            continue
        if name in known:  # a static input: the converter may read its value
            initializers.append(known[name])
        else:
            graph_inputs.append(_info(onnx, name, *spec))
    node = onnx.helper.make_node(op.onnx_type, inputs, outs, name=f"/{path}/{op.onnx_type}",
                                 **{k: v for k, v in attrs.items() if v is not None})
    graph = onnx.helper.make_graph([node], "node", graph_inputs,
                                   [_info(onnx, n, s.shape, s.dtype) for n, s in zip(outs, out_specs)],
                                   initializer=initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", op.opset)])
    try:
        converted = onnx.version_converter.convert_version(model, w.opset)
    except Exception as e:  # noqa: BLE001  (the converter's own error, by message)
        raise SerializationError(
            f"layer {path!r} (op {op.op_name}) was read at ONNX opset {op.opset}, where the "
            f"operator is defined otherwise than at opset {w.opset}, and ONNX's version "
            f"converter cannot rewrite it ({type(e).__name__}: {str(e).strip()[:200]}); write "
            f"the graph with to_onnx(..., opset={op.opset}) (or an opset where the operator "
            f"is defined as at {op.opset})") from None
    renamed = {n: n for n in [*inputs, *outs] if n}
    for t in converted.graph.initializer:
        if t.name not in known:
            renamed[t.name] = w.fresh(f"{path}/{t.name}")
            t = onnx.TensorProto.FromString(t.SerializeToString())
            t.name = renamed[t.name]
            w.initializers.append(t)
    for n in converted.graph.node:
        for i, name in enumerate(n.output):
            if name not in renamed:
                renamed[name] = w.fresh(f"{path}/{name}")
            n.output[i] = renamed[name]
        for i, name in enumerate(n.input):
            if name:
                n.input[i] = renamed[name]
        n.name = f"/{path}/{n.op_type}"
        w.nodes.append(n)
    return outs
