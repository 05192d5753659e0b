"""compile(): passes, lowering and jit, giving a CompiledModel."""

from __future__ import annotations

import difflib
from typing import Any

import jax

from .errors import GraphError
from .ir.graph import Graph
from .lowering import make_apply, make_init
from .passes import default_passes, run_passes
from .policy import Policy

__all__ = ["compile", "CompiledModel"]


class CompiledModel:
    """A graph after the compiler's passes, with its pure, jitted ``init`` and ``apply``.

    Attributes:
      graph: the graph after the passes: inserted casts are nodes in it.
      source_graph: the graph given to ``compile``.
      policy: the dtype policy, or None.
      init: ``init(key) -> (params, state)``, jitted.
      apply: ``apply(params, state, *inputs, rng=None, inference_mode=False) ->
        (outputs, new_state)``, jitted with ``inference_mode`` static.
      init_fn, apply_fn: the same functions before ``jax.jit``, for composing into a
        wider jitted region (a train step).

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 4))
      >>> model = mg.compile(mg.Graph(x, ops.Linear(2, name="fc")(x)))
      >>> params, state = model.init(jax.random.key(0))
      >>> jax.tree.map(jnp.shape, params)
      {'fc': {'bias': (2,), 'kernel': (4, 2)}}
      >>> out, state = model.apply(params, state, jnp.ones((3, 4)))
      >>> out.shape
      (3, 2)
    """

    def __init__(self, graph: Graph, source_graph: Graph, policy: Policy | None):
        self.graph = graph
        self.source_graph = source_graph
        self.policy = policy
        self.init_fn = make_init(graph, (policy or Policy()).param_dtype)
        self.apply_fn = make_apply(graph)
        self.init = jax.jit(self.init_fn)
        self.apply = jax.jit(self.apply_fn, static_argnames=("inference_mode",))

    # Inspection is in inspect.py; these are its user-facing entry points.

    def jaxpr(self, *example: Any, inference_mode: bool = False, **dims: int):
        """The ``jax.core.ClosedJaxpr`` of ``apply``, for arrays or dim values (``batch=8``)."""
        from . import inspect

        return inspect.jaxpr(self, *example, inference_mode=inference_mode, **dims)

    def hlo(self, *example: Any, optimized: bool = False, inference_mode: bool = False,
            debug_info: bool = True, **dims: int) -> str:
        """StableHLO text of the lowered ``apply`` (with locations naming each
        operation's layer unless ``debug_info=False``) or, with ``optimized=True``,
        XLA's optimized HLO text (whose metadata names the layers)."""
        from . import inspect

        return inspect.hlo(self, *example, optimized=optimized, inference_mode=inference_mode,
                           debug_info=debug_info, **dims)

    def cost(self, *example: Any, inference_mode: bool = False, **dims: int) -> dict[str, float]:
        """XLA's cost analysis of the compiled ``apply``: at least ``flops`` and
        ``bytes accessed``."""
        from . import inspect

        return inspect.cost(self, *example, inference_mode=inference_mode, **dims)

    def export(self, *, inference_mode: bool = True, platforms=None):
        """A ``jax.export.Exported`` of ``apply(params, state, *inputs)`` with the
        symbolic dims kept symbolic."""
        from . import inspect

        return inspect.export(self, inference_mode=inference_mode, platforms=platforms)

    def summary(self, expand_nested: bool = False) -> str:
        """The summary of the compiled graph: the policy's casts show as layers, weight
        sizes are at the policy's ``param_dtype``."""
        from .ir.summary import summarize

        param_dtype = (self.policy or Policy()).param_dtype
        text = summarize(self.graph, expand_nested=expand_nested, param_dtype=param_dtype)
        return text + f"\npolicy: {self.policy}"

    def _repr_html_(self):
        return self.graph._repr_html_()

    def __repr__(self) -> str:
        return f"<CompiledModel {self.graph.name!r} policy={self.policy}>"


def _check_overrides(graph: Graph, policy: Policy) -> None:
    """An override must name a layer of the graph (or of a nested block)."""
    layers = {node.layer for _, node in graph.walk()}
    for name, _ in policy.overrides:
        if name not in layers:
            close = difflib.get_close_matches(name, sorted(layers), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise GraphError(f"Policy.overrides names {name!r}, which is no layer of graph "
                             f"{graph.name!r}{hint}")


def compile(graph: Graph, policy: Policy | None = None) -> CompiledModel:
    """Runs the compiler's passes on ``graph`` and lowers it to a jitted init/apply.

    Args:
      graph: the graph to compile.
      policy: the dtype policy. Without one, no casts are inserted: each layer
        computes in the dtype of its inputs (float32 for a float32 graph) and
        weights are float32.

    Raises:
      GraphError, ShapeError, DTypeError: for a graph the passes reject, naming the
        layer and where it was created.
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"mg.compile takes a Graph, got {type(graph).__name__}")
    if policy is not None and not isinstance(policy, Policy):
        raise GraphError(f"policy must be an mg.Policy, got {type(policy).__name__}")
    if policy is not None:
        _check_overrides(graph, policy)
    compiled = run_passes(graph, default_passes(policy))
    return CompiledModel(compiled, graph, policy)
