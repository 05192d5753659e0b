"""The named-scope convention, both ways: a layer's path is the named scope of its
operations, so jaxpr, StableHLO locations and optimized HLO's ``op_name`` name the
layer (``jit(apply)/block0/attention/dot_general``).

One change is needed: XLA cuts an optimized instruction's ``op_name`` at ``@``, which
names a shared layer's later calls (``dense@1``); the scope writes it ``#``.
"""

from __future__ import annotations

__all__ = ["scope_name", "path_of_scope"]


def scope_name(path: str) -> str:
    """The named scope of the operations of the layer at ``path``.

    Example:
      >>> scope_name("block0/dense@1")
      'block0/dense#1'
    """
    return path.replace("@", "#")


def path_of_scope(scope: str) -> str:
    """The layer path a named scope was made from (``scope_name``'s inverse).

    Example:
      >>> path_of_scope("block0/dense#1")
      'block0/dense@1'
    """
    return scope.replace("#", "@")
