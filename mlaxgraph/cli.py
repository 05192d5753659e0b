"""The ``mlaxgraph`` command line. ``main(argv) -> exit code``."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import MlaxGraphError

__all__ = ["main"]

EPILOG = """examples:
  mlaxgraph demo                 build, compile and run the example CNN
  mlaxgraph demo --batch 32
"""


def _demo(args: argparse.Namespace) -> int:
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlaxgraph", description="Compose, inspect and ship neural networks in JAX.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="command")
    demo = commands.add_parser("demo", help="build, compile and run the example residual CNN")
    demo.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad arguments, 0 on --help
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except MlaxGraphError as e:
        print(f"mlaxgraph: error: {e}", file=sys.stderr)
        return 1
