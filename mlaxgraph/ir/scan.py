"""Scan: a run of equal blocks, each one's output the next one's input (their further
inputs, an attention mask, the same for all), as one node.

``mg.compile(graph, scan_blocks=True)`` folds such a run (``block0`` ... ``block31``
calling one graph, each with its own weights) into a ``scan`` node; the compiler runs
it with ``jax.lax.scan`` over the blocks' weights stacked on a leading axis, so the
block is traced and compiled once, not once per block. The node keeps the blocks'
names: its weights are theirs, stacked in that order, and ``init`` draws them with
the keys the blocks would have had.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.registry import register
from ..core.specs import ParamSpec
from .block import Block
from .graph import Graph
from .node import Node, Value
from .op import field
from .rewrite import Rewrite, Rule, rewrite

__all__ = ["Scan", "LAYERS_AXIS", "unfold_scans"]

#: The logical axis name of the stacked axis of a scan's weights (replicated unless a
#: sharding rule maps it).
LAYERS_AXIS = "layers"


def _names(value: Any, layer: Any) -> tuple[str, ...]:
    names = tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(names) < 2 or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        layer.invalid(f"names must be two or more distinct block names, got {value!r}")
    return names


def _stacked(specs: Any, length: int) -> Any:
    """ParamSpecs with a leading axis of ``length`` (the stacked blocks), named
    ``layers``. Their values are drawn per block (the compiler's init), so the
    initializer is the block's, applied to one block's shape."""
    if isinstance(specs, ParamSpec):
        axes = None if specs.axes is None else (LAYERS_AXIS, *specs.axes)
        if axes is None:
            axes = (LAYERS_AXIS,) + (None,) * len(specs.shape)
        return dataclasses.replace(specs, shape=(length, *specs.shape), axes=axes)
    return {name: _stacked(spec, length) for name, spec in specs.items()}


@register("scan")
@dataclasses.dataclass(frozen=True)
class Scan(Block):
    """``graph`` run once per name in ``names``, each run on the previous one's output,
    with the weights of the block of that name (stacked on a leading axis)."""

    names: tuple[str, ...] = field(default=(), converter=_names)
    #: The names of the casts a policy put after each block (a block whose output a
    #: precision-sensitive layer leaves in float32, cast back to the next block's
    #: dtype), run inside ``graph`` as its last node; () when the blocks chain as they are.
    casts: tuple[str, ...] = field(default=(), converter=lambda value, layer: tuple(value))

    @property
    def default_name(self) -> str:
        return f"{self.names[0]}..{self.names[-1]}"

    @property
    def length(self) -> int:
        return len(self.names)

    def display_name(self, node_name: str) -> str:
        """The run as summaries and renderings show it: ``block0 … block31:
        transformer_block × 32``."""
        return f"{self.names[0]} … {self.names[-1]}: {self.graph.name} × {self.length}"

    def apply(self, params, state, inputs, *, rng, inference_mode):
        raise NotImplementedError("a scan runs through its compiled program (lax.scan over "
                                  "its body's program), not on its own")

    def xla_cost_caveat(self, inference_mode: bool) -> str | None:
        return f"XLA counts a scan's body once, not {self.length} times"

    def with_subgraph(self, graph: Graph) -> Scan:
        return self if graph is self.graph else Scan(graph, self.names, self.casts, name=self.name)

    def block_and_cast(self) -> tuple[Graph, Node | None]:
        """Each block's own graph and the cast after it (None without ``casts``)."""
        if not self.casts:
            return self.graph, None
        body = self.graph
        cast = body.nodes[-1]
        block = Graph.from_parts(body.nodes[:-1], body.inputs, cast.inputs, body.name)
        return block, cast

    def param_specs(self, inputs):
        """The block's weights, each with a leading axis of one entry per block."""
        return _stacked(super().param_specs(inputs), self.length)

    def state_specs(self, inputs):
        return _stacked(super().state_specs(inputs), self.length)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        once = super().flops(inputs, outputs, param_dtype=param_dtype, inference_mode=inference_mode)
        return None if once is None else once * self.length


@dataclasses.dataclass(frozen=True)
class _Unfold(Rule):
    def visit(self, node: Node, rewrite: Rewrite):
        if not isinstance(node.op, Scan):
            return None
        value = node.inputs[0]
        block, cast = node.op.block_and_cast()
        for k, name in enumerate(node.op.names):
            rewrite.emit(Node(name, Block(block, name=name), (value, *node.inputs[1:]),
                              block.output_specs if cast else node.outputs, name, node.source))
            value = Value(name, 0)
            if cast is not None:
                cast_name = node.op.casts[k]
                rewrite.emit(Node(cast_name, cast.op, (value,), cast.outputs, cast_name, cast.source))
                value = Value(cast_name, 0)
        return (value,)


def has_scans(graph: Graph) -> bool:
    """Whether a ``scan`` node is in the graph or its blocks (memoised on each graph)."""
    memo = graph.memo("has_scans")
    if "found" not in memo:
        found = False
        for node in graph.nodes:
            inner = node.op.subgraph()
            if isinstance(node.op, Scan) or (inner is not None and has_scans(inner)):
                found = True
                break
        memo["found"] = found
    return memo["found"]


def unfold_scans(graph: Graph) -> Graph:
    """Every ``scan`` node back to the calls of its blocks, as the graph had them
    (``mg.save`` writes graphs this way, so files do not depend on compile options;
    surgery names blocks by their paths); the graph itself when it has none."""
    return rewrite(graph, _Unfold()) if has_scans(graph) else graph
