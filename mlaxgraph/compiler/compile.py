"""compile(): passes, lowering and jit, giving a CompiledModel."""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ..core.donated import refuse_deleted
from ..core.errors import ConfigError, GraphError, ShardingError
from ..core.signatures import unknown_keywords
from ..core.specs import dim_names
from ..ir.graph import Graph
from . import stages
from .entry_points import model_apply
from .flatten import flatten
from .lowering import checked, make_apply, make_init
from .memory import gradient_step, parse_bytes, plan_memory
from .passes import default_passes, run_passes
from .policy import Policy
from .program import Program
from .remat import resolve_remat
from .reuse import ModelInit, ReuseReport
from .stacking import stack_weights, unstack_weights
from .taps import Taps, plan_taps
from .weights import refuse_unread_adapters, refusing_unread_adapters
from .xla_options import INIT_COMPILER_OPTIONS, init_compiler_options

if TYPE_CHECKING:
    from ..distributed.plan import ShardingPlan

__all__ = ["compile", "CompiledModel", "INIT_COMPILER_OPTIONS"]

class CompiledModel:
    """A graph after the compiler's passes, with its pure, jitted ``init`` and ``apply``.

    Attributes:
      graph: the graph after the passes: inserted casts are nodes in it.
      source_graph: the graph given to ``compile``.
      policy: the dtype policy, or None.
      program: ``graph`` flattened into its steps (``mlaxgraph.compiler.program``):
        what init and apply run, and what the inspection tools walk.
      init: ``init(key, reuse=None) -> (params, state)``, jitted; with ``reuse=(params,
        state)`` every weight whose path, shape and dtype are unchanged is kept from
        it (``reuse_report`` says which) and only the others are drawn.
      apply: ``apply(params, state, *inputs, rng=None, inference_mode=False,
        capture=None, intervene=None) -> (outputs, new_state)``, jitted with
        ``inference_mode`` static; with ``capture`` (paths or patterns) it returns
        ``(outputs, new_state, captured)``, ``captured`` a dict from concrete path to
        that layer's or block's output; ``intervene`` (path or pattern -> ``fn(value)``
        or ``fn(value, path)``) replaces those outputs (docs/surgery.md).
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
        self._memory_plan = None  # set by compile() when planned for a memory budget
        self.sharding = sharding  # a distributed.plan.ShardingPlan, or None without a mesh
        self.init_fn = make_init(program, (policy or Policy()).param_dtype, sharding)
        self.apply_fn = make_apply(program, sharding)
        # init runs once: compiled for compile time (the values are the same, bit for bit)
        if sharding is None:
            init = jax.jit(self.init_fn, compiler_options=init_compiler_options())
        else:  # init creates each weight on its devices
            init = jax.jit(self.init_fn, out_shardings=(sharding.params, sharding.state),
                           compiler_options=init_compiler_options())
        self.init = ModelInit(init, self.init_fn, program, (policy or Policy()).param_dtype,
                              sharding, init_compiler_options())
        self.checks = checks

        def tapped(taps: Taps, functions: tuple) -> Callable:
            plan_taps(program, taps)  # names every pattern that matches nothing, now

            def run_tapped(params, state, *inputs, tap_values=(), rng=None,
                           inference_mode: bool = False):
                # the intervention functions read their floats and arrays as traced values
                refuse_unread_adapters(program, params)
                bound = taps.bound(functions, tap_values)
                return make_apply(program, sharding, checks=checks, taps=bound)(
                    params, state, *inputs, rng=rng, inference_mode=inference_mode)

            if checks:
                return checked(run_tapped)
            return jax.jit(run_tapped, static_argnames=("inference_mode",))

        if checks:  # the checks are traced only here: checks=False costs nothing
            plain = checked(refusing_unread_adapters(program, make_apply(program, sharding, checks=True)))
        else:
            plain = jax.jit(refusing_unread_adapters(program, self.apply_fn),
                            static_argnames=("inference_mode",))
        self.apply = model_apply(plain, tapped)

    def tapped_apply_fn(self, taps: Taps) -> Any:
        """The pure ``apply`` (before jit, for a wider jitted region such as a train
        step) with ``taps`` (``mlaxgraph.compiler.taps.Taps.of(capture, intervene)``),
        returning ``(outputs, new_state, captured)``; ``None`` (what ``Taps.of`` gives
        for nothing to tap) captures nothing."""
        if taps is None:
            taps = Taps()
        if not isinstance(taps, Taps):
            raise GraphError(f"tapped_apply_fn takes the Taps of Taps.of(capture, intervene), "
                             f"got {type(taps).__name__}")
        plan_taps(self.program, taps)
        return make_apply(self.program, self.sharding, taps=taps)

    def reuse_report(self, params: Any, state: Any) -> ReuseReport:
        """What ``init(key, reuse=(params, state))`` would keep, draw new and drop, by
        weight path (nothing is drawn: the shapes come from the program); weights given
        one block at a time for a model that scans them are compared stacked."""
        return self.init.report((params, state))

    # The lowered forms are in compiler/stages.py, the cost table and HLO by layer in
    # mlaxgraph.analysis, the export artifact in mlaxgraph.io; these are their entry points.

    def jaxpr(self, *example: Any, inference_mode: bool = False, **dims: int):
        """The ``jax.core.ClosedJaxpr`` of ``apply``, for arrays or dim values (``batch=8``)."""
        return stages.jaxpr(self, *example, inference_mode=inference_mode, **dims)

    def hlo(self, *example: Any, optimized: bool = False, inference_mode: bool = False,
            debug_info: bool = True, **dims: int) -> str:
        """StableHLO text of the lowered ``apply`` (with locations naming each
        operation's layer unless ``debug_info=False``) or, with ``optimized=True``,
        XLA's optimized HLO text (whose metadata names the layers)."""
        return stages.hlo(self, *example, optimized=optimized, inference_mode=inference_mode,
                           debug_info=debug_info, **dims)

    def cost(self, *example: Any, inference_mode: bool = False, **dims: int) -> dict[str, float]:
        """XLA's cost analysis of the compiled ``apply``: at least ``flops`` and
        ``bytes accessed``."""
        return stages.cost(self, *example, inference_mode=inference_mode, **dims)

    def cost_table(self, *example: Any, inference_mode: bool = False, xla: bool = True,
                   **dims: int):
        """Per-layer params, FLOPs (forward and forward+backward) and activation bytes,
        as formulas of the symbolic dims and at the given ones, next to XLA's count of
        each layer: an ``mg.CostTable`` (``mlaxgraph.analysis.cost``)."""
        from ..analysis.cost import cost_table

        return cost_table(self, *example, inference_mode=inference_mode, xla=xla, **dims)

    def hlo_by_layer(self, *example: Any, optimized: bool = True, inference_mode: bool = False,
                     **dims: int):
        """Each layer with the StableHLO or (``optimized=True``) XLA optimized-HLO
        operations that compute it, traced through the named scopes: an
        ``mg.HloByLayer`` (``mlaxgraph.analysis.hlo.by_layer``)."""
        from ..analysis.hlo.by_layer import hlo_by_layer

        return hlo_by_layer(self, *example, optimized=optimized,
                            inference_mode=inference_mode, **dims)

    def export(self, *, inference_mode: bool = True, platforms=None, **unknown: Any):
        """A ``jax.export.Exported`` of ``apply(params, state, *inputs)`` with the
        symbolic dims kept symbolic."""
        if unknown:
            raise ConfigError(unknown_keywords("export", unknown,
                                               "export(*, inference_mode=True, platforms=None)"))
        return stages.export(self, inference_mode=inference_mode, platforms=platforms)

    def to_onnx(self, path: Any, params: Any = None, state: Any = None, *, opset: int = 21,
                **unknown: Any):
        """The compiled graph (with the casts its policy inserted) written as ONNX with
        its weights; see ``Graph.to_onnx``."""
        from ..onnx.writer import to_onnx

        return to_onnx(self.graph, path, params, state, opset=opset, **unknown)

    def save_hlo(self, directory, *example: Any, params=None, state=None,
                 inference_mode: bool = True, **dims: int):
        """Writes the export artifact (symbolic dims kept), its StableHLO, the StableHLO
        and optimized HLO at the given dims and, if given, the weights to
        ``directory``; ``mg.load_exported`` reads it back (``mlaxgraph.io.exported``)."""
        from ..io.exported import save_hlo

        return save_hlo(self, directory, *example, params=params, state=state,
                        inference_mode=inference_mode, **dims)

    def memory_plan(self):
        """What ``memory_budget`` chose: an ``mlaxgraph.compiler.memory.MemoryPlan``
        with the choice, the predicted and the measured peak."""
        if self._memory_plan is None:
            raise GraphError("this model was compiled without memory_budget: "
                             "mg.compile(graph, memory_budget='2GiB', dims={'batch': 64})")
        return self._memory_plan

    def stack_weights(self, params: Any, state: Any = None) -> tuple[Any, Any]:
        """``(params, state)`` in the graph's own layout (each block's weights under its
        name, as ``mg.load`` gives them) -> this model's layout, where each scanned
        run's weights are stacked under the scan's name. Any tree holding the layout
        works (gradients, optimizer states); either argument may be None."""
        refuse_deleted("stack_weights", params=params, state=state)
        return stack_weights(self.program, params, state)

    def unstack_weights(self, params: Any, state: Any = None) -> tuple[Any, Any]:
        """The inverse of ``stack_weights``: this model's layout -> the graph's own."""
        refuse_deleted("unstack_weights", params=params, state=state)
        return unstack_weights(self.program, params, state)

    def summary(self, expand_nested: bool = False, **unknown: Any) -> str:
        """The summary of the compiled graph: the policy's casts show as layers, weight
        sizes are at the policy's ``param_dtype``; compiled with a mesh, a ``sharding``
        column (docs/sharding.md) and a last line with the mesh and the rules."""
        from ..render.summary import summarize

        param_dtype = (self.policy or Policy()).param_dtype
        labels = None if self.sharding is None else self.sharding.labels()
        text = summarize(self.graph, expand_nested=expand_nested, param_dtype=param_dtype,
                         sharding=labels, unknown=unknown)
        text += f"\npolicy: {self.policy}"
        remat = self.remat
        if remat:
            text += "\nremat: " + ", ".join(f"{path} {policy}" for path, policy in remat.items())
        return text if self.sharding is None else text + "\n" + self.sharding.mesh_line()

    @property
    def remat(self) -> dict[str, str]:
        """Block or layer path -> its rematerialization policy (``"full"``, ``"dots"``)."""
        return self.program.checkpoints()

    def to_dot(self, **options: Any) -> str:
        """DOT text of the compiled graph (options as ``Graph.to_dot``), each layer
        labelled with its sharding when compiled with a mesh and its
        rematerialization when compiled with one."""
        if self.sharding is not None:
            options.setdefault("sharding", self.sharding.labels())
        options.setdefault("remat", self.remat)
        return self.graph.to_dot(**options)

    def render(self, path: Any, format: str | None = None, **options: Any):
        """Renders the compiled graph (as ``Graph.render``), with sharding labels
        when compiled with a mesh."""
        if self.sharding is not None:
            options.setdefault("sharding", self.sharding.labels())
        options.setdefault("remat", self.remat)
        return self.graph.render(path, format=format, **options)

    def to_html(self, path: Any = None, *, hlo: bool = False, **options: Any):
        """The explorer page of the compiled graph (docs/explorer.md): casts, weights at
        the policy's dtype, sharding and, with ``hlo=True``, each layer's optimized HLO
        operations (give every symbolic dim: ``batch=8``). The text, or with ``path``
        the page written there and its path."""
        from ..render.html.page import to_html

        return to_html(self, path, hlo=hlo, **options)

    def _repr_html_(self):
        from ..render.html.page import notebook_html

        return notebook_html(self.to_html())

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


_COMPILE_SIGNATURE = ("compile(graph, policy=None, mesh=None, rules=None, scan_blocks=False, "
                      "remat=None, memory_budget=None, dims=None, checks=False)")
_POLICY_HINT = "the dtypes are the policy's: policy='bfloat16' or mg.Policy(compute_dtype=...)"
#: Where what mg.compile does not take belongs.
_COMPILE_HINTS = {"dtype": _POLICY_HINT, "compute_dtype": _POLICY_HINT, "param_dtype": _POLICY_HINT,
                  "scan": "scan_blocks=True folds runs of equal blocks on lax.scan",
                  "checkpoint": "remat='full' recomputes each block in the backward pass",
                  "jit": "init and apply are always jitted"}


def compile(graph: Graph, policy: Policy | str | None = None, mesh: Any = None,
            rules: Any = None, *, scan_blocks: bool | str = False, remat: Any = None,
            memory_budget: Any = None, dims: Mapping[str, int] | None = None,
            checks: bool = False, **unknown: Any) -> CompiledModel:
    """Runs the compiler's passes on ``graph`` and lowers it to a jitted init/apply.

    Args:
      graph: the graph to compile.
      policy: the dtype policy, an ``mg.Policy`` or a name of ``Policy.named``
        (``"bfloat16"``, ``"float16"``, ``"float32"``; Keras's ``"mixed_bfloat16"``).
        Without one, no casts are inserted: each layer computes in the dtype of its
        inputs (float32 for a float32 graph) and weights are float32.
      mesh: a ``jax.sharding.Mesh`` to run on (docs/sharding.md): ``init`` then
        creates the weights sharded and ``apply`` runs with matching shardings.
      rules: logical axis -> mesh axis (``{"batch": "data", "mlp": "model"}``); a
        logical axis without a rule is replicated. Needs ``mesh``.
      scan_blocks: ``True``: fold each run of calls of equal blocks (each with its
        own weights, each reading the previous one's output) where folding pays (runs
        of ``SCAN_MIN_RUN`` or more blocks, the measured rule ``scan_pays``) into one
        ``scan`` node, run by ``lax.scan`` over the blocks' stacked weights: the block
        is traced and compiled once (docs/deep_models.md, "When to scan").
        ``"always"``: fold every run of two or more. ``init`` then gives a folded
        run's weights stacked (the same values); ``stack_weights``/``unstack_weights``
        convert.
      remat: what the backward pass recomputes instead of keeping (docs/deep_models.md):
        ``"none"`` (the default), ``"full"`` (each block, or each layer of a graph
        without blocks, under ``jax.checkpoint``), ``"dots"`` (keep only matmul results
        without batch dims), or a dict of block or layer names to those.
      memory_budget: bytes, or a size such as ``"2GiB"``: a planner chooses the
        rematerialization (instead of ``remat``) so that the gradient step's peak
        memory, measured by XLA at ``dims``, fits; ``model.memory_plan()`` shows it.
      dims: the symbolic dims' values (``{"batch": 64}``) the budget is for.
      checks: make ``apply`` check, at run time through ``jax.experimental.checkify``,
        that embedding ids are in range and that no layer outputs NaN or inf, raising
        ``mg.CheckError`` naming the first layer that failed (docs/errors.md). Off by
        default: then nothing is checked and nothing is traced for it.

    Raises:
      GraphError, ShapeError, DTypeError: for a graph the passes reject, naming the
        layer and where it was created.
      ShardingError: for rules and axes that do not fit the mesh, naming the layer.
    """
    if unknown:
        raise GraphError(unknown_keywords("compile", unknown, _COMPILE_SIGNATURE, _COMPILE_HINTS))
    checks = bool(checks)
    if not isinstance(graph, Graph):
        raise GraphError(f"mg.compile takes a Graph, got {type(graph).__name__}")
    if isinstance(policy, str):  # Keras's mixed_precision.Policy("mixed_bfloat16") by name
        policy = Policy.named(policy)
    if policy is not None and not isinstance(policy, Policy):
        raise GraphError(f"policy must be an mg.Policy or its name ('bfloat16', 'float16', "
                         f"'float32'), got {type(policy).__name__}")
    if policy is not None:
        _check_overrides(graph, policy)
    if rules is not None and mesh is None:
        raise ShardingError("rules map logical axes to the axes of a mesh: pass mesh= too")
    memo = graph.memo("compile")  # the passes' result, for this graph and these options
    scan = _scan_option(scan_blocks)
    key = (policy, scan)
    compiled = memo.get(key)
    if compiled is None:
        compiled = memo[key] = run_passes(graph, default_passes(policy, scan_blocks=scan))
    plan = None
    if memory_budget is not None:
        if remat is not None:
            raise GraphError("give remat or memory_budget, not both: the planner chooses the remat")
        plan = _plan_memory(compiled, policy, memory_budget, dims)
        remat = dict(plan.choice)
    program = flatten(compiled, remat=resolve_remat(compiled, remat))
    sharding = None
    if mesh is not None:
        from ..distributed.plan import plan_sharding

        sharding = plan_sharding(program, mesh, rules)
    model = CompiledModel(compiled, graph, policy, program, sharding, checks=checks)
    model._memory_plan = plan
    return model


def _scan_option(scan_blocks: Any) -> bool | str:
    if scan_blocks == "always" or isinstance(scan_blocks, bool):
        return scan_blocks
    raise GraphError(f"scan_blocks is True (fold the runs of equal blocks where it pays), "
                     f"'always' (every run of two or more) or False; got {scan_blocks!r}")


def _plan_memory(compiled: Graph, policy: Policy | None, budget: Any, dims: Mapping[str, int] | None):
    """The planner's choice for ``memory_budget`` (compiler/memory.py): each choice
    measured on the compiled gradient step at ``dims``."""
    budget = parse_bytes(budget)
    dims = dict(dims or {})
    needed = [n for s in compiled.input_specs for n in dim_names(s.shape)]
    missing = [n for n in dict.fromkeys(needed) if n not in dims]
    if missing:
        raise GraphError(f"memory_budget plans for given sizes: pass dims={{{missing[0]!r}: ...}} "
                         f"(the graph's symbolic dims: {', '.join(dict.fromkeys(needed))})")
    param_dtype = (policy or Policy()).param_dtype
    base = flatten(compiled)
    params, state = jax.eval_shape(make_init(base, param_dtype), jax.random.key(0))
    inputs = tuple(s.bind(dims) for s in compiled.input_specs)

    def measure(choice):
        program = flatten(compiled, remat=resolve_remat(compiled, dict(choice)))
        return gradient_step(make_apply(program), params, state, inputs)

    arguments = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), (params, state, inputs))

    def time_step(step) -> float:
        jax.block_until_ready(step(*arguments))
        start = time.perf_counter()
        jax.block_until_ready(step(*arguments))
        return time.perf_counter() - start

    return plan_memory(base, budget, dims, measure, time_step)
