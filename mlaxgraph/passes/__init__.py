"""Compiler passes: pure Graph -> Graph functions, run in order by ``run_passes``."""

from .verify import verify, find_cycle
from .infer_shapes import infer_shapes
from .insert_casts import insert_casts
from .remove_redundant_casts import remove_redundant_casts
from .eliminate_dead_nodes import eliminate_dead_nodes
from .pipeline import default_passes, run_passes

__all__ = ["verify", "find_cycle", "infer_shapes", "insert_casts", "remove_redundant_casts",
           "eliminate_dead_nodes", "default_passes", "run_passes"]
