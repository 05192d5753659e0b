"""fit: the common training loop over numpy arrays, with a progress bar, evaluation
each epoch, checkpoints and early stopping.

Batch shapes never change, so the train step traces once: the last partial batch of
each epoch is dropped (the data are reshuffled every epoch, so every example is seen),
and evaluation pads its last batch and gives the padding rows weight 0.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import ConfigError, DTypeError, GraphError, ShapeError
from ..core.signatures import unknown_keywords
from .objectives import check_class_ids, label_classes
from .state import TrainState
from .step_calls import unchecked

__all__ = ["fit", "evaluate", "as_inputs"]


def as_inputs(inputs: Any) -> tuple:
    """A graph's inputs as a tuple: an array, or a tuple or list of arrays."""
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _prepare(trainer, data: Any, what: str) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """(inputs, targets) as numpy arrays in the graph's input dtypes, checked for length."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ShapeError(f"{what} must be a pair (inputs, targets), got {type(data).__name__}")
    inputs, targets = as_inputs(data[0]), np.asarray(data[1])
    specs = trainer.model.graph.input_specs
    if len(inputs) != len(specs):
        raise ShapeError(f"{what}: graph {trainer.model.graph.name!r} takes {len(specs)} "
                         f"inputs, got {len(inputs)}")
    arrays = tuple(_as_input(np.asarray(x), spec, name, what)
                   for x, spec, name in zip(inputs, specs, trainer.model.graph.inputs))
    if not np.issubdtype(targets.dtype, np.number) and targets.dtype != np.bool_:
        raise DTypeError(f"{what}: the targets are {targets.dtype} values; they are numbers "
                         f"(class ids or float targets)")
    if np.issubdtype(targets.dtype, np.integer):
        targets = targets.astype(np.int32)
    elif jnp.issubdtype(targets.dtype, jnp.floating):
        targets = targets.astype(np.float32)
    lengths = {len(a) for a in arrays} | {len(targets)}
    if len(lengths) != 1:
        raise ShapeError(f"{what}: inputs and targets have different numbers of examples "
                         f"({', '.join(str(len(a)) for a in (*arrays, targets))})")
    _check_class_ids(trainer, targets, what)
    return arrays, targets


def _as_input(x: np.ndarray, spec: Any, name: str, what: str) -> np.ndarray:
    """An input array in its graph input's dtype where the train step would take it
    (the same kind: float64 NumPy data for a float32 input, as jax takes it), else the
    train step's DTypeError, before training starts."""
    want = np.dtype(spec.dtype)
    if x.dtype.kind in "biufc" and jax.dtypes.canonicalize_dtype(x.dtype) == want:
        return x.astype(want, copy=False)
    raise DTypeError(f"{what}: input {name!r} is {x.dtype}{list(x.shape)}, and the graph takes "
                     f"{spec} there" + (f": cast it (x.astype({want.name!r})), as train_step "
                                        f"takes it only so" if x.dtype.kind in "fiub" else ""))


def _check_class_ids(trainer, targets: np.ndarray, what: str) -> None:
    """Class ids outside the output's classes: checked once, on the host, before training."""
    classes = label_classes(trainer._loss_name, trainer.model.graph.output_specs)
    if classes is not None:
        check_class_ids(targets, classes, trainer._output_name, f"{what}: the targets")


def _take(inputs: tuple[np.ndarray, ...], index: np.ndarray):
    taken = tuple(x[index] for x in inputs)
    return taken if len(taken) > 1 else taken[0]


def _progress_bar():
    """tqdm's notebook widget when ipywidgets is there, else its text bar (tqdm.auto
    would warn in a notebook without ipywidgets)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm


def _shown(metrics: dict) -> dict[str, str]:
    return {name: f"{float(v):.4f}" for name, v in metrics.items() if name != "loss_scale"}


def evaluate(trainer, ts: TrainState, data: tuple, batch_size: int) -> dict[str, float]:
    """The loss and metrics over all of ``data = (inputs, targets)`` in inference mode,
    in fixed-size batches (the last one padded; padding rows weigh 0)."""
    inputs, targets = _prepare(trainer, data, "evaluation data")
    n = len(targets)
    if n == 0:
        raise ShapeError("evaluation data is empty")
    sums: dict[str, Any] = {}
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size)
        valid = index < n
        index = np.where(valid, index, 0)
        metrics = unchecked(trainer.eval_step)(ts, _take(inputs, index), targets[index],
                                               valid.astype(np.float32))
        count = float(valid.sum())
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + value * count
    return {name: float(total) / n for name, total in sums.items()}


_FIT_SIGNATURE = ("fit(ts, train, epochs, batch_size, initial_epoch=None, validation=None, "
                  "shuffle=True, seed=0, steps_per_dispatch=1, checkpoints=None, patience=None, "
                  "progress=True)")
#: Keras's ``Model.fit`` spellings of fit's arguments.
_KERAS_FIT_NAMES = {
    "validation_data": "Keras's validation_data is validation=",
    "verbose": "Keras's verbose is progress=",
    "steps_per_execution": "Keras's steps_per_execution is steps_per_dispatch=",
    "callbacks": "fit takes checkpoints= (an mg.train.CheckpointManager) and patience= "
                 "where Keras takes ModelCheckpoint and EarlyStopping callbacks",
    "validation_split": "fit takes validation=(inputs, targets): split the arrays first"}


def fit(trainer, ts: TrainState, train: tuple | None = None, *more: Any, epochs: Any = None,
        batch_size: Any = None, initial_epoch: int | None = None,
        validation: tuple | None = None, shuffle: bool = True, seed: int = 0,
        steps_per_dispatch: int = 1, checkpoints=None, patience: int | None = None,
        progress: bool = True, **unknown: Any) -> tuple[TrainState, dict[str, list[float]]]:
    """Trains ``ts`` over ``train = (inputs, targets)``: ``epochs`` more epochs, or, with
    ``initial_epoch``, from that epoch up to epoch ``epochs`` (Keras's meaning of both).

    Epochs are counted by the state: a state that has made ``s`` steps has done
    ``ceil(s / steps_per_epoch)`` epochs (``steps_per_epoch = len(targets) //
    batch_size``), so ``fit(ts, data, epochs=3)`` after 21 steps of 7 per epoch runs
    epochs 4, 5 and 6, and a second call 3 more.

    Args:
      trainer: the ``mg.train.Trainer``.
      ts: the TrainState to start from (fresh, or restored from a checkpoint: the loop
        continues from ``ts.step``, at the same batch it would have reached).
      train: numpy inputs (an array, or a tuple for several graph inputs) and targets.
      epochs: the number of epochs to run now; with ``initial_epoch``, the epoch to
        stop after (Keras's "final epoch").
      batch_size: examples per step; the last partial batch of an epoch is dropped.
      initial_epoch: resume: run epochs ``initial_epoch + 1 .. epochs``; when ``ts``
        stopped inside epoch ``initial_epoch + 1`` (a checkpoint restored:
        ``initial_epoch = int(ts.step) // steps_per_epoch``), it continues at the batch
        it had reached. Nothing to do (``initial_epoch >= epochs``) is a warning.
      validation: ``(inputs, targets)`` evaluated after each epoch, in inference mode.
      shuffle: visit the examples of each epoch in a new order: epoch ``e`` in the
        order of ``np.random.default_rng([seed, e]).permutation``.
      seed: the seed of that order.
      steps_per_dispatch: ``k > 1`` runs ``k`` steps per call of the fused
        ``train_steps`` (fewer Python dispatches for small models); same results.
      checkpoints: an ``mg.train.CheckpointManager``; the state is saved after each epoch.
      patience: stop when the monitored loss (``val_loss``, or ``loss`` without
        validation) has not improved for this many epochs.
      progress: show a tqdm progress bar with the loss and metrics.

    Returns:
      ``(ts, history)``: the final state and, per epoch, the mean train metrics and
      ``val_``-prefixed validation metrics (``history["epoch"]`` counts from 1).
    """
    if unknown:  # before the required ones: a misspelt batch_size is named as such
        raise GraphError(unknown_keywords("fit", unknown, _FIT_SIGNATURE, _KERAS_FIT_NAMES))
    if not isinstance(ts, TrainState):  # Keras's fit(x, y) or fit((x, y)), the state left out
        raise GraphError(f"fit trains a train state: trainer.fit(ts, (inputs, targets), ...), "
                         f"ts from trainer.init(key) (or a checkpoint), got "
                         f"{type(ts).__name__} first")
    if more:  # Keras's fit(x, y, ...) after the state
        raise GraphError(f"fit takes the training data as one pair: trainer.fit(ts, (inputs, "
                         f"targets), epochs=..., batch_size=...), got {len(more) + 1} positional "
                         f"arguments after ts (Keras's fit(x, y) is fit(ts, (x, y)))")
    missing = [name for name, given in (("epochs", epochs), ("batch_size", batch_size)) if given is None]
    if missing:
        raise GraphError(f"fit needs {' and '.join(missing)}: {_FIT_SIGNATURE}")
    tqdm = _progress_bar()
    inputs, targets = _prepare(trainer, train, "training data")
    if validation is not None:  # checked now, not after the first epoch's training
        _prepare(trainer, validation, "validation data")
    n = len(targets)
    for argument, given in (("batch_size", batch_size), ("steps_per_dispatch", steps_per_dispatch)):
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < 1:
            raise ConfigError(f"fit: {argument} is an int >= 1, got {given!r}")
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise ShapeError(f"batch_size={batch_size} does not fit the {n} training examples")
    k = int(steps_per_dispatch)
    train_step, train_steps = unchecked(trainer.train_step), unchecked(trainer.train_steps)
    history: dict[str, list[float]] = {"epoch": []}
    best, stale = math.inf, 0
    step = int(ts.step)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigError(f"fit: epochs is an int >= 0, got {epochs!r}")
    if initial_epoch is None:
        start = -(-step // per_epoch)  # the epochs ts has done, a partial one counted
        step, stop = max(step, start * per_epoch), start + epochs
    else:
        if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
            raise ConfigError(f"fit: initial_epoch is an int >= 0, got {initial_epoch!r}")
        start, stop = initial_epoch, epochs
        if not initial_epoch * per_epoch <= step < (initial_epoch + 1) * per_epoch:
            step = initial_epoch * per_epoch  # the state is not inside that epoch: start it
        if initial_epoch >= epochs:
            warnings.warn(f"fit(epochs={epochs}, initial_epoch={initial_epoch}) has nothing to do: "
                          f"epochs is the epoch to stop after when initial_epoch is given (Keras's "
                          f"meaning); without initial_epoch, epochs counts the epochs to run now",
                          UserWarning, stacklevel=3)
    for epoch in range(start, stop):
        order = (np.random.default_rng([seed, epoch]).permutation(n) if shuffle
                 else np.arange(n))[: per_epoch * batch_size].reshape(per_epoch, batch_size)
        first = step - epoch * per_epoch
        bar = tqdm(total=per_epoch, initial=first, desc=f"epoch {epoch + 1}/{stop}",
                   unit="step", disable=not progress, leave=True, dynamic_ncols=True)
        collected = []
        every = max(1, per_epoch // 10)
        i = first
        while i < per_epoch:
            if k > 1 and i + k <= per_epoch:
                index = order[i:i + k]
                ts, metrics = train_steps(ts, _take(inputs, index), targets[index])
                collected.append(metrics)
                i += k
                bar.update(k)
            else:
                index = order[i]
                ts, metrics = train_step(ts, _take(inputs, index), targets[index])
                collected.append(jax.tree.map(lambda v: v[None], metrics))
                i += 1
                bar.update(1)
            if progress and (i % every < k or i == per_epoch):
                bar.set_postfix(_shown({name: v[-1] for name, v in collected[-1].items()}))
        step = epoch * per_epoch + per_epoch
        epoch_metrics = {name: float(jnp.mean(jnp.concatenate([m[name] for m in collected])))
                         for name in collected[0]} if collected else {}
        if validation is not None:
            val = evaluate(trainer, ts, validation, batch_size)
            epoch_metrics.update({f"val_{name}": value for name, value in val.items()})
        bar.set_postfix(_shown(epoch_metrics))
        bar.close()
        history["epoch"].append(epoch + 1)
        for name, value in epoch_metrics.items():
            history.setdefault(name, []).append(value)
        if checkpoints is not None:
            checkpoints.save(ts)
        if patience is not None:
            monitored = epoch_metrics.get("val_loss", epoch_metrics.get("loss", math.inf))
            if monitored < best:
                best, stale = monitored, 0
            else:
                stale += 1
                if stale >= patience:
                    break
    return ts, history
