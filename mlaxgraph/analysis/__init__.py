"""Analysis of compiled models: the per-layer cost table, HLO by layer, collectives and
policy comparison. They read the lowered and compiled forms (jaxpr, StableHLO, optimized
HLO) that ``mlaxgraph.compiler.stages`` gives."""
