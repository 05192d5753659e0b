"""The compiler's pass pipeline: each pass a pure Graph -> Graph function, the graph
verified after each, and a broken graph blamed on the pass that broke it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ...core.errors import GraphError, MlaxGraphError
from ...ir.graph import Graph
from ..policy import Policy
from .eliminate_dead_nodes import eliminate_dead_nodes
from .fold_repeated_blocks import fold_repeated_blocks, scan_pays
from .infer_shapes import infer_shapes
from .insert_casts import insert_casts
from .remove_redundant_casts import remove_redundant_casts
from .verify import verify

__all__ = ["default_passes", "run_passes"]

Pass = Callable[[Graph], Graph]


def default_passes(policy: Policy | None, scan_blocks: bool | str = False) -> list[tuple[str, Pass]]:
    """The passes ``mg.compile`` runs, by name, in order. Without a policy no casts
    are inserted: each layer computes in the dtype of its inputs. With
    ``scan_blocks``, runs of equal blocks are folded last (after the casts, so blocks
    that a policy override makes different stay apart): ``True`` the runs where
    folding pays (``scan_pays``), ``"always"`` every run of two or more."""
    passes: list[tuple[str, Pass]] = [("infer_shapes", infer_shapes)]
    if policy is not None:
        passes.append(("insert_casts", functools.partial(insert_casts, policy=policy)))
    passes.append(("remove_redundant_casts", remove_redundant_casts))
    passes.append(("eliminate_dead_nodes", eliminate_dead_nodes))
    if scan_blocks == "always":
        passes.append(("fold_repeated_blocks", fold_repeated_blocks))
    elif scan_blocks:
        passes.append(("fold_repeated_blocks", functools.partial(fold_repeated_blocks, where=scan_pays)))
    return passes


def run_passes(graph: Graph, passes: Sequence[tuple[str, Pass]]) -> Graph:
    """Verifies ``graph``, then runs each pass and verifies its result."""
    verify(graph)
    for name, transform in passes:
        result = transform(graph)
        if not isinstance(result, Graph):
            raise GraphError(f"pass {name!r} returned {type(result).__name__}, not a Graph")
        try:
            verify(result)
        except MlaxGraphError as e:
            raise GraphError(f"pass {name!r} produced an invalid graph:\n{e}") from e
        graph = result
    return graph
