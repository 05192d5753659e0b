"""Which weights train: ``Trainer(trainable=...)``'s glob over weight paths (or
predicate), and the subtree of the weights that train taken out of ``params`` and put
back."""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..compiler.program import Program, ScanStep, leaf_paths
from ..core.errors import GraphError
from ..core.signatures import call_problem
from ..core.specs import trains
from ..ir.paths import path_matcher
from .gradient_paths import check_trainable

__all__ = ["ADAPTER", "glob_test", "subtree", "combine", "matching_nothing", "trainable_paths"]


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


def matching_nothing(trainable: Any, paths: list[str], program: Program, name: str) -> str:
    """``Trainer(trainable=...)``'s message for a pattern or predicate choosing no weight:
    near paths, the adapters' pattern, and a block folded into a scanned run."""
    what = f"pattern {trainable!r}" if isinstance(trainable, str) else "the predicate"
    plain = trainable.replace("*", "").replace("?", "") if isinstance(trainable, str) else ""
    near = difflib.get_close_matches(plain, paths, n=4, cutoff=0.3) or paths[:4]
    adapters = [path for path in paths if ADAPTER.search(path)]
    hint = (f"; the LoRA adapters' weights are {adapters[0]} ...: trainable=\"*/lora_*\" "
            f"trains every adapter" if adapters else "")
    runs = {block: step.weights[-1] for step in program.steps
            if isinstance(step, ScanStep) and step.owns_weights for block in step.blocks}
    head = trainable.split("/")[0] if isinstance(trainable, str) else ""
    folded = [block for block in runs if head and fnmatch.fnmatchcase(block, head)]
    if folded:
        run = runs[folded[0]]
        hint += (f"; block {folded[0]!r} is folded into the scan {run!r}, whose weights are "
                 f"stacked: a pattern under {run + '/'!r} trains that weight in every block of "
                 f"the run; to train some blocks alone, compile without scan_blocks")
    return (f"Trainer(trainable=...): {what} matches no weight of model {name!r}, so nothing "
            f"would train; weight paths such as {', '.join(near)}{hint}")


def trainable_paths(model: Any, trainable: Any) -> tuple[frozenset[str] | None, frozenset[str],
                                                         tuple[str, ...]]:
    """``(chosen, all, stored)``: the paths of the weights that train (None: all), of
    every weight, and of the quantized ones (int8, packed int4 or float8 values), which
    cannot train: naming one, or training all of a model holding them, is an error."""
    shapes, _ = jax.eval_shape(model.init_fn, jax.random.key(0))
    if trainable is None:
        check_trainable(model.program, shapes, None)
        return None, frozenset(), ()
    leaves = leaf_paths(shapes)
    if isinstance(trainable, (list, tuple, set, frozenset)) and trainable and \
            all(isinstance(t, str) for t in trainable):   # several globs: any of them
        tests = [glob_test(t) for t in trainable]
        for pattern, one in zip(trainable, tests):
            if not any(one(path) for path in leaves):
                raise GraphError(matching_nothing(pattern, list(leaves), model.program, model.graph.name))
        test: Callable[[str], bool] = lambda path: any(one(path) for one in tests)  # noqa: E731
    elif isinstance(trainable, str):
        test = glob_test(trainable)
    elif callable(trainable):
        if problem := call_problem(trainable, 1):
            raise GraphError(f"Trainer(trainable=...) calls a predicate as f(path) -> bool "
                             f"(path: 'fc/kernel'); {problem}")
        test = trainable
    else:
        raise GraphError(f"Trainer(trainable=...) takes a glob over weight paths, a list of "
                         f"them, or a predicate on the path, got {trainable!r}")
    stored = tuple(p for p, leaf in leaves.items() if not trains(leaf.dtype))
    chosen = frozenset(path for path in leaves if test(path))
    if not chosen:
        raise GraphError(matching_nothing(trainable, list(leaves), model.program, model.graph.name))
    check_trainable(model.program, shapes, chosen)
    return chosen, frozenset(leaves), stored
