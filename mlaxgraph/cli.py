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
    from .demo import run

    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlaxgraph", description="Compose, inspect and ship neural networks in JAX.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="command")
    demo = commands.add_parser(
        "demo", help="train a residual CNN on the bundled digits; write its graph, HLO and weights",
        description="Builds a residual CNN, trains it on scikit-learn's bundled 8x8 digits "
                    "with a progress bar, and writes the rendered graph (SVG), the StableHLO, "
                    "the trained weights and checkpoints to --out. Rerunning resumes from "
                    "the last checkpoint.")
    demo.add_argument("--policy", default="float32", choices=("float32", "bfloat16", "float16"),
                      help="dtype policy: float32, or mixed precision (default float32)")
    demo.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    demo.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the split, init and "
                      "shuffling (default 0)")
    demo.add_argument("--out", default="mlaxgraph-demo", help="output folder (default "
                      "./mlaxgraph-demo)")
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
