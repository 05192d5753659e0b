"""Constrain: names the logical axes of an activation, for sharding; the identity."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.axes import as_axes
from ..core.errors import MlaxGraphError, ShapeError, ShardingError
from ..core.registry import register
from .base import Layer, expect_count, field

__all__ = ["Constrain", "constrain"]


def _axes(value: Any, layer: Layer) -> tuple[str | None, ...]:
    try:
        axes = as_axes(value, "axes")
    except MlaxGraphError as e:
        layer.invalid(e.problem, ShardingError)
    if axes is None:
        layer.invalid("axes must be a tuple of axis names (str or None), one per dim",
                      ShardingError)
    return axes


@register("constrain")
@dataclasses.dataclass(frozen=True)
class Constrain(Layer):
    """The identity, which says what its input's dims are: ``axes`` names them
    (``("batch", None, "embed")``, ``None`` for a dim kept whole). Compiled with a mesh,
    the activation is constrained to the mesh axes the rules give these names, and the
    layers after it propagate them; without a mesh it does nothing.

    Use it where the propagation cannot tell (after a ``Reshape``, an ``ops.F``) or to
    override what it found.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> ops.constrain(mg.Input(("batch", 16)), ("batch", "embed"))
      SymbolicTensor(f32[batch,16], from 'constrain')
    """

    axes: tuple[str | None, ...] = field(converter=_axes)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        if x.rank != len(self.axes):
            raise ShapeError(f"axes {self.axes} name {len(self.axes)} dims but the input has "
                             f"{x.rank}", expected=f"a rank-{len(self.axes)} input")
        return (x,)

    def output_axes(self, input_axes, inputs, outputs):
        return (self.axes,)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (inputs[0],), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        """The identity computes nothing."""
        return 0


def constrain(x, axes):
    """``Constrain(axes)(x)``: names the logical axes of ``x``'s dims."""
    return Constrain(tuple(axes) if not isinstance(axes, str) else axes)(x)
