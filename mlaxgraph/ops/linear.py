"""Linear: a dense layer contracting the last axis."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from ..core.axes import weight_axes
from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from . import initializers
from .activation import activation_caveat, activation_flops, apply_activation, to_activation
from .base import (
    Initializer,
    Layer,
    ParamSpec,
    cast_params,
    expect_count,
    expect_float,
    field,
    to_accumulation_dtype,
    to_axes,
    to_param_axes,
    to_precision,
)
from .flops import size, weight_converts

__all__ = ["Linear"]


@register("linear")
@dataclasses.dataclass(frozen=True)
class Linear(Layer):
    """``y = x @ kernel + bias`` over the last axis of an input of any rank >= 1.

    Params: ``kernel (in, features)``, ``bias (features,)``. Defaults: kernel LeCun
    normal (fan in), bias zeros. Logical axes (for sharding): kernel ``("embed",
    "mlp")`` unless ``kernel_axes`` says otherwise, bias the kernel's last;
    ``param_axes={"bias": ...}`` overrides one weight. The output's last dim takes the
    kernel's last name.

    ``precision`` (``"default"``, ``"high"``, ``"highest"``) and
    ``preferred_element_type`` (the accumulation dtype, e.g. float32 for bfloat16
    inputs) go to ``lax.dot_general``; the output is cast back to the input's dtype.
    ``activation`` (``"relu"``, ``"gelu"``, ``"silu"``, ... or ``ops.relu``) is applied
    to the output, as Keras's.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.Linear(10)(mg.Input(("batch", 3136)))
      SymbolicTensor(f32[batch,10], from 'linear')
    """

    features: int
    use_bias: bool = True
    kernel_init: Initializer | None = None
    bias_init: Initializer | None = None
    kernel_axes: tuple[str | None, ...] | None = field(default=None, converter=to_axes)
    precision: str | None = field(default=None, converter=to_precision)
    preferred_element_type: np.dtype | None = field(default=None, converter=to_accumulation_dtype)
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)
    activation: str | None = field(default=None, converter=to_activation)

    def xla_cost_caveat(self, inference_mode):
        return activation_caveat(self.activation)

    def validate(self):
        if not isinstance(self.features, int) or isinstance(self.features, bool) or self.features < 1:
            self.invalid(f"features must be a positive int, got {self.features!r}")

    def _in_features(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        if x.rank < 1:
            raise ShapeError("needs an input of rank >= 1", expected=f"{x.dtype}[..., in]")
        if is_symbolic(x.shape[-1]):
            raise ShapeError("the last (contracted) dim must be a known int, not symbolic",
                             expected="a concrete last dim")
        return x.shape[-1]

    def infer(self, inputs):
        self._in_features(inputs)
        x = inputs[0]
        return (x.with_shape(x.shape[:-1] + (self.features,)),)

    def param_specs(self, inputs):
        n_in = self._in_features(inputs)
        specs = {"kernel": ParamSpec((n_in, self.features),
                                     self.kernel_init or initializers.lecun_normal,
                                     self.kernel_axes or ("embed", "mlp"))}
        if self.use_bias:
            specs["bias"] = ParamSpec((self.features,), self.bias_init or initializers.zeros,
                                      (self.kernel_axes or ("embed", "mlp"))[-1:])
        return specs

    def output_axes(self, input_axes, inputs, outputs):
        kernel = weight_axes(self, inputs)[0]["kernel"][1]
        return (tuple(input_axes[0][:-1]) + kernel[-1:],)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        p = cast_params(params, x.dtype)
        y = lax.dot_general(x, p["kernel"], (((x.ndim - 1,), (0,)), ((), ())),
                            precision=self.precision,
                            preferred_element_type=self.preferred_element_type)
        if self.use_bias:
            y = y + p["bias"].astype(y.dtype)
        return (apply_activation(self.activation, y.astype(x.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The dot (``2 * in * out`` per row), the bias add, and the converts of the
        weights and of a ``preferred_element_type`` result."""
        (x,), (y,) = inputs, outputs
        count = 2 * size(y) * x.shape[-1] + (size(y) if self.use_bias else 0)
        count = count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)
        if self.preferred_element_type is not None and self.preferred_element_type != x.dtype:
            count = count + size(y) + (self.features if self.use_bias else 0)
        return count + activation_flops(self.activation, y)
