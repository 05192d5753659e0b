"""compile(): passes, lowering and jit, giving a CompiledModel."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

import jax

from ..core.errors import GraphError, ShardingError
from ..ir.graph import Graph
from .flatten import flatten
from .lowering import checked, make_apply, make_init
from .passes import default_passes, run_passes
from .policy import Policy
from .program import Program

if TYPE_CHECKING:
    from ..distributed.plan import ShardingPlan

__all__ = ["compile", "CompiledModel"]


class CompiledModel:
    """A graph after the compiler's passes, with its pure, jitted ``init`` and ``apply``.

    Attributes:
      graph: the graph after the passes: inserted casts are nodes in it.
      source_graph: the graph given to ``compile``.
      policy: the dtype policy, or None.
      program: ``graph`` flattened into its steps (``mlaxgraph.compiler.program``):
        what init and apply run, and what the inspection tools walk.
      init: ``init(key) -> (params, state)``, jitted.
      apply: ``apply(params, state, *inputs, rng=None, inference_mode=False) ->
        (outputs, new_state)``, jitted with ``inference_mode`` static.
      init_fn, apply_fn: the same functions before ``jax.jit``, for composing into a
        wider jitted region (a train step); ``apply_fn`` has no run-time checks.
      checks: whether ``apply`` runs the run-time checks (``compile(..., checks=True)``).

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

    def __init__(self, graph: Graph, source_graph: Graph, policy: Policy | None,
                 program: Program, sharding: ShardingPlan | None = None, checks: bool = False):
        self.graph = graph
        self.source_graph = source_graph
        self.policy = policy
        self.program = program
        self.sharding = sharding  # a distributed.plan.ShardingPlan, or None without a mesh
        self.init_fn = make_init(program, (policy or Policy()).param_dtype, sharding)
        self.apply_fn = make_apply(program, sharding)
        created_sharded = {}
        if sharding is not None:  # init creates each weight on its devices
            created_sharded = {"out_shardings": (sharding.params, sharding.state)}
        self.init = jax.jit(self.init_fn, **created_sharded)
        self.checks = checks
        if checks:  # the checks are traced only here: checks=False costs nothing
            self.apply = checked(make_apply(program, sharding, checks=True))
        else:
            self.apply = jax.jit(self.apply_fn, static_argnames=("inference_mode",))

    # Inspection is in inspect.py; these are its user-facing entry points.

    def jaxpr(self, *example: Any, inference_mode: bool = False, **dims: int):
        """The ``jax.core.ClosedJaxpr`` of ``apply``, for arrays or dim values (``batch=8``)."""
        from ..analysis import lowered as inspect

        return inspect.jaxpr(self, *example, inference_mode=inference_mode, **dims)

    def hlo(self, *example: Any, optimized: bool = False, inference_mode: bool = False,
            debug_info: bool = True, **dims: int) -> str:
        """StableHLO text of the lowered ``apply`` (with locations naming each
        operation's layer unless ``debug_info=False``) or, with ``optimized=True``,
        XLA's optimized HLO text (whose metadata names the layers)."""
        from ..analysis import lowered as inspect

        return inspect.hlo(self, *example, optimized=optimized, inference_mode=inference_mode,
                           debug_info=debug_info, **dims)

    def cost(self, *example: Any, inference_mode: bool = False, **dims: int) -> dict[str, float]:
        """XLA's cost analysis of the compiled ``apply``: at least ``flops`` and
        ``bytes accessed``."""
        from ..analysis import lowered as inspect

        return inspect.cost(self, *example, inference_mode=inference_mode, **dims)

    def cost_table(self, *example: Any, inference_mode: bool = False, xla: bool = True,
                   **dims: int):
        """Per-layer params, FLOPs (forward and forward+backward) and activation bytes,
        as formulas of the symbolic dims and at the given ones, next to XLA's count of
        each layer: an ``mg.CostTable`` (mlaxgraph/cost_table.py)."""
        from ..analysis.cost import cost_table

        return cost_table(self, *example, inference_mode=inference_mode, xla=xla, **dims)

    def hlo_by_layer(self, *example: Any, optimized: bool = True, inference_mode: bool = False,
                     **dims: int):
        """Each layer with the StableHLO or (``optimized=True``) XLA optimized-HLO
        operations that compute it, traced through the named scopes: an
        ``mg.HloByLayer`` (mlaxgraph/hlo_layers.py)."""
        from ..analysis.hlo.by_layer import hlo_by_layer

        return hlo_by_layer(self, *example, optimized=optimized,
                            inference_mode=inference_mode, **dims)

    def export(self, *, inference_mode: bool = True, platforms=None):
        """A ``jax.export.Exported`` of ``apply(params, state, *inputs)`` with the
        symbolic dims kept symbolic."""
        from ..analysis import lowered as inspect

        return inspect.export(self, inference_mode=inference_mode, platforms=platforms)

    def save_hlo(self, directory, *example: Any, params=None, state=None,
                 inference_mode: bool = True, **dims: int):
        """Writes the export artifact (symbolic dims kept), its StableHLO, the StableHLO
        and optimized HLO at the given dims and, if given, the weights to
        ``directory``; ``mg.load_exported`` reads it back (mlaxgraph/exported.py)."""
        from ..io.exported import save_hlo

        return save_hlo(self, directory, *example, params=params, state=state,
                        inference_mode=inference_mode, **dims)

    def summary(self, expand_nested: bool = False) -> str:
        """The summary of the compiled graph: the policy's casts show as layers, weight
        sizes are at the policy's ``param_dtype``; compiled with a mesh, a ``sharding``
        column (docs/sharding.md) and a last line with the mesh and the rules."""
        from ..render.summary import summarize

        param_dtype = (self.policy or Policy()).param_dtype
        labels = None if self.sharding is None else self.sharding.labels()
        text = summarize(self.graph, expand_nested=expand_nested, param_dtype=param_dtype,
                         sharding=labels)
        text += f"\npolicy: {self.policy}"
        return text if self.sharding is None else text + "\n" + self.sharding.describe()

    def to_dot(self, **options: Any) -> str:
        """DOT text of the compiled graph (options as ``Graph.to_dot``), each layer
        labelled with its sharding when compiled with a mesh."""
        if self.sharding is not None:
            options.setdefault("sharding", self.sharding.labels())
        return self.graph.to_dot(**options)

    def render(self, path: Any, format: str | None = None, **options: Any):
        """Renders the compiled graph (as ``Graph.render``), with sharding labels
        when compiled with a mesh."""
        if self.sharding is not None:
            options.setdefault("sharding", self.sharding.labels())
        return self.graph.render(path, format=format, **options)

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


def compile(graph: Graph, policy: Policy | None = None, mesh: Any = None,
            rules: Any = None, checks: bool = False) -> CompiledModel:
    """Runs the compiler's passes on ``graph`` and lowers it to a jitted init/apply.

    Args:
      graph: the graph to compile.
      policy: the dtype policy. Without one, no casts are inserted: each layer
        computes in the dtype of its inputs (float32 for a float32 graph) and
        weights are float32.
      mesh: a ``jax.sharding.Mesh`` to run on (docs/sharding.md): ``init`` then
        creates the weights sharded and ``apply`` runs with matching shardings.
      rules: logical axis -> mesh axis (``{"batch": "data", "mlp": "model"}``); a
        logical axis without a rule is replicated. Needs ``mesh``.
      checks: make ``apply`` check, at run time through ``jax.experimental.checkify``,
        that embedding ids are in range and that no layer outputs NaN or inf, raising
        ``mg.CheckError`` naming the first layer that failed (docs/errors.md). Off by
        default: then nothing is checked and nothing is traced for it.

    Raises:
      GraphError, ShapeError, DTypeError: for a graph the passes reject, naming the
        layer and where it was created.
      ShardingError: for rules and axes that do not fit the mesh, naming the layer.
    """
    checks = bool(checks)
    if not isinstance(graph, Graph):
        raise GraphError(f"mg.compile takes a Graph, got {type(graph).__name__}")
    if policy is not None and not isinstance(policy, Policy):
        raise GraphError(f"policy must be an mg.Policy, got {type(policy).__name__}")
    if policy is not None:
        _check_overrides(graph, policy)
    if rules is not None and mesh is None:
        raise ShardingError("rules map logical axes to the axes of a mesh: pass mesh= too")
    compiled = run_passes(graph, default_passes(policy))
    program = flatten(compiled)
    if mesh is None:
        return CompiledModel(compiled, graph, policy, program, checks=checks)
    from ..distributed.plan import plan_sharding

    return CompiledModel(compiled, graph, policy, program, plan_sharding(program, mesh, rules),
                         checks=checks)
