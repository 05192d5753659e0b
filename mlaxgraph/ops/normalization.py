"""Normalization layers. All precision-sensitive: a half-precision policy runs them in
float32."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from . import initializers
from .base import Initializer, Layer, ParamSpec, cast_params, expect_count, expect_float, field, to_param_axes
from .flops import size, upcast_sum, weight_converts

__all__ = ["BatchNorm", "LayerNorm", "RMSNorm", "GroupNorm"]

#: BatchNorm's ways of computing the batch variance in training.
VARIANCES = ("auto", "shifted", "two_pass")


def _scale_bias(features: int, use_scale: bool = True, use_bias: bool = True, scale_init=None) -> dict:
    """The per-feature ``scale`` (ones, or ``scale_init``) and ``bias`` (zeros) of the
    normalizations."""
    specs = {}
    if use_scale:
        specs["scale"] = ParamSpec((features,), scale_init or initializers.ones, ("embed",))
    if use_bias:
        specs["bias"] = ParamSpec((features,), initializers.zeros, ("embed",))
    return specs


@register("batch_norm")
@dataclasses.dataclass(frozen=True)
class BatchNorm(Layer):
    """Batch normalization over every axis but ``axis``.

    Params: ``scale`` (ones), ``bias`` (zeros), each ``(features,)``; state ``mean``
    (zeros) and ``var`` (ones). Training normalizes with the batch mean and biased
    variance and updates ``new = momentum * old + (1 - momentum) * batch``;
    ``unbiased_running_var=True`` updates ``var`` with the unbiased batch variance
    (times ``n / (n - 1)``), as PyTorch does. Inference uses the running statistics.
    ``scale_init`` replaces the scale's ones (``initializers.zeros`` for a residual
    branch that starts as the identity).

    ``variance`` picks how training computes the batch variance: ``"shifted"``, one
    pass over the input, ``mean((x - k)^2) - (mean - k)^2`` with ``k`` the batch's first
    value of each channel (x at index 0 of every reduced axis: a slice, no reduction);
    float32's cancellation multiplies the sums' rounding by ``1 + |k - mean|^2 / var``,
    about 2 typically and at most the values per channel ``N`` (a value is at most
    ``sqrt(N - 1)`` standard deviations from its mean), whatever the mean, so a batch
    whose first values are far outliers is better served by ``"two_pass"``;
    ``"two_pass"``, ``mean((x - mean)^2)``, a second pass; ``"auto"`` (the default) is
    ``"shifted"`` for 32- and 64-bit floats on CPU and ``"two_pass"`` for 16-bit ones
    (where the cancellation would cost 2^13 times more) and on other backends (on GPU
    the second pass fuses with the first and is faster: benchmarks/RESULTS.md, "On
    GPU"). On CPU, training normalizes as ``x * m + (bias - mean * m)`` with ``m =
    rsqrt(var + epsilon) * scale``: the backward pass keeps ``x``, which the layer before
    keeps anyway, not ``x - mean``; on other backends as ``(x - mean) * m + bias``,
    whose backward pass XLA's GPU fusions serve with less memory. Inference uses the
    first form.
    Logical axes (for sharding): all four ``("embed",)``; ``param_axes={"scale": ...,
    "mean": ...}`` overrides them.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.BatchNorm(name="bn")(mg.Input(("batch", 8, 8, 16)))
      SymbolicTensor(f32[batch,8,8,16], from 'bn')
    """

    momentum: float = 0.9
    epsilon: float = 1e-5
    axis: int = -1
    use_scale: bool = True
    use_bias: bool = True
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)
    unbiased_running_var: bool = False
    scale_init: Initializer | None = None
    variance: str = "auto"

    precision_sensitive = True

    def validate(self):
        if not 0.0 <= float(self.momentum) <= 1.0:
            self.invalid(f"momentum must be in [0, 1], got {self.momentum!r}")
        if not float(self.epsilon) > 0.0:
            self.invalid(f"epsilon must be > 0, got {self.epsilon!r}")
        if not isinstance(self.axis, int):
            self.invalid(f"axis must be an int, got {self.axis!r}")
        if self.variance not in VARIANCES:
            self.invalid(f"variance must be one of {', '.join(map(repr, VARIANCES))}, "
                         f"got {self.variance!r}")

    def one_pass(self, dtype, backend: str | None = None) -> bool:
        """Whether training computes the variance in one (shifted) pass for inputs of
        ``dtype`` on ``backend`` (None: JAX's default backend; see ``variance``)."""
        if self.variance == "auto":
            backend = jax.default_backend() if backend is None else backend
            return jnp.dtype(dtype).itemsize >= 4 and backend == "cpu"
        return self.variance == "shifted"

    def _features(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        if not -x.rank <= self.axis < x.rank:
            raise ShapeError(f"axis {self.axis} is out of range for rank {x.rank}",
                             expected=f"an input of rank > {self.axis if self.axis >= 0 else -self.axis - 1}")
        features = x.shape[self.axis]
        if is_symbolic(features):
            raise ShapeError("the normalized axis must have a known size",
                             expected=f"a concrete dim at axis {self.axis}")
        return features

    def infer(self, inputs):
        self._features(inputs)
        return (inputs[0],)

    def param_specs(self, inputs):
        return _scale_bias(self._features(inputs), self.use_scale, self.use_bias, self.scale_init)

    def state_specs(self, inputs):
        f = self._features(inputs)
        return {"mean": ParamSpec((f,), initializers.zeros, ("embed",)),
                "var": ParamSpec((f,), initializers.ones, ("embed",))}

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        axis = self.axis % x.ndim
        reduce = tuple(i for i in range(x.ndim) if i != axis)
        shape = tuple(x.shape[i] if i == axis else 1 for i in range(x.ndim))
        p = cast_params(params, x.dtype)
        if inference_mode:
            mean = state["mean"].astype(x.dtype)
            var = state["var"].astype(x.dtype)
            new_state = state
        else:
            if self.one_pass(x.dtype):
                # Shifted by k, the batch's first value of each channel (x at index 0 of
                # every reduced axis: a slice, no reduction): the variance does not
                # depend on the shift, float32's cancellation only on its distance from
                # the mean, at most sqrt(N - 1) standard deviations for N values a
                # channel (Samuelson's inequality), whatever the mean; the mean is k
                # plus the mean of x - k, from the same pass.
                first = tuple(slice(0, 1) if i in reduce else slice(None) for i in range(x.ndim))
                k = lax.stop_gradient(x[first])
                xk = x - k
                shifted = jnp.mean(xk, axis=reduce)
                mean = k.reshape(-1) + shifted
                var = jnp.maximum(jnp.mean(jnp.square(xk), axis=reduce) - jnp.square(shifted),
                                  jnp.zeros((), x.dtype))
            else:
                mean = jnp.mean(x, axis=reduce)
                var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=reduce)
            m = self.momentum
            running = var.astype(state["var"].dtype)
            if self.unbiased_running_var:
                n = math.prod(x.shape[i] for i in reduce)
                if is_symbolic(n):  # traced for export with a symbolic batch: n as a value
                    count = jnp.asarray(n).astype(running.dtype)
                    running = running * (count / jnp.maximum(count - 1, 1))
                elif n < 2:
                    raise ShapeError(f"training with unbiased_running_var needs more than one "
                                     f"value per channel, got {n}", expected="a batch of 2 or more")
                else:
                    running = running * jnp.asarray(n / (n - 1), running.dtype)
            new_state = {
                "mean": m * state["mean"] + (1.0 - m) * mean.astype(state["mean"].dtype),
                "var": m * state["var"] + (1.0 - m) * running,
            }
        inv = lax.rsqrt(var + jnp.asarray(self.epsilon, x.dtype))
        if self.use_scale:
            inv = inv * p["scale"]
        if not inference_mode and jax.default_backend() != "cpu":
            # centered: XLA's GPU fusions keep less for the backward pass this way
            y = (x - mean.reshape(shape)) * inv.reshape(shape)
            return ((y + p["bias"].reshape(shape) if self.use_bias else y),), new_state
        # One per-channel multiplier (the scale folded in) and one per-channel shift
        # (the mean and the bias folded in): two operations per element, and the
        # backward pass keeps x (which the layer before keeps too), not x - mean.
        shift = p["bias"] - mean * inv if self.use_bias else -(mean * inv)
        y = x * inv.reshape(shape) + shift.reshape(shape)
        return (y,), new_state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per element: multiply by ``m = rsqrt(var + epsilon) * scale`` and add ``bias -
        mean * m`` (per channel: the add, the multiply by the scale, the multiply by the
        mean and the bias's subtract or the negation). In training also the batch mean
        and variance (two means; a subtract and a square per element) and the running
        statistics' update; one pass adds, per channel, the mean's add, the square and
        subtract of the correction and the clamp at zero (the shift is a slice)."""
        (x,) = inputs
        elements, features = size(x), self._features(inputs)
        count = 2 * elements + (3 + self.use_scale) * features
        count = count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)
        # The statistics (kept in param_dtype) are cast to the input's dtype to be used,
        # or the batch's are cast to theirs to be stored.
        count = count + weight_converts(self.state_specs(inputs), param_dtype, x.dtype)
        if not inference_mode:
            count = count + 4 * elements + (6 + self.unbiased_running_var) * features
            if self.one_pass(x.dtype):
                count = count + 4 * features
            count = count + 2 * upcast_sum(elements, features, x.dtype)  # two means
        return count


class _FeatureNorm(Layer):
    """Shared checks of the norms with per-feature weights over the last axis."""

    precision_sensitive = True

    def validate(self):
        if not float(self.epsilon) > 0.0:
            self.invalid(f"epsilon must be > 0, got {self.epsilon!r}")

    def _features(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        expect_float(x)
        axis = getattr(self, "axis", -1)
        if not -x.rank <= axis < x.rank:
            raise ShapeError(f"axis {axis} is out of range for rank {x.rank}",
                             expected=f"rank > {axis if axis >= 0 else -axis - 1}")
        if is_symbolic(x.shape[axis]):
            raise ShapeError("the normalized axis must have a known size",
                             expected=f"a concrete dim at axis {axis}")
        return x.shape[axis]

    def infer(self, inputs):
        self._features(inputs)
        return (inputs[0],)


@register("layer_norm")
@dataclasses.dataclass(frozen=True)
class LayerNorm(_FeatureNorm):
    """Normalizes over ``axis`` with the mean and biased variance of each example.

    Params: ``scale`` (ones) and ``bias`` (zeros), each ``(features,)``, logical axes
    ``("embed",)`` (``param_axes`` overrides them). Precision-sensitive.
    """

    epsilon: float = 1e-5
    axis: int = -1
    use_scale: bool = True
    use_bias: bool = True
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    def param_specs(self, inputs):
        return _scale_bias(self._features(inputs), self.use_scale, self.use_bias)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per element: the mean, a subtract, a square, the variance's mean, a subtract
        and a multiply, then scale and shift; ``+ epsilon`` per row."""
        (x,) = inputs
        rows = size(x.shape[:self.axis % x.rank] + x.shape[self.axis % x.rank + 1:])
        count = (6 + self.use_scale + self.use_bias) * size(x) + rows
        count = count + 2 * upcast_sum(size(x), rows, x.dtype)  # two means
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        axis = self.axis % x.ndim
        shape = tuple(x.shape[i] if i == axis else 1 for i in range(x.ndim))
        p = cast_params(params, x.dtype)
        mean = jnp.mean(x, axis=axis, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=axis, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + jnp.asarray(self.epsilon, x.dtype))
        if self.use_scale:
            y = y * p["scale"].reshape(shape)
        if self.use_bias:
            y = y + p["bias"].reshape(shape)
        return (y,), state


@register("rms_norm")
@dataclasses.dataclass(frozen=True)
class RMSNorm(_FeatureNorm):
    """``x * rsqrt(mean(x**2) + epsilon) * scale`` over the last axis.

    Params: ``scale (features,)`` (ones), logical axes ``("embed",)`` (``param_axes``
    overrides them). Precision-sensitive.
    """

    epsilon: float = 1e-6
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    def param_specs(self, inputs):
        return {"scale": ParamSpec((self._features(inputs),), initializers.ones, ("embed",))}

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per element: a square, the mean, a multiply and the scale; ``+ epsilon`` per
        row."""
        (x,) = inputs
        count = 4 * size(x) + size(x.shape[:-1])
        count = count + upcast_sum(size(x), size(x.shape[:-1]), x.dtype)
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = x * lax.rsqrt(ms + jnp.asarray(self.epsilon, x.dtype))
        return (y * params["scale"].astype(x.dtype),), state


@register("group_norm")
@dataclasses.dataclass(frozen=True)
class GroupNorm(_FeatureNorm):
    """Normalizes channel-last ``(batch, ..., channels)`` inputs over the spatial axes and
    the channels of each of ``num_groups`` groups (biased variance).

    Params: ``scale`` (ones) and ``bias`` (zeros), each ``(channels,)``, logical axes
    ``("embed",)`` (``param_axes`` overrides them). Precision-sensitive.
    """

    num_groups: int = 32
    epsilon: float = 1e-5
    param_axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = field(
        default=None, converter=to_param_axes)

    def validate(self):
        super().validate()
        if not isinstance(self.num_groups, int) or self.num_groups < 1:
            self.invalid(f"num_groups must be a positive int, got {self.num_groups!r}")

    def _features(self, inputs):
        channels = super()._features(inputs)
        if inputs[0].rank < 2:
            raise ShapeError("takes (batch, ..., channels)", expected="rank >= 2")
        if channels % self.num_groups:
            raise ShapeError(f"num_groups={self.num_groups} does not divide {channels} channels",
                             expected=f"channels divisible by {self.num_groups}")
        return channels

    def param_specs(self, inputs):
        return _scale_bias(self._features(inputs))

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """Per element as LayerNorm (eight with scale and shift); ``+ epsilon`` per
        example and group."""
        (x,) = inputs
        groups = x.shape[0] * self.num_groups
        count = 8 * size(x) + groups + 2 * upcast_sum(size(x), groups, x.dtype)
        return count + weight_converts(self.param_specs(inputs), param_dtype, x.dtype)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        (x,) = inputs
        p = cast_params(params, x.dtype)
        grouped = x.reshape(x.shape[:-1] + (self.num_groups, x.shape[-1] // self.num_groups))
        axes = tuple(range(1, grouped.ndim - 2)) + (grouped.ndim - 1,)
        mean = jnp.mean(grouped, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(grouped - mean), axis=axes, keepdims=True)
        y = ((grouped - mean) * lax.rsqrt(var + jnp.asarray(self.epsilon, x.dtype))).reshape(x.shape)
        return (y * p["scale"] + p["bias"],), state
