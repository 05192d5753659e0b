"""Sharding: a graph's logical axes mapped onto a device mesh by rules.

``mg.compile(graph, mesh=mesh, rules={"batch": "data", "mlp": "model"})`` makes a
``ShardingPlan``: a ``NamedSharding`` for every weight (from its logical axes) and a
``PartitionSpec`` for every activation whose axes are known (from the inputs' axes,
propagated through the graph). The compiled ``init`` creates the weights already
sharded (``jax.jit`` with ``out_shardings``; each device computes only its shard), and
``init_fn``/``apply_fn`` carry ``jax.lax.with_sharding_constraint`` on weights, inputs,
every constrained activation and the new state, so a wider jitted region built on them
(a train step) is sharded the same way. XLA's SPMD partitioner inserts the
communication; mlaxgraph only says where things live.

Rules: a logical axis maps to a mesh axis, a tuple of mesh axes or None; a logical
axis with no rule is not sharded (replicated). A mesh axis shards at most one dim of
an array: a later dim whose rule names a mesh axis already used stays whole (so
``{"batch": "data", "embed": "data"}`` shards weights on ``embed`` and activations on
``batch``, FSDP-style).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from .axes import UNKNOWN, axes_str, propagate, weight_axes
from .errors import MlaxGraphError, ShardingError, node_message
from .specs import is_symbolic, shape_str

__all__ = ["ShardingPlan", "plan_sharding", "as_rules", "auto_mesh", "spec_str",
           "shard_batch", "abstract_init"]


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


def _spec(shape, axes, rules, mesh: Mesh) -> P:
    """The PartitionSpec of an array with these logical axes. Raises a short
    ShardingError (the caller names the layer) for a rule naming a mesh axis the mesh
    lacks or a concrete dim its mesh axes do not divide."""
    entries, used = [], set()
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


def _walk(graph, prefix: str = ""):
    """(path, graph, node) of every node, each block call's nodes under its own path,
    as the lowering runs them."""
    from .ir.graph import Block

    for node in graph.nodes:
        yield prefix + node.name, graph, node
        if isinstance(node.op, Block):
            yield from _walk(node.op.graph, f"{prefix}{node.name}/")


def _nest(flat: Mapping[str, Any]) -> dict:
    """``{"query/kernel": x}`` -> ``{"query": {"kernel": x}}``."""
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        level = tree
        for part in parents:
            level = level.setdefault(part, {})
        level[leaf] = value
    return tree


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
      >>> model.sharding.describe()
      'mesh: data=1 x model=1 (1 device); rules: batch->data, mlp->model'
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

    def sharded_init(self, init_fn: Callable) -> Callable:
        """``init_fn`` with its params and state constrained to their shardings."""

        @functools.wraps(init_fn)
        def init(key):
            params, state = init_fn(key)
            return _constrain_tree(params, self.params), _constrain_tree(state, self.state)

        return init

    def sharded_apply(self, graph) -> Callable:
        """``apply`` of ``graph`` with weights, inputs, activations and new state
        constrained."""
        from .lowering import make_apply

        inner = make_apply(graph, constrain=self.constrain)

        @functools.wraps(inner)
        def apply(params, state, *inputs, rng=None, inference_mode: bool = False):
            outputs, new_state = inner(_constrain_tree(params, self.params),
                                       _constrain_tree(state, self.state), *inputs,
                                       rng=rng, inference_mode=inference_mode)
            return outputs, _constrain_tree(new_state, self.state)

        return apply

    def shard_optimizer_state(self, optimizer, opt_state):
        """``opt_state`` with every part that mirrors the params (Adam's moments, a
        momentum trace) constrained to the params' shardings, counters left alone.

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
            optimizer, lambda x, sharding: _constrain_tree(x, sharding), opt_state, self.params,
            transform_non_params=lambda x: x)

    # --- for people ----------------------------------------------------------------------

    def labels(self) -> dict[str, str]:
        """Path -> the node's sharding as the summary and the rendering show it:
        ``kernel[-,model] bias[model] out[data,model]`` (weights, then constrained
        outputs)."""
        result = {}
        for path, node in self._nodes.items():
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

    def describe(self) -> str:
        """One line: the mesh and the rules."""
        devices = self.mesh.devices.size
        mesh = " x ".join(f"{n}={s}" for n, s in self.mesh.shape.items())
        rules = ", ".join(f"{k}->{'+'.join(v) if v else 'None'}" for k, v in self.rules.items())
        return (f"mesh: {mesh} ({devices} device{'s' if devices != 1 else ''}); "
                f"rules: {rules or '(none: everything replicated)'}")

    def __repr__(self) -> str:
        return f"<ShardingPlan {self.describe()}>"


def plan_sharding(graph, mesh: Any, rules: Mapping[str, Any] | None = None) -> ShardingPlan:
    """The sharding plan of a (compiled) graph on ``mesh`` under ``rules``.

    Raises:
      ShardingError: naming the layer and where it was created, for a rule that names a
        mesh axis the mesh lacks, a weight or activation dim its mesh axes do not
        divide, or axes that do not fit a weight (wrong rank, unknown weight path).
    """
    from .ir.graph import Block

    mesh = auto_mesh(mesh)
    rules = as_rules(rules)
    nodes, weights, ranks = {}, {}, {}

    def fail(path, node, e: MlaxGraphError, got: str | None = None):
        op = node.op.op_name
        raise ShardingError(node_message(path, op, e.problem, got=got, expected=e.expected,
                                         source=node.source)) from None

    def weights_of(graph, prefix):
        params, state = {}, {}
        for node in graph.nodes:
            if node.name in graph.inputs or node.layer in params or node.layer in state:
                continue
            path = prefix + node.name
            if isinstance(node.op, Block):
                p, s = weights_of(node.op.graph, path + "/")
            else:
                try:
                    p_axes, s_axes = weight_axes(node.op, graph.input_specs_of(node))
                except MlaxGraphError as e:
                    fail(path, node, e)
                specs = {}
                for group in (p_axes, s_axes):
                    for name, (shape, axes) in group.items():
                        try:
                            specs[name] = (_spec(shape, axes, rules, mesh), len(shape))
                        except MlaxGraphError as e:
                            fail(path, node, type(e)(f"weight {name!r} cannot be sharded: {e.problem}",
                                                     expected=e.expected),
                                 got=f"{name} {shape_str(shape)} with logical axes {axes_str(axes)}")
                weights[path] = specs
                p = _nest({k: NamedSharding(mesh, specs[k][0]) for k in p_axes})
                s = _nest({k: NamedSharding(mesh, specs[k][0]) for k in s_axes})
            if p:
                params[node.layer] = p
            if s:
                state[node.layer] = s
        return params, state

    params, state = weights_of(graph, "")
    activations = {}
    for path, _, node in _walk(graph):
        nodes[path] = node
        ranks[path] = tuple(s.rank for s in node.outputs)
    for path, axes in propagate(graph).items():
        node = nodes[path]
        specs = []
        for index, (spec_axes, out) in enumerate(zip(axes, node.outputs)):
            try:
                spec = _spec(out.shape, spec_axes, rules, mesh)
            except MlaxGraphError as e:
                fail(path, node, type(e)(f"output {index} cannot be sharded: {e.problem}; its "
                                         f"logical axes come from its inputs and weights "
                                         f"(ops.constrain sets them)", expected=e.expected),
                     got=f"{out} with logical axes {axes_str(spec_axes)}")
            specs.append(None if all(e is P.UNCONSTRAINED for e in spec) else spec)
        activations[path] = tuple(specs) if any(s is not None for s in specs) else None
    for name, targets in rules.items():
        missing = [m for m in targets if m not in mesh.shape]
        if missing:
            raise ShardingError(f"rules[{name!r}] names mesh axis {missing[0]!r}, which the mesh "
                                f"does not have; its axes are {', '.join(map(repr, mesh.axis_names))}")
    return ShardingPlan(mesh, rules, params, state, activations, weights, ranks, nodes)


def _plan_of(model) -> ShardingPlan:
    plan = getattr(model, "sharding", None)
    if not isinstance(plan, ShardingPlan):
        raise ShardingError("this model was compiled without a mesh: "
                            "mg.compile(graph, mesh=mesh, rules=...)")
    return plan


def shard_batch(model, *arrays: Any):
    """Host arrays as global ``jax.Array``s sharded along their leading (batch) dim as
    the model's rules shard the first input's leading axis (``"batch"`` by default),
    other dims whole. In a multi-process run each process passes its own slice of the
    batch and gets the global array (``jax.make_array_from_process_local_data``).

    Returns:
      One array for one argument, else a tuple.

    Example:
      >>> import jax, numpy as np, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> model = mg.compile(mlp(4, (8,), 2), mesh=jax.make_mesh((1,), ("data",)),
      ...                    rules={"batch": "data"})
      >>> x, y = shard_batch(model, np.ones((6, 4), np.float32), np.zeros(6, np.int32))
      >>> x.sharding.spec, y.shape
      (P('data', None), (6,))
    """
    plan = _plan_of(model)
    first = model.graph.inputs[0]
    entry = None
    specs = plan.activations.get(first)
    if specs and specs[0] is not None and len(specs[0]) and specs[0][0] is not P.UNCONSTRAINED:
        entry = specs[0][0]
    out = []
    for array in arrays:
        array = np.asarray(array)
        spec = P(entry, *([None] * (array.ndim - 1))) if array.ndim else P()
        out.append(jax.make_array_from_process_local_data(NamedSharding(plan.mesh, spec), array))
    return out[0] if len(out) == 1 else tuple(out)


def abstract_init(model) -> tuple[Any, Any]:
    """``(params, state)`` as ``jax.ShapeDtypeStruct``s carrying their shardings,
    without creating any array: a target to restore a checkpoint into.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> model = mg.compile(mlp(4, (8,), 2), mesh=jax.make_mesh((1,), ("data",)))
      >>> params, state = abstract_init(model)
      >>> params["dense"]["kernel"].shape, params["dense"]["kernel"].sharding.spec
      ((4, 8), P(None, None))
    """
    plan = _plan_of(model)
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))

    def attach(tree, shardings):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)

    return attach(params, plan.params), attach(state, plan.state)
