"""Whether a user's function can be called the way mlaxgraph calls it: checked before
the call, so a wrong signature is an error stating the expected one, not a
``TypeError`` from inside a trace; and the message for keyword arguments one of
mlaxgraph's functions does not take."""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["call_problem", "unknown_keywords"]


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
