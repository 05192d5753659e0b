"""The compiled model's ``init`` and ``apply``: the jitted functions behind the
keywords users pass (``reuse=``, ``capture=``, ``intervene=``), each checked by name.

``apply`` without taps is the plain jitted function; with ``capture`` or ``intervene``
it is another jitted function, made once per set of taps and kept: the patterns and
each function's code are static, the floats and arrays the functions read are traced
arguments (``mlaxgraph.compiler.tap_functions``), so a function reused after a value
it reads changed sees the new value, and a sweep does not compile again. ``init(key, reuse=(params,
state))`` draws every weight, then keeps each one ``reuse`` has at the same path with
the same shape and dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..core.errors import GraphError
from .program import leaf_paths
from .taps import Taps

__all__ = ["model_apply", "ModelInit", "ReuseReport", "reuse_report"]

_PLAIN = frozenset(("rng", "inference_mode"))
_APPLY_SIGNATURE = ("apply(params, state, *inputs, rng=None, inference_mode=False, "
                    "capture=None, intervene=None)")


#: The jitted function's attributes the model's ``apply`` passes on (``apply.lower(...)``).
_JIT_ATTRIBUTES = ("lower", "trace", "eval_shape", "_cache_size", "clear_cache")


def model_apply(plain: Callable, make: Callable[[Taps, tuple], Callable]) -> Callable:
    """``apply(params, state, *inputs, rng=None, inference_mode=False, capture=None,
    intervene=None)``: ``(outputs, new_state)``, or ``(outputs, new_state, captured)``
    with ``capture``. A plain function (not a bound method: it is on every call's path)
    carrying the jitted function's ``lower``, ``trace`` and ``eval_shape``."""
    # by the taps' key: patterns, and each function's code and the values it reads
    # other than floats and arrays (mlaxgraph.compiler.tap_functions)
    tapped: dict[Any, Callable] = {}
    concrete: set = set()

    def tapped_call(params, state, *inputs, rng=None, inference_mode: bool = False,
                    capture: Any = None, intervene: Any = None, **unknown: Any):
        if unknown:
            raise GraphError(f"apply got unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; it takes {_APPLY_SIGNATURE}")
        taps = Taps.of(capture, intervene)
        if taps is None:
            return plain(params, state, *inputs, rng=rng, inference_mode=inference_mode)
        functions = taps.functions()
        key = taps.key(functions)
        if key in concrete:  # Python control flow on a float it reads: floats as constants
            functions = taps.functions(concrete=True)
            key = taps.key(functions)
        values = tuple(f.values for f in functions)
        fn = tapped.get(key)
        if fn is None:
            fn = tapped[key] = make(taps, functions)
        try:
            result = fn(params, state, *inputs, tap_values=values, rng=rng,
                        inference_mode=inference_mode)
        except jax.errors.ConcretizationTypeError:
            if not any(values):
                raise
            concrete.add(key)
            return tapped_call(params, state, *inputs, rng=rng, inference_mode=inference_mode,
                               capture=capture, intervene=intervene)
        outputs, new_state, captured = result
        if not taps.capture:
            return outputs, new_state
        return outputs, new_state, captured

    def apply(params, state, *inputs, **keywords: Any):
        # The plain call goes straight to the jitted function after one test of its
        # keywords.
        if keywords.keys() <= _PLAIN:
            return plain(params, state, *inputs, **keywords)
        return tapped_call(params, state, *inputs, **keywords)

    for name in _JIT_ATTRIBUTES:
        if hasattr(plain, name):
            setattr(apply, name, getattr(plain, name))
    apply._plain = plain  # type: ignore[attr-defined]  # the jitted function, for benchmarks
    apply.__doc__ = model_apply.__doc__
    return apply


@dataclasses.dataclass(frozen=True)
class ReuseReport:
    """What ``init(key, reuse=...)`` keeps: weight paths (``h.0/attn/qkv/kernel``;
    state entries under ``state/``) kept from ``reuse``, drawn new (absent there, or
    of another shape or dtype: ``changed`` lists those), and in ``reuse`` but not in
    the model (dropped)."""

    kept: tuple[str, ...]
    new: tuple[str, ...]
    changed: tuple[str, ...]
    dropped: tuple[str, ...]

    def __str__(self) -> str:
        lines = [f"kept {len(self.kept)}, new {len(self.new)} ({len(self.changed)} of another "
                 f"shape or dtype), dropped {len(self.dropped)}"]
        for label, paths in (("new", self.new), ("dropped", self.dropped)):
            for path in paths:
                mark = " (shape or dtype changed)" if path in self.changed else ""
                lines.append(f"  {label}: {path}{mark}")
        return "\n".join(lines)


def _same(a: Any, b: Any) -> bool:
    return (tuple(getattr(a, "shape", ())) == tuple(getattr(b, "shape", ()))
            and np.dtype(getattr(a, "dtype", None)) == np.dtype(getattr(b, "dtype", None)))


def _check_reuse(reuse: Any) -> tuple[Mapping, Mapping]:
    if (not isinstance(reuse, (tuple, list)) or len(reuse) != 2
            or not all(isinstance(t, Mapping) for t in reuse)):
        raise GraphError(f"reuse takes (params, state) as init or mg.load gave them, got "
                         f"{type(reuse).__name__}")
    return reuse[0], reuse[1]


def reuse_report(fresh: tuple[Any, Any], reuse: Any) -> ReuseReport:
    """Compares the weights a model draws (arrays or shape structs) with ``reuse``."""
    params, state = _check_reuse(reuse)
    kept: list[str] = []
    new: list[str] = []
    changed: list[str] = []
    dropped: list[str] = []
    for prefix, mine, theirs in (("", fresh[0], params), ("state/", fresh[1], state)):
        ours, old = leaf_paths(mine), leaf_paths(theirs)
        for path, leaf in ours.items():
            if path in old and _same(leaf, old[path]):
                kept.append(prefix + path)
            else:
                new.append(prefix + path)
                if path in old:
                    changed.append(prefix + path)
        dropped.extend(prefix + path for path in old if path not in ours)
    return ReuseReport(tuple(kept), tuple(new), tuple(changed), tuple(dropped))


def _merge(fresh: Any, old: Any) -> Any:
    if isinstance(fresh, Mapping):
        old_map = old if isinstance(old, Mapping) else {}
        return {key: _merge(value, old_map.get(key)) for key, value in fresh.items()}
    if old is not None and not isinstance(old, Mapping) and _same(fresh, old):
        sharding = getattr(fresh, "sharding", None)
        if sharding is not None and getattr(old, "sharding", None) != sharding:
            return jax.device_put(old, sharding)  # where this model keeps the weight
        return old
    return fresh


class ModelInit:
    """``init(key, reuse=None) -> (params, state)``: with ``reuse=(params, state)``,
    every weight whose path, shape and dtype are unchanged is taken from it (the very
    arrays), the others drawn as ``init`` draws them. The plain jitted function's
    attributes (``lower``, ``trace``) are its own."""

    def __init__(self, plain: Callable, pure: Callable):
        self._plain = plain
        self._pure = pure  # the function before jit: inside a transformation (eval_shape)

    def __call__(self, key: jax.Array, reuse: Any = None, **unknown: Any):
        if unknown:
            raise GraphError(f"init got unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; it takes init(key, reuse=None)")
        # init is compiled with its own XLA options, which only a top-level jit takes.
        traced = isinstance(key, jax.core.Tracer)
        params, state = (self._pure if traced else self._plain)(key)
        if reuse is None:
            return params, state
        old_params, old_state = _check_reuse(reuse)
        return _merge(params, old_params), _merge(state, old_state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plain, name)
