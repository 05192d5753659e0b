"""Sharding rules: logical axis names mapped onto the axes of a device mesh, and the
PartitionSpec of an array from its logical axes.

Rules: a logical axis maps to a mesh axis, a tuple of mesh axes or None; a logical
axis with no rule is not sharded (replicated). A mesh axis shards at most one dim of
an array: a later dim whose rule names a mesh axis already used stays whole (so
``{"batch": "data", "embed": "data"}`` shards weights on ``embed`` and activations on
``batch``, FSDP-style).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from ..core.axes import UNKNOWN
from ..core.errors import ShardingError
from ..core.specs import is_symbolic

__all__ = ["auto_mesh", "as_rules", "spec_str", "partition_spec"]


def auto_mesh(mesh: Any) -> Mesh:
    """The mesh with every axis of type ``Auto``: XLA's SPMD partitioner decides the
    communication (``jax.make_mesh`` makes ``Explicit`` axes by default in recent JAX,
    whose sharding-in-types rules would make every layer spell out its shardings).

    Example:
      >>> import jax
      >>> auto_mesh(jax.make_mesh((1,), ("data",))).axis_types
      (Auto,)
    """
    if not isinstance(mesh, Mesh):
        raise ShardingError(f"mesh must be a jax.sharding.Mesh, e.g. jax.make_mesh((2, 4), "
                            f"('data', 'model')), got {type(mesh).__name__}")
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def as_rules(rules: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    """Rules as ``logical axis -> tuple of mesh axes`` (empty: replicated).

    Example:
      >>> as_rules({"batch": "data", "mlp": ("model",), "embed": None})
      {'batch': ('data',), 'mlp': ('model',), 'embed': ()}
    """
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise ShardingError(f"rules must map logical axis names to mesh axis names, e.g. "
                            f"{{'batch': 'data', 'mlp': 'model'}}, got {type(rules).__name__}")
    result = {}
    for name, target in rules.items():
        if not isinstance(name, str) or not name:
            raise ShardingError(f"rules: a logical axis name must be a non-empty str, got {name!r}")
        targets = () if target is None else (target,) if isinstance(target, str) else target
        try:
            targets = tuple(targets)
        except TypeError:
            targets = (target,)
        if not all(isinstance(t, str) and t for t in targets):
            raise ShardingError(f"rules[{name!r}] must be a mesh axis name, a tuple of them or "
                                f"None, got {target!r}")
        twice = next((t for i, t in enumerate(targets) if t in targets[:i]), None)
        if twice is not None:
            raise ShardingError(f"rules[{name!r}] names mesh axis {twice!r} twice ({target!r}): "
                                f"a mesh axis shards a dim once; give it once, or two different "
                                f"mesh axes")
        result[name] = targets
    return result


def spec_str(spec: P, rank: int) -> str:
    """A PartitionSpec as printed in summaries: ``[data,-]``; ``-`` whole (replicated),
    ``?`` left to XLA, ``a+b`` several mesh axes.

    Example:
      >>> spec_str(P("data", None, ("x", "y")), 4)
      '[data,-,x+y,-]'
    """
    entries = list(spec) + [None] * (rank - len(spec))

    def one(entry):
        if entry is None:
            return "-"
        if entry is P.UNCONSTRAINED:
            return "?"
        return entry if isinstance(entry, str) else "+".join(entry)

    return "[" + ",".join(one(e) for e in entries) + "]"


def partition_spec(shape, axes, rules, mesh: Mesh) -> P:
    """The PartitionSpec of an array with these logical axes. Raises a short
    ShardingError (the caller names the layer) for a rule naming a mesh axis the mesh
    lacks or a concrete dim its mesh axes do not divide."""
    # PartitionSpec entries: None, P.UNCONSTRAINED, a mesh axis name or a tuple of them.
    entries: list[Any] = []
    used: set[str] = set()
    for i, (size, name) in enumerate(zip(shape, axes)):
        if name is UNKNOWN:
            entries.append(P.UNCONSTRAINED)
            continue
        targets = rules.get(name, ()) if name is not None else ()
        missing = [m for m in targets if m not in mesh.shape]
        if missing:
            raise ShardingError(
                f"the rule for logical axis {name!r} names mesh axis {missing[0]!r}, which the "
                f"mesh does not have",
                expected=f"mesh axes {', '.join(map(repr, mesh.axis_names))} (or None) in "
                         f"rules[{name!r}]")
        if used.intersection(targets):  # one mesh axis shards one dim: this one stays whole
            targets = ()
        used.update(targets)
        count = math.prod(mesh.shape[m] for m in targets)
        if targets and not is_symbolic(size) and size % count:
            raise ShardingError(
                f"dim {i} ({name!r}) of size {size} is not divisible by mesh axis "
                f"{'x'.join(map(repr, targets))} of size {count}",
                expected=f"dim {i} divisible by {count}: change the layer's size, map {name!r} "
                         f"to another mesh axis or None in rules, or override the layer's axes")
        entries.append(None if not targets else targets[0] if len(targets) == 1 else targets)
    return P(*entries)
