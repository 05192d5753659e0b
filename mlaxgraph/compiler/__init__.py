"""The compiler: passes over the Graph, the flattening step into a Program, the one
interpreter over it, the lowering to init/apply, ``compile``, and the stages of a
compiled model (jaxpr, StableHLO, optimized HLO, ``jax.export``)."""
