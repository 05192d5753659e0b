"""The op registry: op name -> Layer class. Loading a graph looks ops up here by name,
so no file can make mlaxgraph import or run code."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import GraphError

if TYPE_CHECKING:
    from ..ir.op import Layer

__all__ = ["register", "lookup", "registered_ops", "near_op"]

_REGISTRY: dict[str, type[Layer]] = {}

T = TypeVar("T", bound="type[Layer]")


def register(op_name: str) -> Callable[[T], T]:
    """Registers a Layer class under ``op_name`` (used in printed graphs and files).

    Example:
      >>> import dataclasses
      >>> from mlaxgraph.ir.op import Layer
      >>> @register("my_identity")
      ... @dataclasses.dataclass(frozen=True)
      ... class MyIdentity(Layer):
      ...     def infer(self, inputs):
      ...         return tuple(inputs)
      ...     def apply(self, params, state, inputs, *, rng, inference_mode):
      ...         return tuple(inputs), state
      >>> lookup("my_identity") is MyIdentity
      True
    """

    def decorate(cls: T) -> T:
        existing = _REGISTRY.get(op_name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise GraphError(f"op name {op_name!r} is already registered by {existing.__qualname__}")
        cls.op_name = op_name
        _REGISTRY[op_name] = cls
        return cls

    return decorate


def lookup(op_name: str) -> type[Layer]:
    """The Layer class registered as ``op_name``; ``GraphError`` when there is none."""
    try:
        return _REGISTRY[op_name]
    except (KeyError, TypeError):
        plain = [name for name in sorted(_REGISTRY) if "." not in name]
        families = sorted({name.partition(".")[0] for name in _REGISTRY if "." in name})
        more = f"; and the families {', '.join(f + '.*' for f in families)}" if families else ""
        raise GraphError(f"unknown op {op_name!r}{near_op(op_name)}; registered ops: "
                         f"{', '.join(plain)}{more}") from None


def near_op(op_name: Any) -> str:
    """`` (did you mean 'x'?)`` naming the registered op spelt nearest, or ''."""
    near = difflib.get_close_matches(str(op_name), list(_REGISTRY), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def registered_ops() -> dict[str, type[Layer]]:
    return dict(sorted(_REGISTRY.items()))
