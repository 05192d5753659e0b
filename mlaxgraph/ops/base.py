"""Small helpers the ops share: input checks, the dtype guarantee's weight cast, and
hyperparameter normalization. The layer contract itself, ``Layer``, lives with the IR
(``mlaxgraph/ir/op.py``); it is re-exported here for layer authors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from ..core.axes import as_axes, as_param_axes
from ..core.errors import DTypeError, MlaxGraphError, ShapeError, ShardingError
from ..core.specs import Initializer, ParamSpec, TensorSpec, as_dtype, is_int, shape_str
from ..ir.op import Layer, field

__all__ = ["Layer", "ParamSpec", "Initializer", "field"]


# --- small helpers ops share ---------------------------------------------------------


def expect_count(inputs: Sequence[TensorSpec], count: int, what: str = "input") -> None:
    if len(inputs) != count:
        raise ShapeError(f"takes {count} {what}{'s' if count != 1 else ''}, got {len(inputs)}",
                         expected=f"{count} tensor{'s' if count != 1 else ''}")


def expect_float(spec: TensorSpec) -> None:
    if not spec.is_float:
        raise DTypeError(f"needs a floating-point input, got {spec.dtype}",
                         expected=f"a float dtype (float32, bfloat16, float16) for {shape_str(spec.shape)}")


def same_dtype(inputs: Sequence[TensorSpec]) -> None:
    """No silent promotion: all inputs of a multi-input op share one dtype."""
    first = inputs[0].dtype if inputs else None
    if any(s.dtype != first for s in inputs):
        raise DTypeError(
            "inputs have different dtypes and mlaxgraph never promotes silently; cast one "
            "with ops.cast(x, dtype)",
            expected=", ".join(str(s.with_dtype(first)) for s in inputs))


def cast_params(params: Mapping[str, Any], dtype: Any) -> dict[str, Any]:
    """The dtype guarantee: weights are cast to the dtype the layer computes in."""
    return jax.tree.map(lambda v: v.astype(dtype), dict(params))


# --- converters (``mlaxgraph.ir.op.field``): each normalizes one kind of hyperparameter --


def to_dtype(value: Any, layer: Layer) -> np.dtype:
    """A dtype or its name, as a numpy dtype."""
    try:
        return as_dtype(value)
    except MlaxGraphError as e:
        layer.invalid(e.problem, DTypeError)


def to_optional_dtype(value: Any, layer: Layer) -> np.dtype | None:
    return None if value is None else to_dtype(value, layer)


def to_accumulation_dtype(value: Any, layer: Layer) -> np.dtype | None:
    """A float layer's ``preferred_element_type``: None or a float dtype (int8 made the
    products of bfloat16 inputs in int8, all zeros)."""
    dtype = to_optional_dtype(value, layer)
    if dtype is not None and not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        layer.invalid(f"preferred_element_type is a float dtype to accumulate in (float32), "
                      f"got {dtype}; integer products are mg.quantize's (docs/quantization.md)")
    return dtype


def to_precision(value: Any, layer: Layer) -> str | None:
    """``lax.Precision`` or its name, as ``"default"``, ``"high"`` or ``"highest"``."""
    if value is None:
        return None
    try:
        return lax.Precision(str(value).lower()).name.lower()
    except ValueError:
        layer.invalid(f"precision must be 'default', 'high' or 'highest', got {value!r}")


def to_axes(value: Any, layer: Layer) -> tuple[str | None, ...] | None:
    """Logical axes (one name or None per dim) as a tuple."""
    try:
        return as_axes(value, "kernel_axes")
    except MlaxGraphError as e:
        layer.invalid(e.problem, ShardingError)


def to_param_axes(value: Any, layer: Layer) -> tuple[tuple[str, tuple], ...] | None:
    """``param_axes`` (a dict by weight path, nested dicts or pairs) as sorted-by-
    declaration pairs, so the layer stays hashable."""
    try:
        return as_param_axes(value)
    except MlaxGraphError as e:
        layer.invalid(e.problem, ShardingError)


def exact_int(value: Any) -> int:
    """``value`` as an int when it is one (NumPy's too); ``TypeError`` for a bool, a
    float or a string, which ``int()`` would truncate or parse (a kernel of 3.5 read
    as 3, strides "12" as (1, 2))."""
    if not is_int(value):
        raise TypeError(f"not an int: {value!r}")
    return int(value)


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"not a tuple of ints: {value!r}")
    return tuple(exact_int(v) for v in value)


def to_ints(what: str) -> Callable[[Any, Layer], tuple[int, ...]]:
    """A converter of a tuple of ints (a list or any iterable of ints is taken)."""

    def convert(value: Any, layer: Layer) -> tuple[int, ...]:
        try:
            return _ints(value)
        except (TypeError, ValueError):
            layer.invalid(f"{what} must be a tuple of ints, got {value!r}")

    return convert


def per_spatial_dim(what: str, of: str, default_to: str | None = None) -> Callable[[Any, Layer], tuple[int, ...]]:
    """A converter of an int or a tuple with one int per spatial dim, as many as the
    field ``of`` (converted before it) has; None takes the field ``default_to``."""

    def convert(value: Any, layer: Layer) -> tuple[int, ...]:
        if value is None and default_to is not None:
            value = getattr(layer, default_to)
        return normalize_tuple(value, len(getattr(layer, of)), what, layer)

    return convert


def spatial_dims(what: str) -> Callable[[Any, Layer], tuple[int, ...]]:
    """A converter of a window or kernel size: 1, 2 or 3 positive ints."""

    def convert(value: Any, layer: Layer) -> tuple[int, ...]:
        n = len(value) if isinstance(value, (tuple, list)) else 0
        if n not in (1, 2, 3):
            layer.invalid(f"{what} must be a tuple of 1, 2 or 3 ints, got {value!r}")
        return normalize_tuple(value, n, what, layer)

    return convert


def padding_for(of: str) -> Callable[[Any, Layer], Any]:
    """A converter of ``"SAME"``, ``"VALID"`` or one ``(low, high)`` pair per spatial dim
    of the field ``of``."""

    def convert(value: Any, layer: Layer):
        n = len(getattr(layer, of))
        if isinstance(value, str):
            padding = value.upper()
            if padding not in ("SAME", "VALID"):
                layer.invalid(f"padding must be 'SAME', 'VALID' or {n} (low, high) pairs, got {value!r}")
            return padding
        try:
            pairs = tuple((exact_int(lo), exact_int(hi)) for lo, hi in value)
        except (TypeError, ValueError):
            layer.invalid(f"padding must be 'SAME', 'VALID' or {n} (low, high) pairs, got {value!r}")
        if len(pairs) != n or any(lo < 0 or hi < 0 for lo, hi in pairs):
            layer.invalid(f"padding needs {n} non-negative (low, high) pairs, got {value!r}")
        return pairs

    return convert


def normalize_tuple(value: Any, n: int, what: str, layer: Layer) -> tuple[int, ...]:
    if is_int(value):
        return (int(value),) * n
    try:
        result = _ints(value)
    except (TypeError, ValueError):
        layer.invalid(f"{what} must be an int or a tuple of {n} ints, got {value!r}")
    if len(result) != n:
        layer.invalid(f"{what} must have {n} entries, got {value!r}")
    return result
