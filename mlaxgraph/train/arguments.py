"""The Trainer's arguments written out, and the peers' spellings of them (Keras's
``compile``, Flax's and PyTorch Lightning's habits), for the message of an argument the
Trainer does not take; the checks of its loss function and loss scale."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..core.signatures import call_problem
from .loss_scale import DynamicLossScale

__all__ = ["TRAINER_SIGNATURE", "TRAINER_HINTS", "check_loss_signature", "initial_loss_scale"]

TRAINER_SIGNATURE = ("Trainer(model, optimizer, loss='softmax_cross_entropy', metrics=None, "
                     "loss_scale='auto', capture=None, intervene=None, trainable=None, "
                     "compiler_options=None, loss_chunk=None)")

_OPTIMIZER = "the learning rate is the optimizer's: optax.adam(learning_rate)"
_FIT = "{} is fit's: trainer.fit(ts, (inputs, targets), {}=...)"

#: name -> where the argument belongs.
TRAINER_HINTS = {
    "learning_rate": _OPTIMIZER, "lr": _OPTIMIZER,
    **{k: _FIT.format(k, k) for k in ("epochs", "batch_size", "shuffle", "patience")},
    "validation_data": "Keras's validation_data is fit's validation=",
    "frozen": "trainable= names the weights that train, the others frozen",
    "jit_compile": "the train step is always one jitted XLA program",
}


def check_loss_signature(loss: Callable, captures: bool) -> None:
    """A loss function takes ``(outputs, targets)``, or ``(outputs, targets, captured)``
    with ``capture=``."""
    if captures:
        form = "loss(outputs, targets, captured) -> per-example losses (with capture=...)"
        problem = call_problem(loss, 3)
    else:
        form = "loss(outputs, targets) -> per-example losses"
        problem = call_problem(loss, 2)
        if problem is not None and call_problem(loss, 3) is None:
            form += "; a loss reading captured outputs needs Trainer(capture=...)"
    if problem is not None:
        raise GraphError(f"Trainer(loss=...): the loss is called as {form}, and {problem}")


def initial_loss_scale(loss_scale: Any, policy: Any) -> DynamicLossScale | None:
    """``loss_scale=``: ``"auto"`` (dynamic under a float16 policy), ``"dynamic"``, None
    or a ``DynamicLossScale`` to start from."""
    if isinstance(loss_scale, DynamicLossScale) or loss_scale is None:
        return loss_scale
    if loss_scale == "dynamic":
        return DynamicLossScale.create()
    if loss_scale == "auto":
        half = policy is not None and policy.compute_dtype == np.dtype("float16")
        return DynamicLossScale.create() if half else None
    raise GraphError(f"loss_scale must be 'auto', 'dynamic', None or a DynamicLossScale, "
                     f"got {loss_scale!r}")
