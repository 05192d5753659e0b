"""The sharding plan: where a compiled graph's weights and activations live on a mesh.

``mg.compile(graph, mesh=mesh, rules={"batch": "data", "mlp": "model"})`` makes a
``ShardingPlan`` from the compiled program: a ``NamedSharding`` for every weight (from
its logical axes) and a ``PartitionSpec`` for every activation whose axes are known
(propagated from the inputs, ``activations.py``). The plan is data for the one
lowering: ``init`` creates the weights already sharded (``jax.jit`` with
``out_shardings``), and ``init_fn``/``apply_fn`` carry
``jax.lax.with_sharding_constraint`` on weights, inputs, every constrained activation
(the interpreter's hook) and the new state, so a wider jitted region built on them
(a train step) is sharded the same way. XLA's SPMD partitioner inserts the
communication; mlaxgraph only says where things live.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..core.axes import axes_str, weight_axes
from ..core.errors import MlaxGraphError, ShardingError, node_message
from ..core.specs import is_symbolic, shape_str
from .activations import propagate
from .rules import as_rules, auto_mesh, partition_spec, spec_str

if TYPE_CHECKING:
    from ..compiler.program import Program

__all__ = ["ShardingPlan", "plan_sharding"]


def _constrain_tree(values: Any, shardings: Any) -> Any:
    """``values`` with each array that has a sharding in ``shardings`` (a matching tree
    of dicts) constrained to it; entries without one pass unchanged, so a wrong tree
    still reaches the lowering's own, clearer error."""
    if isinstance(shardings, NamedSharding):
        if hasattr(values, "shape") and len(values.shape) == len(shardings.spec):
            return jax.lax.with_sharding_constraint(values, shardings)
        return values
    if isinstance(values, Mapping) and isinstance(shardings, Mapping):
        return {k: _constrain_tree(v, shardings[k]) if k in shardings else v
                for k, v in values.items()}
    return values


class ShardingPlan:
    """Where a compiled graph's weights and activations live on a mesh.

    Attributes:
      mesh: the mesh (its axes of type ``Auto``).
      rules: logical axis -> tuple of mesh axes.
      params, state: trees of ``NamedSharding`` shaped as ``init``'s params and state.
      activations: path (``layer`` or ``block/layer``) -> one PartitionSpec (or None,
        unconstrained) per output of the node; graph inputs by their names.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), axes=("batch", "embed"))
      >>> mesh = jax.make_mesh((1, 1), ("data", "model"))
      >>> model = mg.compile(mg.Graph(x, ops.Linear(4, name="fc")(x)), mesh=mesh,
      ...                    rules={"batch": "data", "mlp": "model"})
      >>> model.sharding.params["fc"]["kernel"].spec
      P(None, 'model')
      >>> model.sharding.labels()["fc"]
      'kernel[-,model] bias[model] out[data,model]'
      >>> print(model.sharding.describe())
      mesh: data=1 x model=1 (1 device); rules: batch->data, mlp->model
        fc  kernel[-,model] bias[model]
    """

    def __init__(self, mesh: Mesh, rules: dict, params: dict, state: dict,
                 activations: dict, weights: dict, ranks: dict, nodes: dict):
        self.mesh = mesh
        self.rules = rules
        self.params = params
        self.state = state
        self.activations = activations
        self._weights = weights  # path -> {weight path: (PartitionSpec, rank)}
        self._ranks = ranks      # path -> output ranks
        self._nodes = nodes      # path -> node, for errors

    # --- inside apply -------------------------------------------------------------------

    def constrain(self, path: str, values: tuple) -> tuple:
        """The interpreter's hook: the outputs of the node at ``path`` constrained to
        their PartitionSpecs (checking symbolic dims' values, known only now)."""
        specs = self.activations.get(path)
        if specs is None:
            return values
        out = []
        for index, (x, spec) in enumerate(zip(values, specs)):
            if spec is not None and len(x.shape) == len(spec):
                self._check_bound(path, index, x.shape, spec)
                x = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))
            out.append(x)
        return tuple(out)

    def _check_bound(self, path, index, shape, spec) -> None:
        for i, (size, entry) in enumerate(zip(shape, spec)):
            if entry is None or entry is P.UNCONSTRAINED or is_symbolic(size):
                continue
            targets = (entry,) if isinstance(entry, str) else tuple(entry)
            count = math.prod(self.mesh.shape[m] for m in targets)
            if size % count:
                node = self._nodes[path]
                raise ShardingError(node_message(
                    path, node.op.op_name, f"output {index} has dim {i} of size {size}, which mesh axis "
                              f"{'x'.join(map(repr, targets))} of size {count} does not divide",
                    got=f"{shape_str(shape)} sharded {spec_str(spec, len(shape))}",
                    expected=f"dim {i} divisible by {count} (e.g. a batch size that is a "
                             f"multiple of {count})",
                    source=node.source))

    def constrain_weights(self, params: Any, state: Any) -> tuple[Any, Any]:
        """``params`` and ``state`` constrained to their shardings (None passes)."""
        return (None if params is None else _constrain_tree(params, self.params),
                None if state is None else _constrain_tree(state, self.state))

    def shard_optimizer_state(self, optimizer, opt_state, params: Any = None):
        """``opt_state`` with every part that mirrors the params (Adam's moments, a
        momentum trace) constrained to the params' shardings, counters left alone.
        ``params``: the shardings of the weights the optimizer holds, when it holds a
        part of them (``subtree(plan.params, trainable)``); all of ``self.params`` by
        default.

        Inside ``jit``, ``optimizer.init(params)`` makes its ``zeros_like`` moments
        without looking at where the params live, so XLA replicates them; call this on
        its result to keep them sharded like the weights they follow.

        Example:
          >>> import jax, optax, mlaxgraph as mg
          >>> from mlaxgraph.examples import mlp
          >>> model = mg.compile(mlp(4, (8,), 2), mesh=jax.make_mesh((1, 1), ("data", "model")),
          ...                    rules={"mlp": "model"})
          >>> optimizer = optax.sgd(0.1, momentum=0.9)
          >>> params, state = model.init(jax.random.key(0))
          >>> opt_state = model.sharding.shard_optimizer_state(optimizer, optimizer.init(params))
          >>> opt_state[0].trace["dense"]["kernel"].sharding.spec
          P(None, 'model')
        """
        import optax

        return optax.tree_map_params(
            optimizer, lambda x, sharding: _constrain_tree(x, sharding), opt_state,
            self.params if params is None else params, transform_non_params=lambda x: x)

    # --- for people ----------------------------------------------------------------------

    def labels(self) -> dict[str, str]:
        """Path -> the node's sharding as the summary and the rendering show it:
        ``kernel[-,model] bias[model] out[data,model]`` (weights, then constrained
        outputs)."""
        result = {}
        for path in self._nodes:
            # Sharded weights only (the others are whole on every device); weights with
            # one leaf name and one spec are listed together: query,key,value/kernel[...].
            groups: dict[tuple[str, str], list[str]] = {}
            for name, (spec, rank) in self._weights.get(path, {}).items():
                if any(e is not None for e in spec):
                    parent, _, leaf = name.rpartition("/")
                    groups.setdefault((leaf, spec_str(spec, rank)), []).append(parent)
            parts = [f"{','.join(parents)}/{leaf}{text}" if parents[0] else f"{leaf}{text}"
                     for (leaf, text), parents in groups.items()]
            specs = self.activations.get(path) or ()
            ranks = self._ranks[path]
            for index, (spec, rank) in enumerate(zip(specs, ranks)):
                if spec is not None:
                    name = "out" if len(specs) == 1 else f"out{index}"
                    parts.append(f"{name}{spec_str(spec, rank)}")
            result[path] = " ".join(parts)
        return result

    def mesh_line(self) -> str:
        """One line: the mesh and the rules (the summary's last line)."""
        devices = self.mesh.devices.size
        mesh = " x ".join(f"{n}={s}" for n, s in self.mesh.shape.items())
        rules = ", ".join(f"{k}->{'+'.join(v) if v else 'None'}" for k, v in self.rules.items())
        return (f"mesh: {mesh} ({devices} device{'s' if devices != 1 else ''}); "
                f"rules: {rules or '(none: everything replicated)'}")

    def describe(self, collectives: Sequence[Any] | None = None) -> str:
        """The mesh and the rules, then each layer with sharded weights and their
        PartitionSpecs (``kernel[-,model]``: see ``labels``); with ``collectives`` (the
        list ``mlaxgraph.analysis.hlo.collectives.collectives(model, batch=...)`` gives),
        the collectives XLA inserted, counted per block (``h.0``) with the layers they
        came from."""
        lines = [self.mesh_line()]
        rows = []
        for path, weights in self._weights.items():
            specs = " ".join(f"{name}{spec_str(spec, rank)}" for name, (spec, rank) in weights.items()
                             if any(e is not None for e in spec))
            if specs:
                rows.append((path, specs))
        if rows:
            width = max(len(path) for path, _ in rows) + 2
            lines += [f"  {path:<{width}}{specs}" for path, specs in rows]
        if collectives is not None:
            per_block: dict[str, list[Any]] = {}
            for c in collectives:
                block = c.layer.split("/")[0].split(",")[0] if c.layer else "(no layer)"
                per_block.setdefault(block, []).append(c)
            lines.append("collectives per block:" + ("" if per_block else " none"))
            for block, found in per_block.items():
                kinds: dict[str, int] = {}
                for c in found:
                    kinds[c.kind] = kinds.get(c.kind, 0) + 1
                layers = sorted({layer for c in found for layer in c.layer.split(",")
                                 if layer in self._nodes or layer in self._weights})
                lines.append(f"  {block}: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                             + (f" ({', '.join(layers)})" if layers else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ShardingPlan {self.mesh_line()}>"


#: The logical axis names mlaxgraph's layers and conventions use: a rule for one of
#: them that this graph lacks is fine (one rule set serves several models: "heads" for
#: an MLP); any other name no weight or activation has is a typo.
CONVENTIONAL_AXES = frozenset({"batch", "length", "seq", "embed", "mlp", "heads", "kv", "kv_heads",
                               "vocab", "layers"})


def _check_logical_names(rules: dict, names: set[str]) -> None:
    """A rule for a logical axis that no weight or activation has and that is not a
    conventional name (a typo such as ``"mpl"``) would shard nothing without a word: an
    error naming it, with the graph's near names."""
    unknown = [name for name in rules if name not in names and name not in CONVENTIONAL_AXES]
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(names), n=3, cutoff=0.5)
        raise ShardingError(
            f"rules[{unknown[0]!r}]: no weight or activation of the graph has the logical axis "
            f"{unknown[0]!r}, so the rule would shard nothing"
            + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""),
            expected=f"logical axes of this graph: {', '.join(map(repr, sorted(names))) or '(none)'}")


def plan_sharding(program: Program, mesh: Any, rules: Mapping[str, Any] | None = None) -> ShardingPlan:
    """The sharding plan of a compiled graph's program on ``mesh`` under ``rules``.

    Raises:
      ShardingError: naming the layer and where it was created, for a rule that names a
        mesh axis the mesh lacks, a weight or activation dim its mesh axes do not
        divide, or axes that do not fit a weight (wrong rank, unknown weight path).
    """
    mesh = auto_mesh(mesh)
    rules = as_rules(rules)

    def fail(path, node, e: MlaxGraphError, got: str | None = None):
        raise ShardingError(node_message(path, node.op.op_name, e.problem, got=got,
                                         expected=e.expected, source=node.source)) from None

    weights: dict[str, dict] = {}  # owner step path -> {weight path: (PartitionSpec, rank)}
    weight_names: set[str] = set()  # the logical axis names of the weights
    for step in program.owners():
        try:
            p_axes, s_axes = weight_axes(step.op, step.input_specs)
        except MlaxGraphError as e:
            fail(step.path, step.node, e)
        specs = {}
        for name, (shape, axes) in {**p_axes, **s_axes}.items():
            try:
                specs[name] = (partition_spec(shape, axes, rules, mesh), len(shape))
            except MlaxGraphError as e:
                fail(step.path, step.node,
                     type(e)(f"weight {name!r} cannot be sharded: {e.problem}", expected=e.expected),
                     got=f"{name} {shape_str(shape)} with logical axes {axes_str(axes)}")
        weights[step.path] = specs
        weight_names.update(name for _, axes in {**p_axes, **s_axes}.values() for name in axes
                            if isinstance(name, str))

    def sharding_of(step, path, _spec):
        return NamedSharding(mesh, weights[step.path][path][0])

    params = program.weight_tree("params", sharding_of)
    state = program.weight_tree("state", sharding_of)
    nodes = dict(program.nodes)
    ranks = {path: tuple(s.rank for s in node.outputs) for path, node in nodes.items()}
    activations = {}
    for path, axes in propagate(program).items():
        node = nodes[path]
        out_specs = []
        for index, (spec_axes, out) in enumerate(zip(axes, node.outputs)):
            try:
                spec = partition_spec(out.shape, spec_axes, rules, mesh)
            except MlaxGraphError as e:
                fail(path, node, type(e)(f"output {index} cannot be sharded: {e.problem}; its "
                                         f"logical axes come from its inputs and weights "
                                         f"(ops.constrain sets them)", expected=e.expected),
                     got=f"{out} with logical axes {axes_str(spec_axes)}")
            out_specs.append(None if all(e is P.UNCONSTRAINED for e in spec) else spec)
        activations[path] = tuple(out_specs) if any(s is not None for s in out_specs) else None
    for name, targets in rules.items():
        missing = [m for m in targets if m not in mesh.shape]
        if missing:
            raise ShardingError(f"rules[{name!r}] names mesh axis {missing[0]!r}, which the mesh "
                                f"does not have; its axes are {', '.join(map(repr, mesh.axis_names))}")
    _check_logical_names(rules, weight_names | {
        name for axes in propagate(program).values() for out in axes for name in out
        if isinstance(name, str)})
    return ShardingPlan(mesh, rules, params, state, activations, weights, ranks, nodes)
