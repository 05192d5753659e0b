"""Losses and metrics by name, each a function ``(outputs, targets) -> per-example
values``. The train step averages them; outputs are cast to float32 first (for a loss
or metric function as for the named ones), so a half-precision model's loss is
computed in float32; what a function returns is checked to be real values."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..core.errors import DTypeError, GraphError, ShapeError

__all__ = ["LOSSES", "METRICS", "resolve_loss", "resolve_metrics", "check_targets",
           "weighted_mean", "float32_outputs", "objective_values", "label_classes",
           "check_class_ids"]

Objective = Callable[[Any, Any], Any]


def softmax_cross_entropy(logits, labels):
    """Cross-entropy of integer class labels against logits (optax's, in float32); NaN
    for a label outside ``[0, classes)`` (-1, Hugging Face's ignored -100), which has
    no class to score, rather than some other class's loss."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    # NaN added outside the derivative, which stays optax's
    invalid = jnp.where((labels >= 0) & (labels < logits.shape[-1]), 0.0, jnp.nan)
    return losses + jax.lax.stop_gradient(invalid)


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

#: Keras's names of the same losses, for the hint of an unknown name (not aliases: Keras's
#: cross-entropies take probabilities unless ``from_logits=True``; these take logits).
_KERAS_NAMES = {
    "mse": "'mean_squared_error'",
    "sparse_categorical_crossentropy": "'softmax_cross_entropy' (of logits and integer labels)",
    "binary_crossentropy": "'sigmoid_binary_cross_entropy' (of logits)",
}


def _array(x: Any) -> str:
    return f"{x.dtype}{list(x.shape)}"


def check_targets(loss: str, outputs: Any, targets: Any, output_name: str) -> None:
    """Checks, when the train step is traced, that the model's output and the targets
    fit the named loss, before the loss itself fails inside optax with an axis number.

    Raises:
      ShapeError: several outputs for a named loss, or shapes that do not fit it,
        naming the graph's output.
      DTypeError: float targets for ``softmax_cross_entropy`` (it takes class ids).
    """
    if isinstance(outputs, tuple):
        raise ShapeError(f"Trainer: the loss {loss!r} takes one model output, and the graph "
                         f"has {len(outputs)}: give a loss function (outputs, targets) -> "
                         f"per-example losses")
    where = (f"Trainer: the loss {loss!r} got the graph's output {output_name!r} "
             f"({_array(outputs)}) and targets {_array(targets)}")
    if loss == "softmax_cross_entropy":
        if outputs.ndim < 1 or tuple(targets.shape) != tuple(outputs.shape[:-1]):
            hint = ""
            if tuple(targets.shape) == tuple(outputs.shape):
                hint = (". The targets are shaped like the output, as one-hot or soft targets "
                        "are: give class ids (targets.argmax(-1)), or the loss that takes "
                        "them: loss=optax.softmax_cross_entropy")
            elif outputs.ndim > 2 and targets.ndim == 1:
                hint = (f". The output has rank {outputs.ndim}: a layer such as Linear "
                        f"contracts only the last axis and keeps the others; flatten or pool "
                        f"before the classifier (ops.Flatten(), ops.GlobalAvgPool())")
            raise ShapeError(f"{where}: it takes integer class ids shaped like the output "
                             f"without its last (class) axis, {list(outputs.shape[:-1])}{hint}")
        if not jnp.issubdtype(targets.dtype, jnp.integer):
            raise DTypeError(f"{where}: it takes integer class ids; for one-hot or soft "
                             f"targets give a loss function")
    elif loss in LOSSES and tuple(targets.shape) != tuple(outputs.shape):
        raise ShapeError(f"{where}: it takes targets of the output's shape "
                         f"{list(outputs.shape)}")


def resolve_loss(loss: str | Objective) -> Objective:
    if callable(loss):
        return loss
    if loss not in LOSSES:
        close = difflib.get_close_matches(str(loss), LOSSES, n=1)
        near = _KERAS_NAMES.get(str(loss).lower()) or (repr(close[0]) if close else "")
        hint = f" (did you mean {near}?)" if near else ""
        raise GraphError(f"unknown loss {loss!r}{hint}; give a function (outputs, targets) -> "
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


def weighted_mean(values: Any, weights: Any, name: str) -> Any:
    """The mean of a loss's or metric's ``values`` with one weight per example (0 for
    a padding row): each example's values (its positions, for a sequence model's
    ``(batch, length)`` losses) weigh its weight, so that all ones give ``jnp.mean``.
    A value already reduced to a scalar is returned as it is."""
    values = jnp.asarray(values)
    weights = jnp.asarray(weights, jnp.float32)
    if values.ndim == 0:
        return values
    if weights.ndim != 1 or weights.shape[0] != values.shape[0]:
        raise ShapeError(f"eval_step: weights has shape {tuple(weights.shape)}; it takes one "
                         f"weight per example, shape ({values.shape[0]},) for the batch whose "
                         f"{name!r} has shape {tuple(values.shape)}")
    each = jnp.broadcast_to(weights.reshape(weights.shape + (1,) * (values.ndim - 1)),
                            values.shape)
    return jnp.sum(values * each) / jnp.maximum(jnp.sum(each), 1.0)


def float32_outputs(outputs: Any) -> Any:
    """The model's outputs with every float one cast to float32, as the loss and the
    metrics get them."""
    return jax.tree.map(lambda o: o.astype(jnp.float32) if jnp.issubdtype(o.dtype, jnp.floating)
                        else o, outputs)


def objective_values(value: Any, what: str, *, loss: bool) -> Any:
    """What a loss or metric function returned, as float32 values (per example, or one).

    Raises:
      GraphError: a dict, tuple or list (a ``(loss, aux)`` pair), no array at all, or
        a loss that is a Python number (a constant).
      DTypeError: complex values, or, for a loss, integer or boolean ones (no
        gradient: nothing would train).
    """
    if isinstance(value, (Mapping, tuple, list)):
        hint = (": return the loss alone; read other outputs with Trainer(capture=...) and "
                "report values with metrics=" if loss else "")
        raise GraphError(f"{what} returned a {type(value).__name__}; it returns per-example "
                         f"values, one array (or one value){hint}")
    if loss and isinstance(value, (bool, int, float, complex, np.number)):
        raise GraphError(f"{what} returned the Python number {value!r}, a constant that does "
                         f"not depend on the outputs, so nothing would train; compute it with "
                         f"jnp from the outputs and targets")
    try:
        value = jnp.asarray(value)
    except TypeError:
        raise GraphError(f"{what} returned {type(value).__name__}; it returns per-example "
                         f"values, one array (or one value)") from None
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise DTypeError(f"{what} returned complex values ({value.dtype}{list(value.shape)}), "
                         f"which have no order to minimise; return a real value, such as "
                         f"jnp.abs(...) or jnp.real(...)")
    if loss and not jnp.issubdtype(value.dtype, jnp.floating):
        raise DTypeError(f"{what} returned {value.dtype} values ({value.dtype}{list(value.shape)}), "
                         f"which have no gradient, so nothing would train; compute it in floats "
                         f"from the outputs (an argmax or a comparison is a metric, not a loss)")
    return value.astype(jnp.float32)


def label_classes(loss: str | None, output_specs: Any) -> int | None:
    """The number of classes whose ids the targets of the named loss must stay below
    (None: nothing to check: another loss, several outputs, a symbolic class count)."""
    if loss != "softmax_cross_entropy" or len(output_specs) != 1 or not output_specs[0].shape:
        return None
    classes = output_specs[0].shape[-1]
    return classes if isinstance(classes, int) else None


#: Integer dtype -> the unsigned one of its size (the ids read in one pass).
_UNSIGNED = {np.dtype(f"{kind}{size}"): np.dtype(f"u{size}") for kind in "iu" for size in (1, 2, 4, 8)}
_largest = np.maximum.reduce


def check_class_ids(targets: np.ndarray, classes: int, output_name: str, what: str) -> None:
    """Class ids outside ``[0, classes)``, which the loss turns into NaN (or, without its
    check, another class's loss): checked on the host, where the targets are.

    Raises:
      ShapeError: naming the id, the classes and the output.
    """
    unsigned = _UNSIGNED.get(targets.dtype)
    if unsigned is None or not targets.size:
        return
    # one pass: read as unsigned, a negative id is larger than any class count
    if _largest(targets.view(unsigned), None) < classes:
        return
    low, high = int(targets.min()), int(targets.max())
    if low >= 0 and high < classes:
        return
    bad = low if low < 0 else high
    hint = (f"; they run from 1 to {classes}: class ids count from 0 (targets - 1)"
            if low == 1 and high == classes else
            "; -100 marks an ignored position in Hugging Face's labels, which the named loss "
            "does not have: give a loss function that masks it" if low == -100 else "")
    raise ShapeError(f"{what} hold class id {bad}, and the graph's output {output_name!r} has "
                     f"{classes} classes: ids must be in [0, {classes}){hint}")
