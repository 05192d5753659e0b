"""Program: a graph flattened into the steps that compute it.

The flattening step (``flatten.py``) resolves nested blocks once: every computing
layer of every block call becomes one ``Step`` with its path (``block0/attention``),
the path of the weights it uses, its rng need and its specs bound to the graph's own
symbolic dims. Everything that runs or walks a compiled model reads the program:
the interpreter (init and apply), the output checks, the logical axes, the cost table,
the HLO attribution, the lists of random layers.

A value is a ``Ref``: ``(path, index)`` of the step (or graph input) producing it. A
block has no step of its own: its inputs and outputs are the refs of the values it
reads and of its inner layers' outputs (``Program.values``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..core.specs import ParamSpec, TensorSpec
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Layer

__all__ = ["Ref", "Step", "ScanStep", "Checkpoint", "Program", "get_in", "set_in", "leaf_paths", "path_str"]

#: ``(path, output index)`` of the step or graph input that produces a value.
Ref = tuple[str, int]


def path_str(names: tuple[str, ...]) -> str:
    return "/".join(names)


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One layer call of the flattened graph.

    Attributes:
      path: where it runs, by node names: ``block0/attention`` (its named scope, its
        key in cost tables, HLO by layer and sharding labels).
      node: its node, as recorded in the graph holding it.
      graph: the graph holding the node (errors show its neighbours there).
      weights: where its weights live in ``params`` and ``state``, by layer names
        (``("block0", "attention")``; a shared layer's later calls name the first).
      owns_weights: whether it is the first step using ``weights``: ``init`` creates
        them here.
      inputs: the refs of the values it reads.
      input_specs, output_specs: its specs with the symbolic dims of nested blocks
        bound to those of the graph being compiled.
      random: whether it needs a key in training.
      rng_path: the names folded into the apply key for it (its path's names; for a
        scan, its parent's, each block then folding in its own name).
      param_specs, state_specs: its weights, as its op declares them.
      body: for a scan step (``ScanStep``), the program of one block; None here.
      remat: the rematerialization policy asked for it (``"full"``, ``"dots"``), or
        None: the backward pass recomputes its results instead of keeping them (a
        layer's steps run inside a ``Checkpoint`` region of ``Program.schedule``; a
        scan's blocks are checkpointed one by one).
      dims: the symbolic dims of the block holding it, by name, as dims of the graph
        being compiled (empty at the top level): ops with symbolic hyperparameters are
        bound to them before the graph's own.
    """

    path: str
    node: Node
    graph: Graph
    weights: tuple[str, ...]
    owns_weights: bool
    inputs: tuple[Ref, ...]
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    random: bool
    rng_path: tuple[str, ...]
    param_specs: Mapping[str, Any]
    state_specs: Mapping[str, Any]
    body: Program | None = None
    remat: str | None = None
    dims: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def op(self) -> Layer:
        return self.node.op

    @property
    def weights_path(self) -> str:
        return path_str(self.weights)

    @property
    def outputs(self) -> tuple[Ref, ...]:
        return tuple((self.path, i) for i in range(len(self.output_specs)))


@dataclasses.dataclass(frozen=True, eq=False)
class ScanStep(Step):
    """A run of equal blocks as one step: ``body`` (the program of one block) run by
    ``lax.scan`` once per block, over the blocks' stacked weights.

    Attributes:
      blocks: the names of its blocks, in order (their weights are stacked in that
        order; each one's key folds in its name).
    """

    blocks: tuple[str, ...] = ()

    @property
    def block(self) -> Program:
        """The program of one block (``body``, which a scan step always has)."""
        assert self.body is not None
        return self.body


@dataclasses.dataclass(frozen=True, eq=False)
class Checkpoint:
    """A region of steps run under one ``jax.checkpoint``: the backward pass recomputes
    what they made inside instead of keeping it, saving what ``policy`` allows.

    Attributes:
      path: the block or layer asked to be rematerialized (``block3``).
      policy: ``"full"`` or ``"dots"`` (``interpreter.REMAT_POLICIES``).
      steps: its steps, in order.
    """

    path: str
    policy: str
    steps: tuple[Step, ...]


#: What ``Program.schedule`` holds: the typed units the interpreter runs.
Scheduled = Step | Checkpoint


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """A graph as a flat list of steps.

    Attributes:
      graph: the graph it was flattened from.
      inputs: the paths of the graph's inputs (their names, for the graph being
        compiled); input ``path`` is the ref ``(path, 0)``.
      steps: the layer calls, in an order that respects their data dependencies.
      outputs: the refs of the graph's outputs.
      nodes: path -> node of every node at every level (inputs and blocks included),
        in the order the graph lists them.
      values: path -> the refs of that node's outputs (a block's are its inner
        layers'; an inner input's are what the block was called with).
      schedule: what the interpreter runs, in order: the steps, with each run of
        steps rematerialized together as one ``Checkpoint`` region.
    """

    graph: Graph
    inputs: tuple[str, ...]
    steps: tuple[Step, ...]
    outputs: tuple[Ref, ...]
    nodes: Mapping[str, Node]
    values: Mapping[str, tuple[Ref, ...]]
    schedule: tuple[Scheduled, ...] = ()

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self.graph.input_specs

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    @functools.cached_property
    def _specs(self) -> dict:
        specs: dict = {(path, 0): spec for path, spec in zip(self.inputs, self.graph.input_specs)}
        for step in self.steps:
            specs.update(zip(step.outputs, step.output_specs))
        return specs

    def _holding(self, path: str) -> Program:
        if path in self.nodes:
            return self
        for step in self.steps:
            if step.body is not None and path.startswith(step.path + "/"):
                return step.body._holding(path)
        raise KeyError(path)

    def node_specs(self, path: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """The input and output specs of the node at ``path`` (blocks, inputs and a
        scan's body's nodes included), bound to the dims of the graph compiled."""
        program = self._holding(path)
        node = program.nodes[path]
        local = path[:-len(node.name) - 1] if path != node.name else ""  # names may hold '/'
        inputs = tuple(program._specs[program.values[f"{local}/{v.node}" if local else v.node][v.index]]
                       for v in node.inputs)
        return inputs, tuple(program._specs[ref] for ref in program.values[path])

    def all_paths(self) -> Iterator[str]:
        """The path of every node, a scan's body's included."""
        yield from self.nodes
        for step in self.steps:
            if step.body is not None:
                yield from step.body.all_paths()

    def all_steps(self) -> Iterator[Step]:
        """Every step, a scan's body's steps right after the scan's (their paths under
        the scan's: ``block0..block31/attention``)."""
        for step in self.steps:
            yield step
            if step.body is not None:
                yield from step.body.all_steps()

    def checkpoints(self) -> dict[str, str]:
        """Block or layer path -> its rematerialization policy: the checkpoint regions
        and the scans whose blocks are checkpointed."""
        found = {}
        for unit in self.schedule:
            if isinstance(unit, Checkpoint):
                found[unit.path] = unit.policy
            elif unit.remat is not None:
                found[unit.path] = unit.remat
        return found

    def owners(self) -> Iterator[Step]:
        """The steps that own their weights: one per layer with weights."""
        return (s for s in self.steps if s.owns_weights and (s.param_specs or s.state_specs))

    def random_paths(self) -> list[str]:
        """Paths of the steps that need an rng in training."""
        return [s.path for s in self.steps if s.random]

    def weight_tree(self, which: str, leaf: Callable[[Step, str, ParamSpec], Any]) -> dict:
        """A tree shaped as ``init``'s params (``which="params"``) or state
        (``"state"``), with ``leaf(step, weight path, spec)`` at each weight."""
        tree: dict = {}
        for step in self.owners():
            specs = step.param_specs if which == "params" else step.state_specs
            if specs:
                tree = set_in(tree, step.weights,
                              _map_specs(specs, functools.partial(leaf, step)))
        return tree


def _map_specs(specs: Mapping[str, Any], fn: Callable[[str, Any], Any], prefix: str = "") -> dict:
    return {name: _map_specs(spec, fn, f"{prefix}{name}/") if isinstance(spec, Mapping)
            else fn(prefix + name, spec) for name, spec in specs.items()}


def leaf_paths(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"block/layer/kernel": leaf}`` of a nested dict (params, state, their shapes)."""
    if not isinstance(tree, Mapping):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(leaf_paths(value, f"{prefix}{key}/"))
    return out


def get_in(tree: Any, keys: tuple[str, ...]) -> Any:
    """``tree[k0][k1]...``; KeyError (or TypeError for a non-dict level) when absent."""
    for key in keys:
        tree = tree[key]
    return tree



def has_in(tree: Any, keys: tuple[str, ...]) -> bool:
    """Whether ``tree[k0][k1]...`` exists."""
    try:
        get_in(tree, keys)
    except (KeyError, TypeError, IndexError):
        return False
    return True

def set_in(tree: Mapping, keys: tuple[str, ...], value: Any) -> dict:
    """A copy of ``tree`` with ``value`` at ``keys`` (the dicts along the way copied,
    the rest shared)."""
    out = dict(tree)
    if len(keys) == 1:
        out[keys[0]] = value
    else:
        inner = tree.get(keys[0], {})
        out[keys[0]] = set_in(inner if isinstance(inner, Mapping) else {}, keys[1:], value)
    return out
