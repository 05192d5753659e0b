"""The counting conventions of the ops' FLOP rules, written once.

Each op's ``flops`` method (mlaxgraph/ops/*.py) counts what its ``apply`` asks XLA to
compute, by the rules of XLA's cost analysis (``HloCostAnalysis``), so that the count can
be checked against ``jax.jit(...).lower(...).cost_analysis()``:

- a dot or convolution is ``2 * multiply-adds``; a convolution counts only the kernel
  taps that land on the input, not on its padding;
- an elementwise arithmetic op, a comparison, a select, a ``max`` and a dtype
  conversion (``convert``) are one flop per output element;
- a transcendental function (``exp``, ``log``, ``tanh``, ``rsqrt``, ``erf``) is no flop:
  XLA counts it apart, as a transcendental; ``logistic`` (sigmoid) is three flops;
- a reduction is one flop per element it folds in (``input - output`` elements), a
  pooling window ``window - 1`` per output element;
- moving data (reshape, transpose, broadcast, slice, concatenate, gather) is free;
- ``jnp.sum`` and ``jnp.mean`` of 16-bit floats sum in float32: a convert of their
  input and of their result (``upcast_sum``).

Counts are ints or ``jax.export`` dimension expressions of the symbolic dims
(``200704*batch``).

Example:
  >>> from mlaxgraph.core.specs import TensorSpec
  >>> size(TensorSpec.of(("batch", 28, 28, 16), "float32"))
  12544*batch
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..core.specs import Dim, TensorSpec, flatten_specs, is_symbolic

__all__ = ["size", "weight_converts", "reduction", "upcast_sum", "window_taps", "dim_min",
           "dim_max", "LOGISTIC"]

#: Flops XLA counts for one ``logistic`` (sigmoid): negate, add, divide; its exp is a
#: transcendental.
LOGISTIC = 3


def size(spec: TensorSpec | Iterable[Dim]) -> Dim:
    """The number of elements of a spec or a shape (symbolic when its dims are)."""
    shape = spec.shape if isinstance(spec, TensorSpec) else spec
    total: Dim = 1
    for d in shape:
        total = total * d
    return total


def weight_converts(specs: Mapping[str, Any], param_dtype: Any, dtype: Any) -> Dim:
    """The converts of a layer casting its weights (``param_dtype``) to the dtype it
    computes in: one per weight element, none when the dtypes agree (``astype`` to the
    same dtype is no operation)."""
    if np.dtype(param_dtype) == np.dtype(dtype):
        return 0
    return sum(spec.size for _, spec in flatten_specs(specs))


def reduction(input_size: Dim, output_size: Dim) -> Dim:
    """A reduction folds ``input - output`` elements into its outputs."""
    return input_size - output_size


def upcast_sum(input_size: Dim, output_size: Dim, dtype: Any) -> Dim:
    """The converts around a ``jnp.sum`` or ``jnp.mean`` of ``dtype``: JAX sums 16-bit
    floats in float32, converting the input up and the result back.

    Example:
      >>> upcast_sum(1024, 16, "bfloat16"), upcast_sum(1024, 16, "float32")
      (1040, 0)
    """
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":
        if dtype.itemsize < 4:
            return input_size + output_size
    return 0


def dim_min(a: Dim, b: Dim) -> Dim:
    if is_symbolic(a):
        return a.min(b)
    if is_symbolic(b):
        return b.min(a)
    return min(a, b)


def dim_max(a: Dim, b: Dim) -> Dim:
    if is_symbolic(a):
        return a.max(b)
    if is_symbolic(b):
        return b.max(a)
    return max(a, b)


def window_taps(size_in: Dim, size_out: Dim, window: int, stride: int, pad_low: Any,
                dilation: int = 1) -> Dim:
    """The (output position, window position) pairs of one spatial axis that land on the
    input rather than on its padding: what XLA counts for a convolution.

    Example:
      >>> window_taps(8, 8, 3, 1, 1)   # "SAME": 8 * 3 taps, 2 of them on the padding
      22
    """
    taps: Dim = 0
    last = size_out - 1
    for j in range(window):
        offset = pad_low - j * dilation  # output o reads input o * stride - offset
        first = dim_max(0, -((-offset) // stride))  # ceil(offset / stride)
        upto = dim_min(last, (size_in - 1 + offset) // stride)
        taps = taps + dim_max(0, upto - first + 1)
    return taps
