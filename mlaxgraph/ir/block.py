"""Block: a graph used as a layer. It honours the whole layer contract by delegating to
its graph: its weights are its layers' (nested by layer name), its FLOPs their sum,
its output axes what its layers make of its inputs' axes. The compiler resolves its
calls into its layers' steps once (``mlaxgraph.compiler.flatten``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..core.axes import declared_weights
from ..core.errors import DTypeError, GraphError, ShapeError, ShardingError
from ..core.registry import register
from ..core.specs import TensorSpec, match_shape, specs_str, substitute
from .graph import Graph
from .op import Layer

__all__ = ["Block"]


@register("block")
@dataclasses.dataclass(frozen=True)
class Block(Layer):
    """A graph used as a layer: its nodes run in its own name scope, its weights nest
    under the block's name. Made by calling a ``Graph`` on symbolic tensors."""

    graph: Graph

    def validate(self):
        if not isinstance(self.graph, Graph):
            self.invalid(f"a block wraps a Graph, got {type(self.graph).__name__}", GraphError)

    @property
    def default_name(self) -> str:
        return self.graph.name

    def subgraph(self) -> Graph:
        return self.graph

    def with_subgraph(self, graph: Graph) -> Block:
        return self if graph is self.graph else Block(graph, name=self.name)

    def _bindings(self, inputs: Sequence[TensorSpec]) -> dict:
        """The block's symbolic input dims bound to the dims it is called with."""
        expected = self.graph.input_specs
        if len(inputs) != len(expected):
            raise ShapeError(f"graph {self.graph.name!r} takes {len(expected)} inputs, "
                             f"got {len(inputs)}", expected=specs_str(expected))
        bindings: dict = {}
        for got, want in zip(inputs, expected):
            if got.dtype != want.dtype:
                raise DTypeError(f"graph {self.graph.name!r} was built for other input dtypes",
                                 expected=specs_str(expected))
            if not match_shape(want.shape, got.shape, bindings):
                raise ShapeError(f"graph {self.graph.name!r} was built for other input shapes",
                                 expected=specs_str(expected))
        return bindings

    def infer(self, inputs):
        """The graph's output specs, with its symbolic input dims bound to the dims it is
        called with (a block built on ``(batch, height, width, 16)`` takes
        ``(batch, 8, 8, 16)``)."""
        bindings = self._bindings(inputs)
        return tuple(s.with_shape(substitute(s.shape, bindings)) for s in self.graph.output_specs)

    def _calls(self, inputs: Sequence[TensorSpec]):
        """``(node, its input specs)`` of every computing node, specs bound."""
        bindings = self._bindings(inputs)
        specs = {}
        for name, spec in zip(self.graph.inputs, inputs):
            specs[(name, 0)] = spec
        for node in self.graph.nodes:
            if node.name in self.graph.inputs:
                continue
            args = tuple(specs[(v.node, v.index)] for v in node.inputs)
            yield node, args
            for i, spec in enumerate(node.outputs):
                specs[(node.name, i)] = spec.with_shape(substitute(spec.shape, bindings))

    def _weights(self, inputs, kind: int) -> dict:
        """Its layers' params (``kind`` 0) or state (1), each layer's ``param_axes``
        overrides written into its specs' axes, as sharding reads them unscanned."""
        out: dict[str, Any] = {}
        for node, args in self._calls(inputs):
            if node.layer not in out:
                try:
                    specs = declared_weights(node.op, args)[kind]
                except ShardingError as e:
                    raise ShardingError(f"layer {node.layer!r} of block {self.graph.name!r}: "
                                        f"{e.problem}", expected=e.expected) from None
                if specs:
                    out[node.layer] = dict(specs)
        return out

    def param_specs(self, inputs):
        """Its layers' weights, nested by layer name, each layer once (with its
        ``param_axes``)."""
        return self._weights(inputs, 0)

    def state_specs(self, inputs):
        return self._weights(inputs, 1)

    def uses_rng(self) -> bool:
        return any(node.op.uses_rng() for node in self.graph.nodes)

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The sum of its layers' FLOPs (None when one of them has no rule)."""
        total: Any = 0
        for node, args in self._calls(inputs):
            outs = node.op.infer(args)
            count = node.op.flops(args, outs, param_dtype=param_dtype,
                                  inference_mode=inference_mode)
            if count is None:
                return None
            total = total + count
        return total

    def output_axes(self, input_axes, inputs, outputs):
        """The axes its layers give its outputs, from its inputs' axes."""
        axes = {(name, 0): tuple(a) for name, a in zip(self.graph.inputs, input_axes)}
        for node, args in self._calls(inputs):
            result = node.op.output_axes([axes[(v.node, v.index)] for v in node.inputs], args,
                                         node.op.infer(args))
            for i, a in enumerate(result):
                axes[(node.name, i)] = tuple(a)
        return tuple(axes[(v.node, v.index)] for v in self.graph.outputs)


