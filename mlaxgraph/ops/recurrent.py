"""LSTM and GRU over ``(batch, time, features)``, on ``lax.scan``, from a zero state."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from . import initializers
from .base import Initializer, Layer, ParamSpec, cast_params, expect_count, expect_float, field, to_param_axes
from .flops import LOGISTIC, weight_converts

__all__ = ["LSTM", "GRU"]

_orthogonal = jax.nn.initializers.orthogonal()


def orthogonal(key, shape, dtype):
    """Orthogonal columns: the default recurrent kernel, as in Keras. Made in float32
    (the QR it needs has no half-precision kernel) and cast to ``dtype``."""
    return _orthogonal(key, shape, jnp.float32).astype(dtype)


def lstm_bias(key, shape, dtype):
    """Zeros, but ones for the forget gate (gate order i, f, g, o), as Keras's
    ``unit_forget_bias``: the cell remembers by default."""
    hidden = shape[0] // 4
    return jnp.zeros(shape, dtype).at[hidden:2 * hidden].set(1)


class Recurrent(Layer):
    gates = 0  # 4 for LSTM, 3 for GRU

    def validate(self):
        if not isinstance(self.hidden, int) or isinstance(self.hidden, bool) or self.hidden < 1:
            self.invalid(f"hidden must be a positive int, got {self.hidden!r}")

    def _features(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        if x.rank != 3 or is_symbolic(x.shape[-1]):
            raise ShapeError("takes (batch, time, features) with known features",
                             expected=f"{x.dtype}[batch,time,features]")
        return x.shape[-1]

    def param_specs(self, inputs):
        n = self._features(inputs)
        g = self.gates * self.hidden
        return {
            "input_kernel": ParamSpec((n, g), self.kernel_init or initializers.lecun_normal, ("embed", "mlp")),
            "recurrent_kernel": ParamSpec((self.hidden, g), self.recurrent_init or orthogonal, (None, "mlp")),
            "bias": ParamSpec((g,), self.bias_init or self.default_bias, ("mlp",)),
        }

    #: Flops of a step's gates per batch element and hidden unit, beyond ``h @ U``
    #: and ``x W + h U``.
    gate_flops = 0
    #: Adds per gate unit joining ``x W`` and ``h U`` outside the gates.
    step_adds = 0

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per step: the input projection (a dot and the bias add),
        ``h @ recurrent_kernel``, its add and the gates."""
        (x,) = inputs
        batch, time = x.shape[0], x.shape[1]
        gates = self.gates * self.hidden
        count = (2 * x.shape[-1] + 1) * batch * time * gates
        count = count + time * batch * (2 * self.hidden * gates + self.step_adds * gates
                                        + self.gate_flops * self.hidden)
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)

    def xla_cost_caveat(self, inference_mode):
        return "XLA counts the scan's loop body once, not once per step"

    def _scan(self, params, x, step, carry):
        p = cast_params(params, x.dtype)

        # Each step projects its own input. Projecting all steps in one matmul before
        # the loop keeps a (time, batch, gates) tensor and its gradient alive; on CPU
        # that measured 1.3x slower per train step (benchmarks/RESULTS.md).
        def body(c, x_t):
            return step(c, x_t @ p["input_kernel"] + p["bias"], p)

        return lax.scan(body, carry, jnp.swapaxes(x, 0, 1))


@register("lstm")
@dataclasses.dataclass(frozen=True)
class LSTM(Recurrent):
    """Long short-term memory, gate order i, f, g, o:
    ``c' = f*c + i*g``, ``h' = o*tanh(c')``.

    Input ``(batch, time, in)`` -> ``(batch, time, hidden)``; ``return_state=True`` adds
    the final ``h`` and ``c``, each ``(batch, hidden)``. Params: ``input_kernel (in,
    4h)`` (LeCun normal), ``recurrent_kernel (h, 4h)`` (orthogonal), ``bias (4h,)``
    (zeros, forget gate ones). Logical axes (for sharding): ``("embed", "mlp")``,
    ``(None, "mlp")``, ``("mlp",)``; ``param_axes`` overrides them.
    """

    hidden: int
    return_state: bool = False
    kernel_init: Initializer | None = None
    recurrent_init: Initializer | None = None
    bias_init: Initializer | None = None
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    gates = 4
    default_bias = staticmethod(lstm_bias)
    step_adds = 1  # x W + h U
    # three sigmoids; c' = f*c + i*g, h' = o*tanh(c'): three multiplies, an add
    gate_flops = 3 * LOGISTIC + 4

    def infer(self, inputs):
        self._features(inputs)
        x = inputs[0]
        seq = x.with_shape(x.shape[:2] + (self.hidden,))
        if not self.return_state:
            return (seq,)
        final = x.with_shape((x.shape[0], self.hidden))
        return seq, final, final

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs

        def step(carry, xw, p):
            h, c = carry
            i, f, g, o = jnp.split(xw + h @ p["recurrent_kernel"], 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((x.shape[0], self.hidden), x.dtype)
        (h, c), hs = self._scan(params, x, step, (zeros, zeros))
        seq = jnp.swapaxes(hs, 0, 1)
        return ((seq, h, c) if self.return_state else (seq,)), state


@register("gru")
@dataclasses.dataclass(frozen=True)
class GRU(Recurrent):
    """Gated recurrent unit, "reset after", gate order r, z, n, exactly PyTorch's
    ``nn.GRU`` and Keras's ``GRU(reset_after=True)``:
    ``r = sigmoid(x W_r + b_ir + h U_r + b_hr)``, ``z`` likewise,
    ``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``, ``h' = (1 - z) * n + z * h``.

    Input ``(batch, time, in)`` -> ``(batch, time, hidden)``; ``return_state=True`` adds
    the final ``h``. Params: ``input_kernel (in, 3h)`` (LeCun normal),
    ``recurrent_kernel (h, 3h)`` (orthogonal), ``bias (3h,)`` (PyTorch's ``b_ih``,
    zeros) and ``recurrent_bias (3h,)`` (``b_hh``, zeros). Logical axes (for
    sharding): ``("embed", "mlp")``, ``(None, "mlp")``, ``("mlp",)`` and ``("mlp",)``;
    ``param_axes`` overrides them. A model file saved before ``recurrent_bias``
    existed (weights layout 1) loads it as zeros: the one-bias GRU it computed.
    """

    hidden: int
    return_state: bool = False
    kernel_init: Initializer | None = None
    recurrent_init: Initializer | None = None
    bias_init: Initializer | None = None
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    gates = 3
    default_bias = staticmethod(initializers.zeros)
    step_adds = 1  # h U + b_hh; the gates add x W and h U themselves, in gate_flops
    # r, z: an add and a sigmoid each; n: a multiply and an add; h': a subtract, two
    # multiplies and an add
    gate_flops = 2 * (1 + LOGISTIC) + 2 + 4

    def param_specs(self, inputs):
        specs = dict(super().param_specs(inputs))
        specs["recurrent_bias"] = ParamSpec((3 * self.hidden,), self.bias_init or initializers.zeros,
                                            ("mlp",), added_in=2)
        return specs

    def infer(self, inputs):
        self._features(inputs)
        x = inputs[0]
        seq = x.with_shape(x.shape[:2] + (self.hidden,))
        return (seq, x.with_shape((x.shape[0], self.hidden))) if self.return_state else (seq,)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs

        def step(h, xw, p):
            xr, xz, xn = jnp.split(xw, 3, axis=-1)
            hr, hz, hn = jnp.split(h @ p["recurrent_kernel"] + p["recurrent_bias"], 3, axis=-1)
            r = jax.nn.sigmoid(xr + hr)
            z = jax.nn.sigmoid(xz + hz)
            n = jnp.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
            return h, h

        h, hs = self._scan(params, x, step, jnp.zeros((x.shape[0], self.hidden), x.dtype))
        seq = jnp.swapaxes(hs, 0, 1)
        return ((seq, h) if self.return_state else (seq,)), state
