"""The ``mlaxgraph`` command line. ``main(argv) -> exit code``: 0 done, 1 an error in
the model (compiling, lowering, a broken file), 2 a wrong argument or a missing file.
Errors print as one line; ``--verbose`` prints all of them and the traceback."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from collections.abc import Sequence

from ..core.errors import MlaxGraphError
from .commands import EXAMPLES, UsageError, add_commands
from .demo import run as run_demo
from .generate import add_generate
from .zoo_demo import MODELS, run_model

__all__ = ["main"]

EPILOG = """examples:
  mlaxgraph demo                 train a residual CNN on the bundled digits, write
                                 its SVG, StableHLO, weights and checkpoints
  mlaxgraph demo --policy bfloat16 --out demo-bf16
  mlaxgraph demo --model gpt2    GPT-2 small from the model zoo (random weights):
                                 summary, SVG, explorer page, cost table, a block's HLO
  mlaxgraph demo --model gpt2 --weights gpt2/model.safetensors
  mlaxgraph generate --model gpt2 --weights gpt2/ --prompt "Hello"   text, with the
                                 folder's tokenizer.json (or --prompt-ids 15496,11)
""" + EXAMPLES + """
MODEL is a .mlg file (mg.save), a .json graph (Graph.to_json), an .onnx model or
module:function returning an mg.Graph. Exit status: 0 done, 1 an error in the model, 2 a wrong
argument or a missing file. `mlaxgraph COMMAND --help` describes each command.
"""


class _Parser(argparse.ArgumentParser):
    """Reports a wrong argument as one line (and exit status 2), not the usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{self._suggestion(message)} "
                     f"(see `{self.prog} --help`)\n")

    def _options(self) -> list[str]:
        """This parser's option strings and its commands' ones."""
        options: list[str] = []
        for action in self._actions:
            options += action.option_strings
            if isinstance(action.choices, dict):  # the commands: name -> parser
                options += [o for sub in action.choices.values() if isinstance(sub, _Parser)
                            for o in sub._options()]
        return options

    def _suggestion(self, message: str) -> str:
        """``; did you mean ...?`` for a misspelt command or option."""
        choice = re.match(r"argument .*: invalid choice: '?([^' ]*)'? \(choose from (.*)\)", message)
        if choice:
            word, known = choice.group(1), re.findall(r"[\w.-]+", choice.group(2))
        elif unknown := re.match(r"unrecognized arguments: (-[^\s=]+)", message):
            word, known = unknown.group(1), self._options()
        else:
            return ""
        close = difflib.get_close_matches(word, known, n=1)
        return f"; did you mean {close[0]!r}?" if close else ""


def _demo(args: argparse.Namespace) -> int:
    if args.model is not None:
        return run_model(args)
    if args.weights or args.config:
        raise UsageError("--weights and --config go with --model")
    return run_demo(args)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mlaxgraph", description="Compose, inspect and ship neural networks in JAX.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on an error, print all of its message and the traceback")
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
    demo.add_argument("--model", choices=MODELS, help="instead of training the CNN, build this "
                      "model of mg.models and write its summary, rendering, explorer page, cost "
                      "table and one block's HLO")
    demo.add_argument("--weights", metavar="PATH", help="with --model: a local checkpoint (a "
                      ".safetensors file, or a folder of shards with its index) in the original "
                      "names; random weights without it")
    demo.add_argument("--config", metavar="PATH", help="with --model gpt2, bert, vit or llama: the "
                      "Hugging Face config.json (default: one beside --weights, else the "
                      "builder's defaults; a small Llama)")
    demo.set_defaults(run=_demo)
    add_commands(commands)
    add_generate(commands)
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``command`` (``parser`` itself without one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's parser: its usage, its options' spellings
            _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse exits 2 on bad arguments, 0 on --help
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("mlaxgraph: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as on SIGPIPE
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 141
    except Exception as e:  # one line each; --verbose for the whole story
        usage = isinstance(e, (UsageError, FileNotFoundError))
        if args.verbose:
            traceback.print_exc()
        text = str(e).strip() or type(e).__name__
        if not isinstance(e, MlaxGraphError) and not usage:
            text = f"{type(e).__name__}: {text}"
        lines = text.splitlines()
        more = " (--verbose for details)" if len(lines) > 1 and not args.verbose else ""
        print(f"mlaxgraph {args.command}: error: {lines[0]}{more}", file=sys.stderr)
        return 2 if usage else 1
