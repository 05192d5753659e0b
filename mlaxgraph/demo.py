"""The demo: the main job of `make demo` and `mlaxgraph demo`."""

from __future__ import annotations


def run(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .compile import compile
    from .examples import residual_cnn
    from .ops.cast import Cast
    from .policy import Policy

    graph = residual_cnn()
    print(graph.summary())
    images = jnp.asarray(np.random.default_rng(0).normal(size=(args.batch, 8, 8, 1)), jnp.float32)
    for label, policy in (("float32", None), ("bfloat16", Policy(compute_dtype="bfloat16",
                                                                  output_dtype="float32"))):
        model = compile(graph, policy)
        params, state = model.init(jax.random.key(0))
        out, state = model.apply(params, state, images, rng=jax.random.key(1))
        jaxpr = model.jaxpr(images)
        casts = [(path, n) for path, n in model.graph.walk() if isinstance(n.op, Cast)]
        print(f"\n[{label}] outputs {out.dtype}{list(out.shape)}; jaxpr: {len(jaxpr.eqns)} "
              f"top-level equations; casts inserted by the policy: {len(casts)}")
        for path, node in casts:
            reads = ", ".join(str(v) for v in node.inputs)
            print(f"  %{path} = cast to {node.op.dtype} of {reads}")
    return 0
