"""Whether a user's function can be called the way mlaxgraph calls it: checked before
the call, so a wrong signature is an error stating the expected one, not a
``TypeError`` from inside a trace."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["call_problem"]


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
