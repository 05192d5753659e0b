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
