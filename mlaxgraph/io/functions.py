"""The function registry: stable names for the Python functions a graph refers to.

A graph holds functions in a few places: initializers (``Linear(kernel_init=...)``) and
the user function of ``ops.F``. A file cannot hold a function, only a name, so a graph
with functions can be written only when each is registered here under a name, and a
file is read back by looking each name up here. Loading never imports a module, reads
an attribute by a name from the file or unpickles anything: a name that is not
registered is an error.

mlaxgraph's own initializers are registered under ``mlaxgraph.<module>.<function>``.

Example:
  >>> import jax.numpy as jnp
  >>> from mlaxgraph.io.functions import register_function, function_name, lookup_function
  >>> @register_function("docs.double")
  ... def double(x):
  ...     return 2 * x
  >>> function_name(double), lookup_function("docs.double") is double
  ('docs.double', True)
  >>> function_name(jnp.sin) is None
  True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar, overload

from ..core.errors import SerializationError
from ..ops import attention, embedding, initializers, recurrent

__all__ = ["register_function", "function_name", "lookup_function", "registered_functions"]

F = TypeVar("F", bound=Callable)

#: What a registered name may look like: dotted identifiers-ish, at most 200 characters.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,199}")

_BY_NAME: dict[str, Callable] = {}
# Keyed by id(): functions need not be hashable; the value keeps the function alive so
# its id is never reused while it is registered.
_BY_ID: dict[int, tuple[Callable, str]] = {}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise SerializationError(
            f"a function name must be a string of letters, digits and '_.:/-', starting with "
            f"a letter or '_', at most 200 characters; got {name!r:.80}")
    return name


@overload
def register_function(name: str) -> Callable[[F], F]: ...
@overload
def register_function(name: str, fn: F) -> F: ...


def register_function(name: str, fn: Callable | None = None):
    """Registers ``fn`` under ``name`` so graphs that hold it can be saved and loaded.

    Use it as a decorator (``@register_function("my_project.swish")``) or call it
    (``register_function("my_project.swish", swish)``). Register the function in the
    module that defines it, so that importing that module, before loading a file,
    makes the name known. Registering the same function under the same name again is
    a no-op, and a function redefined with the same module and qualified name (a
    notebook cell run again) takes its name over; a name taken by another function
    raises ``SerializationError``. A function registered under several names is
    written under the first.

    Returns:
      ``fn`` (so the decorator leaves the function unchanged).
    """
    _check_name(name)
    if fn is None:
        return lambda f: register_function(name, f)
    if not callable(fn):
        raise SerializationError(f"register_function({name!r}, ...) takes a callable, got "
                                 f"{type(fn).__name__}")
    existing = _BY_NAME.get(name)
    if existing is not None and existing is not fn and _describe(existing) != _describe(fn):
        raise SerializationError(
            f"the function name {name!r} is already registered for {_describe(existing)}; "
            f"choose another name")
    # A function redefined under its own module and name (a notebook cell run again, a
    # reloaded module) takes the name over; graphs holding the old one still write it.
    _BY_NAME[name] = fn
    _BY_ID.setdefault(id(fn), (fn, name))
    return fn


def function_name(fn: Callable) -> str | None:
    """The name ``fn`` is registered under (its first one), or None. An initializer of a
    family of one number (``initializers.normal(0.02)``) is named by its family and
    number: ``mlaxgraph.initializers.normal:0.02``."""
    entry = _BY_ID.get(id(fn))
    if entry is not None and entry[0] is fn:
        return entry[1]
    family, argument = getattr(fn, "family", None), getattr(fn, "argument", None)
    if family in initializers.PARAMETRIC and initializers.PARAMETRIC[family](argument) is fn:
        name = f"{_FAMILY_PREFIX}{family}:{argument!r}"
        return name if NAME_PATTERN.fullmatch(name) else None
    return None


_FAMILY_PREFIX = "mlaxgraph.initializers."


def _parametric(name: str) -> Callable | None:
    """The initializer a family name with its number names (``...normal:0.02``)."""
    if not name.startswith(_FAMILY_PREFIX) or ":" not in name:
        return None
    family, _, number = name[len(_FAMILY_PREFIX):].partition(":")
    if family not in initializers.PARAMETRIC:
        return None
    try:
        value = float(number)
    except ValueError:
        return None
    if not (value >= 0 and value != float("inf")) or repr(value) != number:
        return None
    return initializers.PARAMETRIC[family](value)


def lookup_function(name: str) -> Callable:
    """The function registered as ``name``; ``SerializationError`` when there is none."""
    if not isinstance(name, str):
        raise SerializationError(f"a function name must be a string, got {type(name).__name__}")
    try:
        return _BY_NAME[name]
    except KeyError:
        made = _parametric(name)
        if made is not None:
            return made
        raise SerializationError(
            f"the function {name[:200]!r} is not registered; import the module that calls "
            f"mg.register_function({name[:200]!r}, fn) before loading") from None


def registered_functions() -> dict[str, Callable]:
    """Name -> function, sorted by name."""
    return dict(sorted(_BY_NAME.items()))


def _describe(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{qualname}".lstrip(".")


def unregistered_message(fn: Callable, where: str) -> str:
    """Why a graph holding the unregistered ``fn`` cannot be written, and the fix."""
    name = _describe(fn)
    return (f"{where} holds the function {name}, which is not registered, so the graph "
            f"cannot be written (a file holds functions by registered name only). Register "
            f"it where it is defined: mg.register_function({name!r}, fn), or decorate it "
            f"with @mg.register_function({name!r})")


# mlaxgraph's own initializers, under names that do not change when code moves.
for _fn in (initializers.zeros, initializers.ones, initializers.lecun_normal,
            initializers.lecun_normal_conv_channels_last,
            initializers.lecun_normal_conv_channels_first, initializers.lora_a_uniform,
            initializers.lora_a_uniform_conv):
    register_function(f"mlaxgraph.initializers.{_fn.__name__}", _fn)
register_function("mlaxgraph.recurrent.orthogonal", recurrent.orthogonal)
register_function("mlaxgraph.recurrent.lstm_bias", recurrent.lstm_bias)
register_function("mlaxgraph.attention.head_kernel", attention._head_kernel)
register_function("mlaxgraph.attention.out_kernel", attention._out_kernel)
register_function("mlaxgraph.embedding.normal", embedding.normal)
del _fn
