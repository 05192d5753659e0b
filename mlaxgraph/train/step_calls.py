"""The calls of a Trainer's jitted steps, checked: on the host before each dispatch
(a train state first, the arguments the step takes, class ids of targets held in a
NumPy array), and once per trace (an optimizer state of this optimizer, stacked
batches for ``train_steps``). Targets on a device are not read back to be checked:
the named cross-entropy gives NaN for an id outside the classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..core.errors import GraphError, ShapeError
from ..core.signatures import unknown_keywords
from .objectives import check_class_ids
from .state import TrainState

__all__ = ["CheckedStep", "unchecked", "check_optimizer_state", "check_stacked"]

_MISSING: Any = object()
_NDARRAY = np.ndarray
_RNG_HINT = ("the step draws its dropout keys from the train state (step n: fold_in(key, "
             "n), key from trainer.init(key))")


class CheckedStep:
    """A jitted step (``TopLevelJit`` or ``FrozenStep``) whose call is checked first;
    ``lower``, ``trace`` and the rest are the step's own."""

    __slots__ = ("_step", "_name", "_classes", "_output", "_takes", "_keywords", "_what",
                 "_first", "_after")

    def __init__(self, step: Any, name: str, classes: int | None, output_name: str):
        self._step = step
        # a TopLevelJit's own jit, called here directly (one Python frame fewer per step)
        self._first = getattr(step, "first_try", step)
        self._after = getattr(step, "after_failure", None)
        self._name = name
        self._classes = classes  # None: the targets are not class ids of the named loss
        self._output = output_name
        self._what = f"{name}: the targets"
        evaluates = name == "eval_step"
        self._keywords = ("weights",) if evaluates else ()
        self._takes = (f"{name}(ts, inputs, targets" + (", weights=None)" if evaluates else ")"))

    def __call__(self, ts: Any, inputs: Any = _MISSING, targets: Any = _MISSING, *more: Any,
                 **kwargs: Any) -> Any:
        if more or kwargs or type(ts) is not TrainState or targets is _MISSING:  # rare: checked
            args = tuple(a for a in (inputs, targets) if a is not _MISSING) + more
            self._check_call(ts, args, kwargs)
            if type(args[1]) is _NDARRAY and self._classes is not None:
                check_class_ids(args[1], self._classes, self._output, self._what)
            return self._step(ts, *args, **kwargs)
        if type(targets) is _NDARRAY and self._classes is not None:
            check_class_ids(targets, self._classes, self._output, self._what)
        try:
            return self._first(ts, inputs, targets)
        except (ValueError, RuntimeError) as e:
            if self._after is None:
                raise
            return self._after(e, (ts, inputs, targets), {})

    def _check_call(self, ts: Any, args: tuple, kwargs: dict) -> None:
        unknown = {k: v for k, v in kwargs.items() if k not in self._keywords}
        if unknown:
            raise GraphError(unknown_keywords(self._name, unknown, self._takes, {"rng": _RNG_HINT}))
        if not isinstance(ts, TrainState):
            where = next((i for i, a in enumerate(args) if isinstance(a, TrainState)), None)
            moved = (f"; the train state is argument {where + 2}: give it first" if where is not None
                     else "; ts comes from trainer.init(key) or a checkpoint")
            raise GraphError(f"{self._name} takes {self._takes}: a TrainState first, got "
                             f"{type(ts).__name__}{moved}")
        most = 2 + len(self._keywords) - len(kwargs)
        if not 2 <= len(args) <= most:  # (eval_step's weights may come third)
            raise GraphError(f"{self._name} takes {self._takes}, got {len(args)} arguments after "
                             f"ts; a graph with several inputs takes them as one tuple: "
                             f"{self._name}(ts, (x1, x2), targets)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in CheckedStep.__slots__:  # unset (copy, unpickle)
            raise AttributeError(name)
        return getattr(self._step, name)


def unchecked(step: Any) -> Any:
    """The jitted step itself, for a caller that has checked its data already (``fit``
    checks every class id once, before training)."""
    return step._step if isinstance(step, CheckedStep) else step


def check_optimizer_state(name: str, init: Callable, trained: Any, opt_state: Any) -> None:
    """At trace time: ``opt_state`` is this optimizer's state of these weights (the
    same tree), not another optimizer's (a checkpoint of another run)."""
    want: Any = jax.tree.structure(jax.eval_shape(init, trained))
    if jax.tree.structure(opt_state) != want:
        def kinds(tree):
            leaves = jax.tree.leaves(tree, is_leaf=lambda x: x is not tree and hasattr(x, "_fields"))
            return ", ".join(dict.fromkeys(type(x).__name__ for x in leaves
                                           if hasattr(x, "_fields"))) or "nothing"

        raise GraphError(
            f"{name}: ts.opt_state is not this Trainer's optimizer state: it holds "
            f"{kinds(opt_state)} where this optimizer keeps {kinds(jax.eval_shape(init, trained))}; "
            f"the train state comes from another optimizer (or another trainable=): start "
            f"from this trainer's init(key), or restore into its template")


def check_stacked(inputs: tuple, specs: Any) -> None:
    """At trace time: ``train_steps``'s inputs carry a leading steps axis before the
    graph's own dims."""
    for x, spec in zip(inputs, specs):
        if np.ndim(x) == spec.rank:
            raise ShapeError(
                f"train_steps runs k steps on batches stacked on a leading steps axis, and "
                f"input {spec} got {getattr(x, 'dtype', '')}{list(np.shape(x))}, one batch: "
                f"stack k batches (xs.reshape(k, batch, ...), and the targets likewise) or "
                f"call train_step")
