"""Rematerialization: which blocks or layers the backward pass recomputes instead of
keeping their activations (``mg.compile(graph, remat=...)``).

``"full"`` puts each block (each layer, in a graph without blocks) under
``jax.checkpoint``: only its inputs are kept. ``"dots"`` keeps the results of matrix
multiplications without batch dims (``jax.checkpoint_policies.
dots_with_no_batch_dims_saveable``) and recomputes the rest. A dict names blocks or
layers (their names, or paths ``block/layer``), like policy overrides.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from ..core.errors import GraphError
from ..ir.graph import Graph
from ..ir.scan import Scan

__all__ = ["POLICIES", "resolve_remat"]

#: The rematerialization policies by name ("none": keep everything).
POLICIES = ("none", "full", "dots")


def _policy(value: Any, where: str) -> str:
    if value not in POLICIES:
        raise GraphError(f"{where} must be one of {', '.join(map(repr, POLICIES))}, got {value!r}")
    return value


def resolve_remat(graph: Graph, remat: Any) -> dict[str, str]:
    """Node path -> policy (``"full"`` or ``"dots"``) for the compiled ``graph``. A
    block folded into a scan is named by its own name; the blocks of one run must ask
    for the same policy.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> resolve_remat(mlp(4, (8,), 2), "full")
      {'dense': 'full', 'relu': 'full', 'logits': 'full'}
      >>> resolve_remat(mlp(4, (8,), 2), {"dense": "dots"})
      {'dense': 'dots'}
    """
    if remat is None:
        return {}
    computing = [node for node in graph.nodes if node.name not in graph.inputs]
    if isinstance(remat, str):
        policy = _policy(remat, "remat")
        if policy == "none":
            return {}
        blocks = [node for node in computing if node.op.subgraph() is not None]
        return {node.name: policy for node in (blocks or computing)}
    if not isinstance(remat, Mapping):
        raise GraphError(f"remat must be 'none', 'full', 'dots' or a dict of block or layer names "
                         f"to those, got {type(remat).__name__}")
    # Every path a user may name, and the node path it falls under after folding.
    where: dict[str, str] = {}
    for path, node in graph.walk():
        where[path] = path
        if isinstance(node.op, Scan):
            for name in node.op.names:
                where[path.rpartition("/")[0] + "/" + name if "/" in path else name] = path
    resolved: dict[str, str] = {}
    for name, value in remat.items():
        policy = _policy(value, f"remat[{name!r}]")
        if name not in where:
            close = difflib.get_close_matches(str(name), sorted(where), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise GraphError(f"remat names {name!r}, which is no block or layer of graph "
                             f"{graph.name!r}{hint}")
        target = where[name]
        if resolved.get(target, policy) != policy:
            raise GraphError(f"remat asks for {resolved[target]!r} and {policy!r} for blocks of one "
                             f"scanned run ({target}); give them one policy, or compile without "
                             f"scan_blocks")
        if policy != "none":
            resolved[target] = policy
    return resolved
