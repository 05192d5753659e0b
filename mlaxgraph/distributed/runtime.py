"""Runtime helpers for sharded models: batches placed on the mesh, and abstract weights
carrying their shardings (a target to restore checkpoints into)."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..core.errors import ShardingError
from ..core.signatures import unknown_keywords
from .plan import ShardingPlan

__all__ = ["shard_batch", "abstract_init"]


def _plan_of(model) -> ShardingPlan:
    plan = getattr(model, "sharding", None)
    if not isinstance(plan, ShardingPlan):
        raise ShardingError("this model was compiled without a mesh: "
                            "mg.compile(graph, mesh=mesh, rules=...)")
    return plan


def shard_batch(model, *arrays: Any, **unknown: Any):
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
    if unknown:
        raise ShardingError(unknown_keywords(
            "shard_batch", unknown, "shard_batch(model, *arrays)",
            {name: "the arrays are split along their leading (batch) dim, on the mesh axes the "
                   "model's rules give the first input's" for name in ("axis", "axes", "dim")}))
    plan = _plan_of(model)
    first = model.graph.inputs[0]
    entry = None
    specs = plan.activations.get(first)
    if specs and specs[0] is not None and len(specs[0]) and specs[0][0] is not P.UNCONSTRAINED:
        entry = specs[0][0]
    targets = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    count = math.prod(plan.mesh.shape[m] for m in targets)
    local = count // math.gcd(count, jax.process_count())  # the part of the split each process feeds
    out = []
    for index, array in enumerate(arrays):
        array = np.asarray(array)
        if array.ndim and targets and array.shape[0] % local:
            raise ShardingError(
                f"shard_batch: array {index} ({array.dtype}{list(array.shape)}) has a leading "
                f"(batch) dim of {array.shape[0]}, which mesh axis {'x'.join(map(repr, targets))} "
                f"of size {count} does not divide",
                expected=f"a batch that is a multiple of {local}"
                         + (" in each process" if jax.process_count() > 1 else ""))
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
