"""Losses and metrics by name, each a function ``(outputs, targets) -> per-example
values``. The train step averages them; outputs are cast to float32 first, so a
half-precision model's loss is computed in float32."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from ..core.errors import GraphError

__all__ = ["LOSSES", "METRICS", "resolve_loss", "resolve_metrics"]

Objective = Callable[[Any, Any], Any]


def softmax_cross_entropy(logits, labels):
    """Cross-entropy of integer class labels against logits (optax's, in float32)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def sigmoid_binary_cross_entropy(logits, labels):
    """Per-example binary cross-entropy, averaged over the trailing axes."""
    values = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32),
                                                labels.astype(jnp.float32))
    return values.reshape(values.shape[0], -1).mean(axis=1)


def mean_squared_error(outputs, targets):
    """Per-example squared error, averaged over the trailing axes."""
    error = outputs.astype(jnp.float32) - targets.astype(jnp.float32)
    return (error * error).reshape(error.shape[0], -1).mean(axis=1)


def accuracy(logits, labels):
    """1.0 where the largest logit is the label's, else 0.0."""
    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


LOSSES: dict[str, Objective] = {
    "softmax_cross_entropy": softmax_cross_entropy,
    "sigmoid_binary_cross_entropy": sigmoid_binary_cross_entropy,
    "mean_squared_error": mean_squared_error,
}
METRICS: dict[str, Objective] = {"accuracy": accuracy}


def resolve_loss(loss: str | Objective) -> Objective:
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise GraphError(f"unknown loss {loss!r}; give a function (outputs, targets) -> "
                         f"per-example losses or one of {sorted(LOSSES)}")
    return LOSSES[loss]


def resolve_metrics(metrics) -> dict[str, Objective]:
    """``metrics``: None (none: the loss only), a sequence of names, or a mapping
    name -> function."""
    if metrics is None:
        metrics = ()
    if isinstance(metrics, str):
        raise GraphError(f"metrics takes a sequence of names, e.g. ({metrics!r},), not a string")
    if isinstance(metrics, Mapping):
        return dict(metrics)
    out = {}
    for name in metrics:
        if name not in METRICS:
            raise GraphError(f"unknown metric {name!r}; give a mapping name -> function or "
                             f"one of {sorted(METRICS)}")
        out[name] = METRICS[name]
    if "loss" in out:
        raise GraphError("'loss' is always reported; name the metric otherwise")
    return out
