"""Compiler passes: pure Graph -> Graph functions, run in order by ``run_passes``."""

from .eliminate_dead_nodes import eliminate_dead_nodes
from .fold_repeated_blocks import fold_repeated_blocks, scan_pays, unfold_scans
from .infer_shapes import infer_shapes
from .insert_casts import insert_casts
from .pipeline import default_passes, run_passes
from .remove_redundant_casts import remove_redundant_casts
from .verify import find_cycle, verify

__all__ = ["verify", "find_cycle", "infer_shapes", "insert_casts", "remove_redundant_casts",
           "eliminate_dead_nodes", "fold_repeated_blocks", "scan_pays", "unfold_scans", "default_passes",
           "run_passes"]
