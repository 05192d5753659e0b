"""The Trainer's arguments written out, and the peers' spellings of them (Keras's
``compile``, Flax's and PyTorch Lightning's habits), for the message of an argument the
Trainer does not take."""

from __future__ import annotations

__all__ = ["TRAINER_SIGNATURE", "TRAINER_HINTS"]

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
