"""flatten: a graph becomes a Program, its nested blocks resolved once.

Each computing layer of each block call becomes a step (a block called twice gives
its layers twice, under the two calls' paths, with the weights of the first); a
block's inputs and outputs become plain references to the values around it. The
specs of a block's layers are bound to the dims the block is called with, so a block
built on ``(batch, height, width, 16)`` and called on ``(batch, 8, 8, 16)`` has steps
of concrete spatial sizes. A ``scan`` node (a run of equal blocks) is one step whose
``body`` is the program of one block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.specs import TensorSpec, match_shape, substitute
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.scan import Scan
from .program import Checkpoint, Program, Ref, ScanStep, Scheduled, Step

__all__ = ["flatten"]


def flatten(graph: Graph, prefix: tuple[str, ...] = (),
            remat: Mapping[str, str] | None = None) -> Program:
    """The program of a verified graph (``mlaxgraph.compiler.passes.verify``); its
    paths start with ``prefix`` (a scan's body is flattened under the scan's path).
    ``remat`` maps node paths (``block0``, ``block0/attention``) to the
    rematerialization policy of that block's or layer's steps.

    Example:
      >>> from mlaxgraph.examples import residual_cnn
      >>> program = flatten(residual_cnn(8, channels=4))
      >>> [s.path for s in program.steps][:4]
      ['stem', 'stem_bn', 'relu', 'res1/conv_a']
    """
    key = (prefix, frozenset((remat or {}).items()))
    memo = graph.memo("flatten")  # programs are immutable: a graph compiled again reuses its own
    if key not in memo:
        memo[key] = _flatten(graph, prefix, remat)
    return memo[key]


def _flatten(graph: Graph, prefix: tuple[str, ...], remat: Mapping[str, str] | None) -> Program:
    steps: list[Step] = []
    nodes: dict[str, Node] = {}
    values: dict[str, tuple[Ref, ...]] = {}
    owned: set[tuple[str, ...]] = set()
    regions: dict[str, str] = {}  # step path -> the block or layer rematerialized with it

    remat = remat or {}

    def visit(g: Graph, at: tuple[str, ...], weights: tuple[str, ...],
              arguments: tuple[Ref, ...], bindings: dict,
              group: tuple[str, str] | None) -> None:
        def bound(spec: TensorSpec) -> TensorSpec:
            return spec.with_shape(substitute(spec.shape, bindings)) if bindings else spec

        local = "/".join(at)
        for node in g.nodes:
            names = at + (node.name,)
            path = "/".join(names)
            nodes[path] = node
            if node.name in g.inputs:
                values[path] = (arguments[g.inputs.index(node.name)],)
                continue
            inputs = tuple(values[f"{local}/{v.node}" if local else v.node][v.index]
                           for v in node.inputs)
            specs = tuple(bound(g.spec(v)) for v in node.inputs)
            inner = node.op.subgraph()
            own = group if group is not None or path not in remat else (remat[path], path)
            if inner is not None and not isinstance(node.op, Scan):
                inner_bindings: dict = {}
                for want, got in zip(inner.input_specs, specs):
                    match_shape(want.shape, got.shape, inner_bindings)
                visit(inner, names, weights + (node.layer,), inputs, inner_bindings, own)
                values[path] = tuple(values[f"{path}/{v.node}"][v.index] for v in inner.outputs)
                continue
            owner = weights + (node.layer,)
            owns = owner not in owned
            owned.add(owner)
            common: dict[str, Any] = dict(
                path=path, node=node, graph=g, weights=owner, owns_weights=owns,
                inputs=inputs, input_specs=specs,
                output_specs=tuple(bound(s) for s in node.outputs),
                random=node.op.uses_rng(),
                param_specs=node.op.param_specs(specs), state_specs=node.op.state_specs(specs),
                remat=None if own is None else own[0], dims=bindings)
            if isinstance(node.op, Scan) and inner is not None:
                steps.append(ScanStep(**common, rng_path=at[len(prefix):],  # keys: the body's own
                                      body=flatten(inner, names), blocks=node.op.names))
            else:
                steps.append(Step(**common, rng_path=names[len(prefix):]))
                if own is not None:
                    regions[path] = own[1]
            values[path] = tuple((path, i) for i in range(len(node.outputs)))

    inputs = tuple("/".join(prefix + (name,)) for name in graph.inputs)
    visit(graph, prefix, (), tuple((path, 0) for path in inputs), {}, None)
    local = "/".join(prefix)
    outputs = tuple(values[f"{local}/{v.node}" if local else v.node][v.index] for v in graph.outputs)
    return Program(graph, inputs, tuple(steps), outputs, nodes, values, _schedule(steps, regions))


def _schedule(steps: list[Step], regions: Mapping[str, str]) -> tuple[Scheduled, ...]:
    """The steps, each run of consecutive steps of one rematerialized block or layer
    made one ``Checkpoint`` region."""
    schedule: list[Scheduled] = []
    i = 0
    while i < len(steps):
        region = regions.get(steps[i].path)
        if region is None:
            schedule.append(steps[i])
            i += 1
            continue
        j = i
        while j < len(steps) and regions.get(steps[j].path) == region:
            j += 1
        schedule.append(Checkpoint(region, steps[i].remat or "full", tuple(steps[i:j])))
        i = j
    return tuple(schedule)
