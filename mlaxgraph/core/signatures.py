"""Whether a user's function can be called the way mlaxgraph calls it: checked before
the call, so a wrong signature is an error stating the expected one, not a
``TypeError`` from inside a trace; and the message for keyword arguments one of
mlaxgraph's functions does not take."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["call_problem", "unknown_keywords", "KeywordsNamed"]


def call_problem(fn: Callable[..., Any], count: int) -> str | None:
    """Why ``fn`` cannot take ``count`` positional arguments (its name, signature and
    what is wrong), or None when it can or its signature cannot be read (builtins)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*([None] * count))
    except TypeError as e:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        return f"{name}{signature}: {e}"
    return None


def unknown_keywords(function: str, unknown: Mapping[str, Any], takes: str,
                     hints: Mapping[str, str] | None = None) -> str:
    """The message for keyword arguments ``unknown`` that ``function`` does not take:
    each with its hint (``hints``: name -> what to do instead, such as the function
    that takes it), else the argument it takes that is spelt nearest (from ``takes``,
    its signature written out)."""
    known = re.findall(r"[(,]\s*\**(\w+)", takes)
    notes = []
    for name in unknown:
        if hints and name in hints:
            notes.append(hints[name])
        elif close := difflib.get_close_matches(name, known, n=1, cutoff=0.6):
            notes.append(f"did you mean {close[0]}?")
    plural = "s" if len(unknown) > 1 else ""
    return (f"{function} got unexpected keyword argument{plural} "
            f"{', '.join(map(repr, unknown))}{' (' + '; '.join(notes) + ')' if notes else ''}; "
            f"it takes {takes}")


class KeywordsNamed:
    """A dataclass base whose misspelt keyword (``Conv(stride=2)``,
    ``Policy(compute_type=...)``) is a ``ConfigError`` naming the one meant and what the
    class takes, raised before the dataclass's ``__init__`` raises Python's
    ``TypeError``."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        if kwargs:
            names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
            unknown = [k for k in kwargs if k not in names]
            if unknown:
                near = difflib.get_close_matches(unknown[0], names, n=1)
                raise ConfigError(f"{cls.__name__} got an unexpected keyword argument "
                                  f"{unknown[0]!r}" + (f"; did you mean {near[0]!r}?" if near
                                                        else "") + f" (it takes {', '.join(names)})")
        return super().__new__(cls)
