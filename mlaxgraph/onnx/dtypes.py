"""ONNX's element types (``TensorProto.DataType`` codes) as JAX dtypes, without the
``onnx`` package: the op family reads ``Cast``'s ``to`` with it, the reader and the
writer convert tensors with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError

__all__ = ["CODES", "to_dtype", "to_code", "canonical", "int64"]

#: code -> dtype name (numpy's or ml_dtypes' as JAX knows them); 8 is ONNX's string.
CODES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn",
    18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4",
    22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}
_NAMES = {name: code for code, name in CODES.items()}


def to_dtype(code: int) -> np.dtype:
    """The dtype of an ONNX element type code, narrowed as JAX runs it (``canonical``)."""
    name = CODES.get(int(code))
    if name is None:
        raise DTypeError(f"ONNX element type {code} ({'string' if code == 8 else 'unknown'}) "
                         f"has no JAX dtype", expected="a numeric or bool element type")
    try:
        return canonical(jnp.dtype(name))
    except TypeError:
        raise DTypeError(f"ONNX element type {name} is not available in this JAX",
                         expected="a numeric or bool element type") from None


def to_code(dtype: np.dtype) -> int:
    """The ONNX element type code of a dtype."""
    code = _NAMES.get(np.dtype(dtype).name)
    if code is None:
        raise DTypeError(f"{dtype} has no ONNX element type", expected="a numeric or bool dtype")
    return code


def canonical(dtype: np.dtype) -> np.dtype:
    """``dtype`` as JAX computes in it: 64-bit types narrow to 32 bits unless
    ``jax_enable_x64`` is on."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def int64() -> np.dtype:
    """ONNX's index type (int64), narrowed as JAX runs it."""
    return canonical(np.dtype("int64"))
