"""Activations, each a stateless layer with a functional form: ``ops.relu(x)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from ..core.errors import ShapeError
from ..core.registry import register
from .base import Layer, expect_count, expect_float
from .flops import LOGISTIC, size, upcast_sum

__all__ = ["Relu", "Gelu", "Silu", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
           "relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax"]


class Unary(Layer):
    """A one-input op whose output has its input's spec."""

    def infer(self, inputs):
        expect_count(inputs, 1)
        expect_float(inputs[0])
        return (inputs[0],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (self.fn(inputs[0]),), state

    def fn(self, x):
        raise NotImplementedError

    #: Flops per element of ``fn`` (transcendental functions count none, as in XLA).
    flops_per_element = 1

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return self.flops_per_element * size(outputs[0])


@register("relu")
@dataclasses.dataclass(frozen=True)
class Relu(Unary):
    flops_per_element = 1  # max(x, 0)

    def fn(self, x):
        return jax.nn.relu(x)


@register("gelu")
@dataclasses.dataclass(frozen=True)
class Gelu(Unary):
    """GELU; exact (erf) by default, as in PyTorch and Keras; ``approximate=True`` for tanh."""

    approximate: bool = False

    def fn(self, x):
        return jax.nn.gelu(x, approximate=self.approximate)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        # tanh form: x**3 (two multiplies), three multiplies, two adds, tanh (none), a
        # multiply; erf form: four multiplies and negations around erfc (none).
        return (8 if self.approximate else 4) * size(outputs[0])

    def xla_cost_caveat(self, inference_mode):
        if self.approximate:
            return None
        return "XLA expands erfc into polynomials (about 60 flops per element)"


@register("silu")
@dataclasses.dataclass(frozen=True)
class Silu(Unary):
    flops_per_element = LOGISTIC + 1  # x * sigmoid(x)

    def fn(self, x):
        return jax.nn.silu(x)


@register("tanh")
@dataclasses.dataclass(frozen=True)
class Tanh(Unary):
    flops_per_element = 0  # a transcendental

    def fn(self, x):
        return jax.numpy.tanh(x)


@register("sigmoid")
@dataclasses.dataclass(frozen=True)
class Sigmoid(Unary):
    flops_per_element = LOGISTIC

    def fn(self, x):
        return jax.nn.sigmoid(x)


class _AxisUnary(Unary):
    def infer(self, inputs):
        (x,) = super().infer(inputs)
        if not -x.rank <= self.axis < x.rank:
            raise ShapeError(f"axis {self.axis} is out of range for rank {x.rank}",
                             expected=f"rank > {self.axis}")
        return (x,)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The max (a reduction, then ``max(., -inf)`` per row), a subtract, exp (none),
        the sum (a reduction) and a divide (softmax) or subtract of its log
        (log_softmax): ``4 * elements - rows``."""
        (x,) = inputs
        axis = self.axis % x.rank
        rows = size(x.shape[:axis] + x.shape[axis + 1:])
        return 4 * size(x) - rows + upcast_sum(size(x), rows, x.dtype)


@register("softmax")
@dataclasses.dataclass(frozen=True)
class Softmax(_AxisUnary):
    """Softmax over ``axis``. Precision-sensitive: float32 under a half-precision policy."""

    axis: int = -1
    precision_sensitive = True

    def fn(self, x):
        return jax.nn.softmax(x, axis=self.axis)


@register("log_softmax")
@dataclasses.dataclass(frozen=True)
class LogSoftmax(_AxisUnary):
    """Log-softmax over ``axis``. Precision-sensitive."""

    axis: int = -1
    precision_sensitive = True

    def fn(self, x):
        return jax.nn.log_softmax(x, axis=self.axis)


def relu(x):
    return Relu()(x)


def gelu(x, approximate: bool = False):
    return Gelu(approximate)(x)


def silu(x):
    return Silu()(x)


def tanh(x):
    return Tanh()(x)


def sigmoid(x):
    return Sigmoid()(x)


def softmax(x, axis: int = -1):
    return Softmax(axis)(x)


def log_softmax(x, axis: int = -1):
    return LogSoftmax(axis)(x)


# --- ``activation=`` on Linear and Conv --------------------------------------------------

_ACTIVATIONS: dict[str, Callable[[], Unary]] = {
    "relu": Relu, "gelu": Gelu, "gelu_tanh": lambda: Gelu(approximate=True), "silu": Silu,
    "tanh": Tanh, "sigmoid": Sigmoid}


def to_activation(value, layer) -> str | None:
    """An ``activation=`` argument as the name of an activation: ``"relu"``,
    ``"gelu"`` (exact), ``"gelu_tanh"``, ``"silu"``, ``"tanh"``, ``"sigmoid"``; the
    functional forms (``ops.relu``) are taken by their name."""
    if value is None:
        return None
    name = value if isinstance(value, str) else getattr(value, "__name__", None)
    if name == "swish":
        name = "silu"
    if name not in _ACTIVATIONS:
        layer.invalid(f"activation must be one of {', '.join(map(repr, _ACTIVATIONS))} or None, "
                      f"got {value!r}")
    return name


def activation_layer(name: str) -> Unary:
    return _ACTIVATIONS[name]()


def apply_activation(name: str | None, x):
    return x if name is None else activation_layer(name).fn(x)


def activation_flops(name: str | None, spec) -> int:
    if name is None:
        return 0
    return activation_layer(name).flops([spec], [spec], param_dtype=spec.dtype, inference_mode=True)


def activation_caveat(name: str | None) -> str | None:
    return None if name is None else activation_layer(name).xla_cost_caveat(True)
