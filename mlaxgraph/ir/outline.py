"""Scopes to blocks: a flat sequence of computations, each tagged with the scope it ran
in (a module path: ``("layer1", "0", "conv1")``), built as a graph whose nested blocks
are those scopes.

Importers of foreign programs (a ``torch.export`` program's ``nn_module_stack``, an
ONNX model's node names ``/encoder/layer.0/attn/MatMul``) hand each computation over
as a ``Step``: the scope it ran in, the values it reads and writes (by the importer's
keys) and a function that builds its layers on symbolic tensors. ``outline`` groups
consecutive steps of the same scope into one block call, recursively: a block's inputs
are the values its steps read but do not write (in the order they are first read),
its outputs the values it writes that are read after it. Equal scopes give equal
graphs (their layers are named relative to the block), so runs of equal blocks fold
under ``scan_blocks=True``; a scope called again with an equal graph calls the same
block object, so it shares its weights, as the module does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ..core.errors import GraphError
from .builder import SymbolicTensor
from .graph import Graph, Input

__all__ = ["Scope", "Step", "outline"]


@dataclasses.dataclass(frozen=True)
class Scope:
    """One level of a step's scope: the block's ``name`` in its parent (``"layer1"``,
    ``"0"``, ``"h.3"``) and the name of its graph (the module's class:
    ``"BasicBlock"``), which equal blocks share."""

    name: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Step:
    """One computation: ``build(*tensors)`` gets the symbolic tensors of ``reads`` (in
    that order) and returns those of ``writes``; ``scope`` is the path of scopes it ran
    in, outermost first."""

    scope: tuple[Scope, ...]
    reads: tuple[Hashable, ...]
    writes: tuple[Hashable, ...]
    build: Callable[..., Sequence[SymbolicTensor]]


def _groups(steps: Sequence[tuple[int, Step]], level: int) -> list[tuple[Scope | None, list]]:
    """Consecutive (index, step) pairs of the same scope at ``level`` (None: the
    level's own steps, each alone)."""
    groups: list[tuple[Scope | None, list]] = []
    for pair in steps:
        scope = pair[1].scope[level] if len(pair[1].scope) > level else None
        if groups and groups[-1][0] == scope and scope is not None:
            groups[-1][1].append(pair)
        else:
            groups.append((scope, [pair]))
    return groups


def _input_name(i: int) -> str:
    return "input" if i == 0 else f"input_{i}"


class _Outliner:
    def __init__(self, needed_after: Mapping[Hashable, int]):
        # key -> index of the last step that reads it (the outputs: past the end)
        self.last_read = dict(needed_after)
        self.blocks: dict[tuple, tuple[Graph, Any]] = {}

    def run(self, steps: Sequence[tuple[int, Step]], level: int, env: dict, prefix: tuple) -> None:
        for scope, indexed in _groups(steps, level):
            if scope is None:
                for _, step in indexed:
                    self.emit(step, env)
                continue
            self.block(scope, indexed, level, env, prefix)

    def emit(self, step: Step, env: dict) -> None:
        try:
            args = [env[key] for key in step.reads]
        except KeyError as e:
            raise GraphError(f"scope {'/'.join(s.name for s in step.scope) or '(top)'}: the "
                             f"value {e.args[0]!r} is read before it is computed") from None
        outs = step.build(*args)
        if len(outs) != len(step.writes):
            raise GraphError(f"a step of scope {'/'.join(s.name for s in step.scope)} built "
                             f"{len(outs)} outputs for {len(step.writes)} values")
        env.update(zip(step.writes, outs))

    def block(self, scope: Scope, indexed: list[tuple[int, Step]], level: int, env: dict,
              prefix: tuple) -> None:
        written: set[Hashable] = set()
        reads: list[Hashable] = []
        for _, step in indexed:
            reads.extend(k for k in step.reads if k not in written and k not in reads)
            written.update(step.writes)
        end = indexed[-1][0]
        writes = [k for _, step in indexed for k in step.writes if self.last_read.get(k, -1) > end]
        inner: dict[Hashable, Any] = {}
        inputs = []
        for i, key in enumerate(reads):
            outer = env[key]
            inputs.append(Input(outer.shape, outer.dtype, name=_input_name(i)))
            inner[key] = inputs[-1]
        self.run(indexed, level + 1, inner, prefix + (scope.name,))
        if not writes:
            return  # nothing it computes is used: the block is dead code
        graph = Graph(inputs, [inner[k] for k in writes], name=scope.kind)
        path = prefix + (scope.name,)
        previous = self.blocks.get(path)
        if previous is not None and previous[0] == graph:
            layer = previous[1]  # the module called again: the same weights
        else:
            name = scope.name
            n = 1
            while previous is not None:
                name = f"{scope.name}_{n}"
                previous = self.blocks.get(prefix + (name,))
                n += 1
            layer = graph.as_block(name)
            self.blocks[prefix + (name,)] = (graph, layer)
        outs = layer(*[env[k] for k in reads])
        outs = outs if isinstance(outs, tuple) else (outs,)
        env.update(zip(writes, outs))


def outline(inputs: Mapping[Hashable, SymbolicTensor], steps: Sequence[Step],
            outputs: Sequence[Hashable], name: str) -> Graph:
    """The graph computing ``outputs`` from ``inputs`` by ``steps``, each scope a block.

    Args:
      inputs: the graph's inputs (from ``mg.Input``) by key, in order.
      steps: the computations in an order where each reads what earlier ones wrote.
      outputs: the keys of the graph's outputs.
      name: the graph's name.
    """
    last_read: dict[Hashable, int] = {}
    for i, step in enumerate(steps):
        for key in step.reads:
            last_read[key] = i
    for key in outputs:
        last_read[key] = len(steps)
    env: dict[Hashable, Any] = dict(inputs)
    _Outliner(last_read).run(list(enumerate(steps)), 0, env, ())
    missing = [k for k in outputs if k not in env]
    if missing:
        raise GraphError(f"graph {name!r}: no step computes the output {missing[0]!r}")
    return Graph(list(inputs.values()), [env[k] for k in outputs], name=name)
