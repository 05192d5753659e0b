"""Value and Node: the two records of the IR. Frozen, typed, compared by value."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..core.errors import SourceInfo
from ..core.specs import TensorSpec

if TYPE_CHECKING:  # the IR records ops; ops build IR through the builder
    from .op import Layer

__all__ = ["Value", "Node", "SourceInfo"]


@dataclasses.dataclass(frozen=True, order=True)
class Value:
    """A reference to output ``index`` of the node called ``node``."""

    node: str
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.node}" if self.index == 0 else f"%{self.node}#{self.index}"


@dataclasses.dataclass(frozen=True)
class Node:
    """One application of an op in a graph.

    Attributes:
      name: unique in its graph; names the layer in params, errors and HLO metadata.
      op: the op with its hyperparameters (a frozen ``Layer``).
      inputs: the values it consumes, in order.
      outputs: the specs of what it produces.
      layer: whose weights it uses: its own name, or the name of the node that first
        called the same layer object (weight sharing).
      source: where the user created it (not part of equality).
    """

    name: str
    op: Layer
    inputs: tuple[Value, ...]
    outputs: tuple[TensorSpec, ...]
    layer: str
    source: SourceInfo | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def shares_weights(self) -> bool:
        return self.layer != self.name

    def value(self, index: int = 0) -> Value:
        return Value(self.name, index)

    def replace(self, **changes) -> Node:
        """The node with ``changes``; a node renamed that holds its own weights (its
        ``layer`` is its name) takes the new name as its layer too, so its weights move
        with it (a further call of a layer, ``fc@1``, keeps reading ``fc``'s)."""
        if "name" in changes and "layer" not in changes and self.layer == self.name:
            changes["layer"] = changes["name"]
        return dataclasses.replace(self, **changes)
