"""Binary elementwise ops with NumPy broadcasting and no dtype promotion: the
arithmetic and comparison operators of symbolic tensors (``x + y``, ``x * 2.0``,
``x < y``). Each takes two tensors of one dtype, or one tensor and a Python scalar
(``constant``), which stays weakly typed: ``bf16 * 2.0`` is bfloat16."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic, shape_str
from .base import Layer, expect_count, field, same_dtype
from .flops import size

__all__ = ["Add", "Sub", "Mul", "Div", "Pow", "Maximum", "Minimum", "Equal", "NotEqual",
           "Less", "LessEqual", "Greater", "GreaterEqual", "add", "sub", "mul",
           "broadcast_shapes", "Scalar"]

Scalar = bool | int | float


def broadcast_shapes(a, b):
    """NumPy broadcasting of two shapes that may hold symbolic dims; None if they clash."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif not is_symbolic(x) and x == 1:
            out.append(y)
        elif not is_symbolic(y) and y == 1:
            out.append(x)
        else:
            return None
    return tuple(out)


def to_scalar(value, layer):
    """A Python scalar (bool, int or float; NumPy scalars taken), or None."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, np.generic) and value.ndim == 0:
        return value.item()
    layer.invalid(f"constant must be a Python scalar (bool, int, float), got {type(value).__name__}")


def _kind(value) -> int:
    return 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2


def _check_constant(spec, constant) -> None:
    """A constant may not be of a wider kind than the tensor (a float with an integer
    tensor, an int with a boolean one): that would promote the tensor's dtype."""
    dtype = np.dtype(spec.dtype)
    kind = 0 if dtype == np.dtype(bool) else 2 if spec.is_float else 1
    if _kind(constant) > kind:
        raise DTypeError(f"the constant {constant!r} would promote the {dtype} tensor; cast the "
                         f"tensor with ops.cast(x, dtype) or write the constant as a "
                         f"{'bool' if kind == 0 else 'int'}",
                         expected=f"a {dtype} tensor and a {'bool' if kind == 0 else 'int'} constant")


@dataclasses.dataclass(frozen=True)
class Binary(Layer):
    """``fn(a, b)`` of two tensors, or of one tensor and ``constant`` (``fn(x,
    constant)``, or ``fn(constant, x)`` with ``reverse=True``)."""

    constant: Scalar | None = field(default=None, converter=to_scalar)
    reverse: bool = False

    #: The output is boolean (comparisons).
    boolean = False

    def _dtype(self, dtype):
        if self.boolean:
            return np.dtype(bool)
        if self.constant is None:
            return dtype
        # jnp's own rule for a weakly typed Python scalar: the tensor's dtype is kept
        # (an int tensor with a float constant gives the default float).
        return np.dtype(jnp.result_type(dtype, self.constant))

    def infer(self, inputs):
        if self.constant is not None:
            expect_count(inputs, 1)
            _check_constant(inputs[0], self.constant)
            return (inputs[0].with_dtype(self._dtype(inputs[0].dtype)),)
        expect_count(inputs, 2)
        same_dtype(inputs)
        a, b = inputs
        shape = broadcast_shapes(a.shape, b.shape)
        if shape is None:
            raise ShapeError("the shapes do not broadcast",
                             expected=f"{shape_str(a.shape)} and a shape broadcastable to it")
        return (a.with_shape(shape).with_dtype(self._dtype(a.dtype)),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if self.constant is None:
            a, b = inputs
        elif self.reverse:
            a, b = self.constant, inputs[0]
        else:
            a, b = inputs[0], self.constant
        return (self.fn(a, b),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return size(outputs[0])  # one per output element; broadcasting is free


@register("add")
@dataclasses.dataclass(frozen=True)
class Add(Binary):
    fn = staticmethod(jnp.add)


@register("sub")
@dataclasses.dataclass(frozen=True)
class Sub(Binary):
    fn = staticmethod(jnp.subtract)


@register("mul")
@dataclasses.dataclass(frozen=True)
class Mul(Binary):
    """``a * b``. A multiply by the constant 1 (``mg.lora``'s scale at ``alpha ==
    rank``) counts no FLOPs: XLA's algebraic simplifier drops it."""

    fn = staticmethod(jnp.multiply)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        if self.constant is not None and not isinstance(self.constant, bool) and self.constant == 1:
            return 0
        return super().flops(inputs, outputs, param_dtype=param_dtype, inference_mode=inference_mode)


@register("div")
@dataclasses.dataclass(frozen=True)
class Div(Binary):
    """True division (``/``) of float tensors (cast integers first: no silent
    promotion)."""

    fn = staticmethod(jnp.true_divide)

    def infer(self, inputs):
        if inputs and not inputs[0].is_float:
            raise DTypeError(f"true division needs float tensors, got {inputs[0].dtype}",
                             expected="a float dtype; cast with ops.cast(x, 'float32')")
        return super().infer(inputs)


@register("pow")
@dataclasses.dataclass(frozen=True)
class Pow(Binary):
    """``x ** y``. An integer ``constant`` exponent is computed by multiplications
    (``lax.integer_pow``), as ``jnp.power`` does."""

    fn = staticmethod(jnp.power)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        (y,) = outputs
        e = self.constant
        if isinstance(e, int) and not isinstance(e, bool) and not self.reverse:
            # square-and-multiply: a multiply per bit after the first, one per set bit
            # after the first; a negative exponent adds a divide.
            n = abs(e)
            multiplies = max(n.bit_length() - 1, 0) + max(bin(n).count("1") - 1, 0)
            return (multiplies + (e < 0)) * size(y)
        return 0  # pow is a transcendental in XLA's count


@register("maximum")
@dataclasses.dataclass(frozen=True)
class Maximum(Binary):
    fn = staticmethod(jnp.maximum)


@register("minimum")
@dataclasses.dataclass(frozen=True)
class Minimum(Binary):
    fn = staticmethod(jnp.minimum)


@dataclasses.dataclass(frozen=True)
class Compare(Binary):
    boolean = True


@register("equal")
@dataclasses.dataclass(frozen=True)
class Equal(Compare):
    fn = staticmethod(jnp.equal)


@register("not_equal")
@dataclasses.dataclass(frozen=True)
class NotEqual(Compare):
    fn = staticmethod(jnp.not_equal)


@register("less")
@dataclasses.dataclass(frozen=True)
class Less(Compare):
    fn = staticmethod(jnp.less)


@register("less_equal")
@dataclasses.dataclass(frozen=True)
class LessEqual(Compare):
    fn = staticmethod(jnp.less_equal)


@register("greater")
@dataclasses.dataclass(frozen=True)
class Greater(Compare):
    fn = staticmethod(jnp.greater)


@register("greater_equal")
@dataclasses.dataclass(frozen=True)
class GreaterEqual(Compare):
    fn = staticmethod(jnp.greater_equal)


def add(a, b):
    return Add()(a, b)


def sub(a, b):
    return Sub()(a, b)


def mul(a, b):
    return Mul()(a, b)
