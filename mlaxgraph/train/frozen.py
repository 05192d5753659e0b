"""The train step of a model with frozen weights: the step donates what it replaces
(the weights that train, the optimizer state, the counters) and passes the frozen
weights and the model's state in without donating them.

A frozen weight is often not the Trainer's own: ``init(key, reuse=(params, state))``
hands back the base model's very arrays, so donating them would delete the base
model's weights. Nor does the step return them: an output that is an input not
donated is a copy, so the frozen weights are put back into the new train state in
Python, the very arrays given. The model's state (BatchNorm statistics) is not
donated either: it too may be the base model's, and it is small.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..compiler.xla_options import TopLevelJit
from ..core.donated import reraise_deleted
from .state import TrainState

__all__ = ["FrozenStep", "given_arrays"]


def _path(keys: tuple) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in keys)


def _merge(mask: tuple[bool, ...], trained: list, frozen: list) -> list:
    """The params' leaves in order: the trained ones where ``mask`` is set, else the frozen."""
    trained_leaves, frozen_leaves = iter(trained), iter(frozen)
    return [next(trained_leaves) if m else next(frozen_leaves) for m in mask]


class FrozenStep:
    """``step(ts, inputs, targets) -> (ts, metrics)`` of a pure ``fn`` with the same
    signature, jitted so that only the trained part of ``ts`` is donated (see the
    module's docstring). ``lower`` and ``trace`` take the step's own arguments, and
    ``lower(...).compile()`` is called as the step is: ``compiled(ts, inputs,
    targets)``."""

    def __init__(self, fn: Callable, trainable: frozenset[str],
                 compiler_options: dict[str, Any] | None = None, name: str = "train_step"):
        self._fn, self._name = fn, name
        self._trainable = trainable
        self._masks: dict[Any, tuple[bool, ...]] = {}
        self._jitted = TopLevelJit(self._inner, compiler_options, static_argnums=(0, 1),
                                   donate_argnums=(4,))

    def _mask(self, params: Any, treedef: Any) -> tuple[bool, ...]:
        mask = self._masks.get(treedef)
        if mask is None:
            paths = [_path(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
            mask = self._masks[treedef] = tuple(p in self._trainable for p in paths)
        return mask

    def _inner(self, treedef: Any, mask: tuple[bool, ...], frozen: list, state: Any,
               rest: TrainState, *args: Any):
        ts = rest.replace(params=jax.tree.unflatten(treedef, _merge(mask, rest.params, frozen)),
                          state=state)
        new, metrics = self._fn(ts, *args)
        out = jax.tree.leaves(new.params)
        return new.replace(params=[x for x, m in zip(out, mask) if m]), metrics

    def _split(self, ts: TrainState, args: tuple) -> tuple:
        leaves, treedef = jax.tree.flatten(ts.params)
        mask = self._mask(ts.params, treedef)
        frozen = [x for x, m in zip(leaves, mask) if not m]
        rest = ts.replace(params=[x for x, m in zip(leaves, mask) if m], state=None)
        return (treedef, mask, frozen, ts.state, rest, *args), frozen

    def _run(self, program: Callable, ts: TrainState, args: tuple, static: bool):
        """``program`` (the jit, or a compiled one, which takes no static arguments)
        called on ``ts`` split, and its train state merged back."""
        arguments, frozen = self._split(ts, args)
        treedef, mask = arguments[0], arguments[1]
        new, metrics = program(*(arguments if static else arguments[2:]))
        return new.replace(params=jax.tree.unflatten(treedef, _merge(mask, new.params, frozen))), metrics

    def __call__(self, ts: TrainState, *args: Any):
        try:
            return self._run(self._jitted, ts, args, static=True)
        except (ValueError, RuntimeError) as e:
            reraise_deleted(e, self._name, ts=ts)
            raise

    def lower(self, ts: TrainState, *args: Any) -> _Lowered:
        return _Lowered(self, self._jitted.lower(*self._split(ts, args)[0]))

    def trace(self, ts: TrainState, *args: Any) -> _Traced:
        return _Traced(self, self._jitted.trace(*self._split(ts, args)[0]))


class _Wrapped:
    """jax's AOT object of the step's inner program: every attribute is its."""

    def __init__(self, step: FrozenStep, wrapped: Any):
        self._step, self._wrapped = step, wrapped

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_step", "_wrapped"):  # copy, pickle: not set yet
            raise AttributeError(name)
        return getattr(self._wrapped, name)


class _Traced(_Wrapped):
    """``FrozenStep.trace``'s result: jax's ``Traced`` (``jaxpr`` ...), whose ``lower()``
    is ``FrozenStep.lower``'s."""

    def lower(self, *args: Any, **kwargs: Any) -> _Lowered:
        return _Lowered(self._step, self._wrapped.lower(*args, **kwargs))


class _Lowered(_Wrapped):
    """``FrozenStep.lower``'s result: jax's ``Lowered`` (``as_text``, ``compiler_ir``,
    ``cost_analysis`` ...), whose ``compile()`` is called as the step is."""

    def compile(self, *args: Any, **kwargs: Any) -> _Compiled:
        return _Compiled(self._step, self._wrapped.compile(*args, **kwargs))


class _Compiled(_Wrapped):
    """jax's ``Compiled`` (``memory_analysis``, ``as_text`` ...), called as the step is:
    ``compiled(ts, inputs, targets) -> (ts, metrics)``."""

    def __call__(self, ts: TrainState, *args: Any):
        return self._step._run(self._wrapped, ts, args, static=False)


def given_arrays(params: Any, given: Any) -> Any:
    """``params`` with each weight that ``given`` has at the same path, shape and dtype
    taken from it: the very array given, not a slice of the stack made of it."""
    if not isinstance(params, Mapping):
        same = (isinstance(given, jax.Array) and given.shape == params.shape
                and given.dtype == params.dtype)
        return given if same else params
    if not isinstance(given, Mapping):
        return params
    return {k: given_arrays(v, given[k]) if k in given else v for k, v in params.items()}
