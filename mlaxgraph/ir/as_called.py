"""A layer as one of its calls calls it: what ``Graph.replace`` hands its function as
``layer``, so that ``layer(x)`` computes what the node computed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.specs import TensorSpec

__all__ = ["as_called"]


class _Attending:
    """A tied head's layer as its node calls it (``embedding.attend(h)``): calling it
    attends; every attribute is the embedding's."""

    def __init__(self, layer: Any):
        self._layer = layer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._layer.attend(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_layer":  # unset (copy, unpickle)
            raise AttributeError(name)
        return getattr(self._layer, name)

    def __repr__(self) -> str:
        return f"{self._layer!r}.attend"


def as_called(layer: Any, inputs: Sequence[TensorSpec]) -> Any:
    """``layer`` called as a node with these input specs calls it: an embedding's call
    on features is its ``attend`` (the tied output head); other layers as they are."""
    attends = getattr(layer, "_attends", None)
    if attends is not None and attends(list(inputs)):
        return _Attending(layer)
    return layer
