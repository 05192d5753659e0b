"""Sharding on a device mesh: rules mapping logical axes to mesh axes, the plan of
shardings for a compiled model, and the runtime helpers users call.

Example:
  >>> from mlaxgraph.distributed import shard_batch, abstract_init
"""

from .plan import ShardingPlan, plan_sharding
from .rules import as_rules, auto_mesh, spec_str
from .runtime import abstract_init, shard_batch

__all__ = ["ShardingPlan", "plan_sharding", "as_rules", "auto_mesh", "spec_str",
           "abstract_init", "shard_batch"]
