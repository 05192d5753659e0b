"""Stacked weights: a scanned run's blocks' weights on one leading axis, and back.

A graph's own layout keeps each block's weights under its name
(``params["block0"]``, ``params["block1"]``, ...); a model compiled with
``scan_blocks=True`` keeps the run's weights stacked under the scan's name
(``params["block0..block31"]``, each weight with a leading axis of 32). These
functions convert any tree holding that layout: params, state, gradients, and the
optimizer states that mirror them (Adam's moments are found wherever they are). A
tree may hold some layers of a run per block and the others stacked (frozen layers,
``mlaxgraph.compiler.indexed``): both functions merge the two.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ..core.errors import GraphError
from .program import Program, ScanStep, Step, get_in, has_in, set_in

__all__ = ["stack_weights", "unstack_weights", "unstack_given"]


def _scans(program: Program) -> list[ScanStep]:
    return [s for s in program.steps if isinstance(s, ScanStep) and s.owns_weights]


def _names(step: ScanStep) -> tuple[str, ...]:
    return step.blocks



def _holds_blocks(tree: Any, step: ScanStep) -> bool:
    parent = step.weights[:-1]
    return isinstance(tree, Mapping) and all(has_in(tree, parent + (n,)) for n in _names(step))


def _holds_stack(tree: Any, step: Step) -> bool:
    return isinstance(tree, Mapping) and has_in(tree, step.weights)


def _merged(old: Any, new: Any) -> Any:
    """Two weight trees of the same block or run as one (``old`` None: ``new``)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new if old is None else old if new is None else new
    out = dict(old)
    for key, value in new.items():
        out[key] = _merged(out.get(key), value)
    return out


def _replace(tree: Mapping, parent: tuple[str, ...], remove: tuple[str, ...], name: str,
             value: Any) -> dict:
    """``tree`` with the entries ``remove`` of the dict at ``parent`` replaced by one
    entry ``name``, put where the first of them was (merged with an entry ``name``
    already there: the layers of a run kept stacked beside those given per block)."""
    level = get_in(tree, parent) if parent else tree
    out: dict = {}
    for key, entry in level.items():
        if key == remove[0]:
            out[name] = _merged(level.get(name), value)
        elif key not in remove and not (key == name and name in out):
            out[key] = entry
    return set_in(tree, parent, out) if parent else out


def _stack_one(tree: Mapping, step: ScanStep) -> dict:
    parent, names = step.weights[:-1], _names(step)
    # a block holding runs of its own (nested scans) stacks them first, as its body scans them
    blocks = [_convert(step.block, (get_in(tree, parent + (n,)),), _holds_blocks, _stack_one)[0]
              for n in names]
    shapes = {jax.tree.structure(b) for b in blocks}
    if len(shapes) != 1:
        raise GraphError(f"the weights of {', '.join(names)} differ in structure and cannot be "
                         f"stacked for {step.path}")
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
    return _replace(tree, parent, names, step.weights[-1], stacked)


def _unstack_one(tree: Mapping, step: ScanStep) -> dict:
    parent, names = step.weights[:-1], _names(step)
    stacked = get_in(tree, step.weights)
    level = get_in(tree, parent) if parent else tree
    out: dict = {}
    for key, entry in level.items():
        if key == step.weights[-1]:
            for i, name in enumerate(names):  # merged with layers given per block
                block = jax.tree.map(lambda x, i=i: x[i], stacked)
                block = _convert(step.block, (block,), _holds_stack, _unstack_one)[0]  # nested runs
                out[name] = _merged(level.get(name), block)
        elif not (key in names and key in out):
            out[key] = entry
    return set_in(tree, parent, out) if parent else out


def _convert(program: Program, trees: tuple, holds, convert) -> tuple:
    scans = _scans(program)
    if not scans:
        return trees

    def is_root(x: Any) -> bool:
        return any(holds(x, step) for step in scans)

    def one(x: Any) -> Any:
        if not isinstance(x, Mapping):
            return x
        for step in scans:
            if holds(x, step):
                x = convert(x, step)
        return x

    return tuple(None if t is None else jax.tree.map(one, t, is_leaf=is_root) for t in trees)


def stack_weights(program: Program, params: Any, state: Any = None) -> tuple[Any, Any]:
    """``(params, state)`` in the graph's own layout -> the scanned layout (either may
    be None, or any tree holding that layout: gradients, optimizer states)."""
    params, state = _convert(program, (params, state), _holds_blocks, _stack_one)
    return params, state


def unstack_weights(program: Program, params: Any, state: Any = None) -> tuple[Any, Any]:
    """``(params, state)`` in the scanned layout -> the graph's own layout."""
    params, state = _convert(program, (params, state), _holds_stack, _unstack_one)
    return params, state


def numbered_blocks(first: str, last: str, counts: set) -> list[str]:
    """The blocks a stack named ``"<first>..<last>"`` holds when their names number them
    (``h.0..h.2``: ``h.0``, ``h.1``, ``h.2``) and its leading dims count them; else []."""
    a, b = re.fullmatch(r"(.*?)(\d+)", first), re.fullmatch(r"(.*?)(\d+)", last)
    if a is None or b is None or a.group(1) != b.group(1) or len(counts) != 1:
        return []
    start, stop = int(a.group(2)), int(b.group(2))
    if stop - start + 1 != next(iter(counts)):
        return []
    return [f"{a.group(1)}{i}" for i in range(start, stop + 1)]


def unstack_given(program: Program, params: Any, state: Any = None) -> tuple[Any, Any]:
    """``(params, state)`` another model compiled with ``scan_blocks=True`` stacked (a
    run under ``"<first>..<last>"``) for ``program``, which holds those blocks one by one
    (an unscanned model, or one that scans other runs): each stack sliced back into its
    blocks, found by the run's first and last names in ``program``'s order. What does
    not match (another count of blocks, names the program lacks) is left as it is."""
    order: dict[tuple[str, ...], list[str]] = {}  # parent -> its children, in program order
    runs: set[tuple[str, ...]] = set()  # the runs program scans itself
    for step in program.owners():
        for i, name in enumerate(step.weights):
            parent = tuple(step.weights[:i])
            names = order.setdefault(parent, [])
            members: tuple[str, ...] = (name,)
            if isinstance(step, ScanStep) and i == len(step.weights) - 1:
                runs.add(parent + (name,))
                members = step.blocks  # a run: its blocks
            for member in members:
                if member not in names:
                    names.append(member)

    def walk(tree: Any, parent: tuple[str, ...]) -> Any:
        if not isinstance(tree, Mapping):
            return tree
        out: dict[str, Any] = {}
        names = order.get(parent, [])
        for key, value in tree.items():
            first, _, last = str(key).partition("..")
            if last and isinstance(value, Mapping):
                counts = {jnp.shape(a)[0] if jnp.ndim(a) else -1 for a in jax.tree.leaves(value)}
                members = (names[names.index(first):names.index(last) + 1]
                           if first in names and last in names else [])
                if parent + (key,) in runs or counts != {len(members)}:
                    # the program scans this run as it is, or holds other blocks between
                    # first and last (one removed): the stack's own blocks by their numbers
                    members = [] if parent + (key,) in runs and counts == {len(members)} \
                        else numbered_blocks(first, last, counts)
                if members:
                    for i, member in enumerate(members):  # and the runs inside each block
                        out[member] = walk(jax.tree.map(lambda a, i=i: a[i], value), parent + (member,))
                    continue
            out[key] = walk(value, parent + (str(key),))
        return out

    return walk(params, ()), None if state is None else walk(state, ())
