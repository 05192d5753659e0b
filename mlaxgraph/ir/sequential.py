"""``mg.Sequential``: a graph from a list, each entry called on the previous output,
as Keras's ``Sequential``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.errors import GraphError, capture_source
from .builder import SymbolicTensor
from .graph import Graph

__all__ = ["Sequential"]


def Sequential(layers: Iterable[Any], name: str = "sequential") -> Graph:
    """The graph of ``layers`` applied in turn: the first entry is the input
    (``mg.Input(...)``), each later one a layer or a function of one symbolic tensor
    (``ops.relu``, ``lambda h: h * 2.0``, a ``Graph``) returning one.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> g = mg.Sequential([mg.Input(("batch", 4)), ops.Linear(8), ops.relu,
      ...                    ops.Linear(2)], name="mlp")
      >>> g.output_specs
      (f32[batch,2],)
    """
    items = list(layers)
    where = capture_source()
    at = f" (at {where})" if where else ""
    if not items or not isinstance(items[0], SymbolicTensor):
        raise GraphError(f"mg.Sequential takes [mg.Input(...), layer, ...]: the first entry must "
                         f"be the input tensor, got {type(items[0]).__name__ if items else 'nothing'}{at}")
    x = items[0]
    for i, item in enumerate(items[1:], 1):
        if not callable(item):
            raise GraphError(f"mg.Sequential entry {i} is a {type(item).__name__}, not a layer or "
                             f"a function{at}")
        x = item(x)
        if not isinstance(x, SymbolicTensor):
            raise GraphError(f"mg.Sequential entry {i} ({item!r:.60}) returned "
                             f"{type(x).__name__}, not one symbolic tensor{at}")
    return Graph(inputs=items[0], outputs=x, name=name)
