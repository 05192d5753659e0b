"""The logical axes of activations, propagated from the graph's inputs through every
step of the program, each op saying how (``Layer.output_axes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler.interpreter import walk
from ..core.axes import input_axes
from ..core.errors import MlaxGraphError, ShardingError, node_message
from ..ir.graph import InputLayer

if TYPE_CHECKING:
    from ..compiler.program import Program, Step

__all__ = ["propagate"]


def propagate(program: Program) -> dict[str, tuple]:
    """Path (``layer`` or ``block/layer``, by node names) -> the logical axes of each
    output of that node, for every node of the graph and of its nested blocks (a
    block's are those of the values it returns; a block's input's, those of what it
    was called with).

    Raises:
      ShardingError: an op's ``output_axes`` failed or gave axes of the wrong rank,
        naming the layer.
    """
    inputs = []
    for name in program.inputs:
        node = program.graph.node(name)
        op = node.op
        assert isinstance(op, InputLayer)  # a graph's inputs are input ops (verified)
        inputs.append(input_axes(node.outputs[0], op.axes))
    axes = walk(program, inputs, _step_axes)
    return {path: tuple(axes[ref] for ref in refs) for path, refs in program.values.items()}


def _step_axes(step: Step, args: list) -> tuple:
    """The axes of a step's outputs from its inputs', as its op says."""
    node = step.node
    try:
        result = tuple(tuple(a) for a in node.op.output_axes(args, step.input_specs,
                                                             step.output_specs))
    except MlaxGraphError as e:
        raise ShardingError(node_message(step.path, node.op.op_name, e.problem,
                                         expected=e.expected, source=node.source)) from None
    except Exception as e:  # a user op's hook may raise anything
        raise ShardingError(node_message(step.path, node.op.op_name,
                                         f"output_axes failed: {e}", source=node.source)) from e
    if (len(result) != len(step.output_specs)
            or any(len(a) != s.rank for a, s in zip(result, step.output_specs))):
        raise ShardingError(node_message(
            step.path, node.op.op_name, "output_axes must give one name per dim of each output",
            got=str(result), expected=", ".join(f"{s.rank} names" for s in step.output_specs),
            source=node.source))
    return result
