"""Which weights train: ``Trainer(trainable=...)``'s glob over weight paths, and the
subtree of the weights that train taken out of ``params`` and put back."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ..ir.paths import path_matcher

__all__ = ["ADAPTER", "glob_test", "subtree", "combine"]


#: An adapter's layer ``<target>.lora_A`` read as a child of its target.
ADAPTER = re.compile(r"\.(lora_[AB])(?=/|\Z)")


def glob_test(pattern: str) -> Callable[[str], bool]:
    """A weight path matches when the glob matches one of its prefixes (a layer's path
    names all its weights) or, unless the pattern starts with ``/``, such a prefix with
    leading names left out (a pattern matches at any depth, as PEFT's ``target_modules``
    do: ``"*/lora_*"`` names the adapters of nested layers too). A LoRA adapter's
    ``<target>.lora_A`` is also read ``<target>/lora_A`` (the adapter as a part of its
    target)."""
    anchored = pattern.startswith("/")
    test = path_matcher(pattern.lstrip("/") if anchored else pattern)

    def matches(path: str) -> bool:
        for view in {path, ADAPTER.sub(r"/\1", path)}:
            parts = view.split("/")
            starts = (0,) if anchored else range(len(parts))
            if any(test("/".join(parts[j:i])) for j in starts
                   for i in range(len(parts), j, -1)):
                return True
        return False

    return matches


def subtree(tree: Mapping, keep: frozenset[str], prefix: str = "") -> dict:
    """The leaves of ``tree`` whose paths are in ``keep``, in the same nested dicts."""
    out: dict = {}
    for key, value in tree.items():
        path = prefix + key
        if isinstance(value, Mapping):
            inner = subtree(value, keep, path + "/")
            if inner:
                out[key] = inner
        elif path in keep:
            out[key] = value
    return out


def combine(tree: Mapping, sub: Mapping) -> dict:
    """``tree`` with the leaves ``sub`` has (same nested dicts) taken from ``sub``."""
    out = dict(tree)
    for key, value in sub.items():
        out[key] = combine(tree[key], value) if isinstance(value, Mapping) else value
    return out
