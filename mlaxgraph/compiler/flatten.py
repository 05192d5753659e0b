"""flatten: a graph becomes a Program, its nested blocks resolved once.

Each computing layer of each block call becomes a step (a block called twice gives
its layers twice, under the two calls' paths, with the weights of the first); a
block's inputs and outputs become plain references to the values around it. The
specs of a block's layers are bound to the dims the block is called with, so a block
built on ``(batch, height, width, 16)`` and called on ``(batch, 8, 8, 16)`` has steps
of concrete spatial sizes.
"""

from __future__ import annotations

from ..core.specs import TensorSpec, match_shape, substitute
from ..ir.graph import Graph
from ..ir.node import Node
from .program import Program, Ref, Step

__all__ = ["flatten"]


def flatten(graph: Graph) -> Program:
    """The program of a verified graph (``mlaxgraph.compiler.passes.verify``).

    Example:
      >>> from mlaxgraph.examples import residual_cnn
      >>> program = flatten(residual_cnn(8, channels=4))
      >>> [s.path for s in program.steps][:4]
      ['stem', 'stem_bn', 'relu', 'res1/conv_a']
    """
    steps: list[Step] = []
    nodes: dict[str, Node] = {}
    values: dict[str, tuple[Ref, ...]] = {}
    owned: set[tuple[str, ...]] = set()

    def visit(g: Graph, prefix: tuple[str, ...], weights: tuple[str, ...],
              arguments: tuple[Ref, ...], bindings: dict) -> None:
        def bound(spec: TensorSpec) -> TensorSpec:
            return spec.with_shape(substitute(spec.shape, bindings)) if bindings else spec

        for node in g.nodes:
            names = prefix + (node.name,)
            path = "/".join(names)
            nodes[path] = node
            if node.name in g.inputs:
                values[path] = (arguments[g.inputs.index(node.name)],)
                continue
            local = "/".join(prefix)
            inputs = tuple(values[f"{local}/{v.node}" if local else v.node][v.index]
                           for v in node.inputs)
            specs = tuple(bound(g.spec(v)) for v in node.inputs)
            inner = node.op.subgraph()
            if inner is not None:
                inner_bindings: dict = {}
                for want, got in zip(inner.input_specs, specs):
                    match_shape(want.shape, got.shape, inner_bindings)
                visit(inner, names, weights + (node.layer,), inputs, inner_bindings)
                values[path] = tuple(values[f"{path}/{v.node}"][v.index] for v in inner.outputs)
                continue
            owner = weights + (node.layer,)
            owns = owner not in owned
            owned.add(owner)
            steps.append(Step(
                path=path, node=node, graph=g, weights=owner, owns_weights=owns,
                inputs=inputs, input_specs=specs,
                output_specs=tuple(bound(s) for s in node.outputs),
                rng_path=names if node.op.uses_rng() else (),
                param_specs=node.op.param_specs(specs), state_specs=node.op.state_specs(specs),
                dims=bindings))
            values[path] = tuple((path, i) for i in range(len(node.outputs)))

    visit(graph, (), (), tuple((name, 0) for name in graph.inputs), {})
    outputs = tuple(values[v.node][v.index] for v in graph.outputs)
    return Program(graph, graph.inputs, tuple(steps), outputs, nodes, values)
