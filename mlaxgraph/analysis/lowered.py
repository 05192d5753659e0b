"""The lowered and compiled forms of a model (jaxpr, StableHLO, optimized HLO, XLA's
cost analysis, ``jax.export``) live in ``mlaxgraph.compiler.stages``, below the files
that ship them (``mlaxgraph.io.exported``); this module keeps their former import path."""

from ..compiler.stages import abstract_args, cost, dim_values, export, hlo, jaxpr

__all__ = ["abstract_args", "dim_values", "jaxpr", "hlo", "cost", "export"]
