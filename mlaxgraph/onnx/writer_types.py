"""The integer types ``to_onnx`` reconciles: a graph read from ONNX holds int64 as
int32 unless ``jax_enable_x64`` is on, while some ONNX operators take or give int64
only (NonMaxSuppression's ``max_output_boxes_per_class``, NonZero's indices). An int32
tensor where the operator's schema allows int64 alone is cast to it before the node;
an int64-only output the graph holds as int32 is cast back after it, so the file's
types agree with the graph's."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import to_code

__all__ = ["widen_inputs", "narrow_outputs"]

_INT64, _INT32 = "tensor(int64)", "tensor(int32)"


def _allowed(onnx: Any, op_type: str, opset: int, outputs: bool) -> list[set[str]] | None:
    """The type strings each input (or output) of the operator's schema allows; the
    last formal parameter repeats (variadic). None for an operator without schema."""
    from .layer import DOMAINS

    domain = DOMAINS.get(op_type, "")
    try:  # another domain's operator: its newest schema (its versions are not ONNX's)
        schema = (onnx.defs.get_schema(op_type, domain=domain) if domain else
                  onnx.defs.get_schema(op_type, opset, ""))
    except Exception:  # noqa: BLE001  (no schema in this onnx: nothing to reconcile)
        return None
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formal = schema.outputs if outputs else schema.inputs
    return [constraints.get(p.type_str, {p.type_str}) for p in formal] or None


def _only_int64(allowed: list[set[str]], i: int) -> bool:
    types = allowed[min(i, len(allowed) - 1)]
    return _INT64 in types and _INT32 not in types


def widen_inputs(w: Any, op_type: str, names: list[str], dtypes: list[Any], path: str) -> list[str]:
    """``names`` with each int32 tensor the operator takes as int64 only cast to int64."""
    allowed = _allowed(w.onnx, op_type, w.opset, outputs=False)
    if allowed is None:
        return names
    out = list(names)
    for i, (name, dtype) in enumerate(zip(names, dtypes)):
        if name and dtype is not None and np.dtype(dtype) == np.int32 and _only_int64(allowed, i):
            (out[i],) = w.node("Cast", [name], f"{path}/in{i}", part=True, to=to_code(np.dtype(np.int64)))
    return out


def narrow_outputs(w: Any, op_type: str, outs: list[str], specs: Any, path: str) -> list[str]:
    """``outs`` with each int64-only output the graph holds as int32 cast to int32."""
    allowed = _allowed(w.onnx, op_type, w.opset, outputs=True)
    if allowed is None:
        return outs
    out = list(outs)
    for i, (name, spec) in enumerate(zip(outs, specs)):
        if np.dtype(spec.dtype) == np.int32 and _only_int64(allowed, i):
            (out[i],) = w.node("Cast", [name], f"{path}/out{i}", part=True, to=to_code(spec.dtype))
    return out
