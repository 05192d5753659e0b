"""Intervention functions as ``apply``'s compiled functions see them: code and what it
reads, split into what decides the compiled function and the numbers passed to it.

``apply(..., intervene={path: fn})`` keeps one jitted function per set of taps. Keyed
by the function object, a function reused after a value it reads changed would give
the old result (the value was baked in when first traced), and a fresh
``lambda v: v * a`` per call would compile again every call. Instead a plain Python
function is keyed by its code and the values it reads directly: its closure, its
defaults and the module globals it names (``functools.partial``: its arguments).
Among those values, floats and arrays (also inside dicts, lists and tuples) are
passed to the compiled function as traced arguments, read at every call; the others
(ints, strings, bools, functions, modules, objects) are part of the key, so a new one
compiles anew. A function whose Python control flow needs a float's value (``if a >
0.5``) is traced again with its floats as constants (``concrete``), keyed by value.
Values read through other functions or objects' attributes are read when first
traced; callables other than Python functions (``np.negative``, objects with
``__call__``) are keyed by identity.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

__all__ = ["TapFunction", "tap_function"]

_EMPTY = object()  # an empty closure cell


@dataclasses.dataclass(frozen=True, eq=False)
class TapFunction:
    """``fn`` split: ``key`` decides the compiled function, ``values`` (floats and
    arrays) are its traced arguments, ``rebuild(values)`` is ``fn`` reading them."""

    fn: Callable
    key: Hashable
    values: tuple
    rebuild: Callable[[tuple], Callable]


class _Same:
    """A key part compared by identity (functions, modules, objects; jax arrays when
    kept as constants)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _lifted(leaf: Any, concrete: bool) -> bool:
    if isinstance(leaf, (bool, np.bool_)):
        return False
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return not concrete or isinstance(leaf, jax.core.Tracer)
    return not concrete and isinstance(leaf, (float, complex, np.floating, np.complexfloating))


def _static(leaf: Any) -> Hashable:
    if leaf is None or isinstance(leaf, (bool, int, float, complex, str, bytes, np.generic)):
        return (type(leaf), leaf)
    if isinstance(leaf, (dict, list, tuple)):
        return _split(leaf, True)[0]  # a dict key that is a tuple
    if isinstance(leaf, np.ndarray):
        return (np.ndarray, leaf.shape, leaf.dtype.str, leaf.tobytes())
    return _Same(leaf)


def _global_names(code: types.CodeType) -> list[str]:
    """The module globals ``code`` (and the code nested in it) names."""
    names = [i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return list(dict.fromkeys(names))


def _environment(fn: Any) -> tuple[Hashable, Any, Callable[[Any], Callable]] | None:
    """(what identifies the code, the values it reads, a function of new values
    giving the function reading them), or None for a callable keyed by identity."""
    if isinstance(fn, functools.partial):
        inner = _environment(fn.func)
        head: Hashable = _Same(fn.func) if inner is None else inner[0]
        inner_env = None if inner is None else inner[1]

        def partial(env: Any) -> Callable:
            func = fn.func if inner is None else inner[2](env[0])
            return functools.partial(func, *env[1], **env[2])

        return ("partial", head), (inner_env, fn.args, dict(fn.keywords)), partial
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    cells = tuple(_cell(c) for c in fn.__closure__ or ())
    names = [n for n in _global_names(code) if n in fn.__globals__]
    env = (cells, fn.__defaults__, fn.__kwdefaults__, {n: fn.__globals__[n] for n in names})

    def function(new: Any) -> Callable:
        new_cells, defaults, kwdefaults, globals_ = new
        scope = fn.__globals__
        if any(globals_[n] is not fn.__globals__[n] for n in names):
            scope = {**fn.__globals__, **globals_}  # the numbers it reads, traced
        closure = tuple(types.CellType() if v is _EMPTY else types.CellType(v) for v in new_cells)
        made = types.FunctionType(code, scope, fn.__name__, defaults, closure or None)
        made.__kwdefaults__ = kwdefaults
        return made

    return _Same(code), env, function


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _split(value: Any, concrete: bool) -> tuple[Hashable, list, Callable[[Any], Any]]:
    """(key, the floats and arrays inside ``value``, a function of an iterator over new
    ones giving ``value`` with them). Dicts, lists and tuples holding none are kept as
    they are (the very object: a list the function appends to stays the caller's)."""
    if _lifted(value, concrete):
        return "traced", [value], lambda it: next(it)
    if type(value) in (dict, list, tuple) or (isinstance(value, tuple) and hasattr(value, "_fields")):
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        items = [value[k] for k in keys]
        parts = [_split(item, concrete) for item in items]
        leaves = [leaf for _, found, _ in parts for leaf in found]
        key: Hashable = (type(value), tuple(_static(k) for k in keys) if isinstance(value, dict)
                         else len(keys), tuple(k for k, _, _ in parts))
        if not leaves:
            return key, [], lambda it: value

        def rebuild(it: Any) -> Any:
            new = [make(it) for _, _, make in parts]
            if isinstance(value, dict):
                return dict(zip(keys, new))
            if isinstance(value, list):
                return new
            return type(value)(*new) if hasattr(value, "_fields") else tuple(new)

        return key, leaves, rebuild
    return _static(value), [], lambda it: value


def tap_function(fn: Callable, concrete: bool = False) -> TapFunction:
    """``fn`` split into its key and traced values; ``concrete`` keeps floats as
    constants (keyed by value) for code whose Python control flow reads them."""
    found = _environment(fn)
    if found is None:
        return TapFunction(fn, _Same(fn), (), lambda values: fn)
    head, env, make = found
    try:
        key, leaves, rebuild_env = _split(env, concrete)
        hash(key)
    except TypeError:  # a value that cannot be a key: the function by identity
        return TapFunction(fn, _Same(fn), (), lambda values: fn)

    def rebuild(new: tuple) -> Callable:
        return make(rebuild_env(iter(new)))

    return TapFunction(fn, (head, concrete, key), tuple(leaves), rebuild)
