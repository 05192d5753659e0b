"""Analysis of compiled models: the per-layer cost table, lowered and compiled forms
(jaxpr, StableHLO, optimized HLO), HLO by layer, collectives and policy comparison."""
