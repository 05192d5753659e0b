"""The inspection subcommands of the command line: ``summary``, ``render``, ``hlo``,
``export``, ``cost``, ``compare`` and ``view``: their arguments and what each does. Each
takes a model, which ``loading.py`` finds: a saved graph file (``.mlg`` from
``mg.save``, ``.json`` from ``Graph.to_json``) or ``module:function`` (a module path or
a ``file.py``) returning a ``Graph``.

A wrong argument or a missing file raises ``UsageError`` (exit status 2); a model that
cannot be compiled or lowered raises the library's own errors (exit status 1).
"""

from __future__ import annotations

import argparse
import difflib
import json
import pathlib

from ..analysis.policy_comparison import compare_policies
from ..compiler.compile import compile
from ..compiler.policy import Policy
from ..core.errors import MlaxGraphError
from ..core.specs import dim_names
from ..io.exported import MANIFEST
from ..io.weights import write_atomic
from ..render.graphviz import FORMATS
from .loading import LoadedModel, UsageError, load_model

__all__ = ["UsageError", "LoadedModel", "load_model", "add_commands", "EXAMPLES"]

EXAMPLES = """\
  mlaxgraph summary cnn.mlg                              layers, shapes, dtypes, params
  mlaxgraph summary mlaxgraph.examples:residual_cnn --policy bfloat16
  mlaxgraph render cnn.mlg --out cnn.svg                 svg, png, pdf or dot by suffix
  mlaxgraph view cnn.mlg --out cnn.html                  the interactive explorer page
  mlaxgraph hlo cnn.mlg --batch 8 --optimized --out cnn.hlo
  mlaxgraph hlo cnn.mlg --batch 8 --by-layer             each layer's operations
  mlaxgraph export cnn.mlg --batch 8 --out cnn-export    artifact, HLO texts, weights
  mlaxgraph cost cnn.mlg --batch 8 --policy bfloat16     per-layer FLOPs vs XLA's
  mlaxgraph compare cnn.mlg --batch 8 --policy float32 --policy bfloat16
"""


# --- argument types ----------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _policy(text: str):
    try:
        return Policy.named(text)
    except MlaxGraphError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _policy_name(text: str) -> str:
    _policy(text)  # checked as --policy checks it (mixed_bfloat16 is bfloat16)
    return text


def _dim(text: str) -> tuple[str, int]:
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"give a dim as NAME=VALUE, got {text!r}")
    return name.strip(), _positive(value)


# --- the subcommands --------------------------------------------------------------------


def _compiled(args):
    loaded = load_model(args.model)
    return loaded, compile(loaded.graph, args.policy if args.policy is not None else loaded.policy)


def _dims(args) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, value in getattr(args, "dim", None) or []:
        if dims.get(name, value) != value:
            raise UsageError(f"--dim {name}={dims[name]} and --dim {name}={value} give {name} "
                             f"twice: give one")
        dims[name] = value
    if getattr(args, "batch", None) is not None:
        if "batch" in dims and dims["batch"] != args.batch:
            raise UsageError(f"--batch {args.batch} and --dim batch={dims['batch']} give the "
                             f"batch twice: give one")
        dims["batch"] = args.batch
    return dims


def _known_dims(model, dims: dict[str, int]) -> list[str]:
    """The dims the graph's inputs use; UsageError naming a given one it lacks (a typo
    is named before the dims still missing)."""
    needed = list(dict.fromkeys(n for s in model.graph.input_specs for n in dim_names(s.shape)))
    unknown = sorted(set(dims) - set(needed))
    if unknown:
        near = difflib.get_close_matches(unknown[0], needed, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UsageError(f"graph {model.graph.name!r} has no symbolic dim "
                         f"{', '.join(map(repr, unknown))} (its dims: {', '.join(needed) or 'none'})"
                         f"{hint}")
    return needed


def _needed_dims(model, dims: dict[str, int]) -> dict[str, int]:
    """The dims the graph's inputs use; UsageError naming the ones not given."""
    needed = _known_dims(model, dims)
    missing = [n for n in needed if n not in dims]
    if missing:
        flags = ", ".join("--batch N" if n == "batch" else f"--dim {n}=N" for n in missing)
        raise UsageError(f"graph {model.graph.name!r} has symbolic dims; give {flags}")
    return {n: dims[n] for n in needed}


def _emit(args, text: str) -> None:
    """Prints ``text``, or writes it to ``--out``."""
    if getattr(args, "out", None):
        data = text if text.endswith("\n") else text + "\n"
        write_atomic(args.out, lambda f: f.write(data.encode("utf-8")))
        print(f"wrote {args.out}")
    else:
        print(text)


def _check_out(out: str | None, folder: bool = False) -> None:
    if out is None:
        return
    target = pathlib.Path(out)
    parent = target if folder else target.parent
    if folder and target.exists() and not target.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if not folder and target.is_dir():
        raise UsageError(f"--out {out} is a folder: give a file name")
    if not folder and not parent.exists():
        raise UsageError(f"--out {out}: no such folder {parent}")


def run_summary(args) -> int:
    _check_out(args.out)
    loaded, model = _compiled(args)
    text = model.summary(expand_nested=args.expand)
    dims = _dims(args)
    if dims:
        table = model.cost_table(xla=False, **_needed_dims(model, dims))
        at = ", ".join(f"{k}={v}" for k, v in table.dims.items())
        text += (f"\nat {at}: forward {table.flops:,} FLOPs, activations "
                 f"{table.activation_bytes:,} bytes")
    _emit(args, text)
    return 0


def _suffix(out: str | None, allowed: tuple[str, ...], other: str) -> None:
    """``--out``'s suffix is one the command writes (render: Graphviz's formats; view:
    .html), or a UsageError saying which command writes it."""
    suffix = pathlib.Path(out).suffix.lower().lstrip(".") if out else ""
    if out and suffix and suffix not in allowed:
        raise UsageError(f"--out {out}: this command writes {', '.join(allowed)}; {other}")


def run_render(args) -> int:
    _check_out(args.out)
    _suffix(args.out, FORMATS, "the explorer page (.html) is `mlaxgraph view MODEL --out "
                               "FILE.html`")
    loaded, model = _compiled(args)
    out = args.out or f"{model.graph.name}.svg"
    path = model.graph.render(out, expand_nested=args.expand)
    print(f"wrote {path}")
    return 0


def run_view(args) -> int:
    _check_out(args.out)
    _suffix(args.out, ("html", "htm"), "a drawing (.svg, .png, .pdf) is `mlaxgraph render MODEL "
                                       "--out FILE`")
    loaded, model = _compiled(args)
    dims = _dims(args)
    _known_dims(model, dims)
    if args.hlo:
        dims = _needed_dims(model, dims)
    out = args.out or f"{model.graph.name}.html"
    path = model.to_html(out, hlo=args.hlo, **dims)
    print(f"wrote {path}")
    return 0


def run_hlo(args) -> int:
    _check_out(args.out)
    loaded, model = _compiled(args)
    dims = _needed_dims(model, _dims(args))
    if args.by_layer:
        text = str(model.hlo_by_layer(optimized=args.optimized,
                                      inference_mode=args.inference_mode, **dims))
    else:
        text = model.hlo(optimized=args.optimized, inference_mode=args.inference_mode, **dims)
    _emit(args, text)
    return 0


def _exported_files(folder: str) -> set[str]:
    """The files an earlier export wrote to ``folder``, as its manifest lists them (none
    without a readable manifest: other files are not the export's)."""
    try:
        manifest = json.loads((pathlib.Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    return {name for name in files if isinstance(name, str) and pathlib.PurePath(name).name == name}


def run_export(args) -> int:
    _check_out(args.out, folder=True)
    loaded, model = _compiled(args)
    dims = _dims(args)
    _known_dims(model, dims)  # a typo named, whether the texts are asked for or not
    dims = _needed_dims(model, dims) if dims else {}
    out = args.out or f"{model.graph.name}-export"
    try:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot make the folder: {e.strerror or e}") from None
    earlier = _exported_files(out)
    try:
        written = model.save_hlo(out, params=loaded.params, state=loaded.state,
                                 inference_mode=not args.training, **dims)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write {e.filename or 'the files'}: {e.strerror or e}") from None
    for path in written.values():
        print(f"wrote {path}")
    for name in sorted(earlier - {p.name for p in written.values()}):
        (pathlib.Path(out) / name).unlink(missing_ok=True)  # an earlier export's, not rewritten
        print(f"removed {pathlib.Path(out) / name} (an earlier export's)")
    if loaded.params is None:
        print("no weights: the source has none (a .mlg file from mg.save does)")
    return 0


def run_cost(args) -> int:
    _check_out(args.out)
    loaded, model = _compiled(args)
    dims = _needed_dims(model, _dims(args))
    table = model.cost_table(inference_mode=args.inference_mode, xla=not args.no_xla, **dims)
    _emit(args, str(table))
    return 0


def run_compare(args) -> int:
    _check_out(args.out)
    loaded = load_model(args.model)
    names = args.policies or ["float32", "bfloat16"]
    if len(names) < 2 or len(set(names)) < len(names):
        raise UsageError("compare needs two or more different --policy names (default: float32 "
                         "and bfloat16)")
    policies = {name: Policy.named(name) for name in names}
    dims = _needed_dims(compile(loaded.graph), _dims(args))
    table = compare_policies(loaded.graph, policies, inference_mode=args.inference_mode, **dims)
    _emit(args, str(table))
    return 0


def add_commands(commands) -> None:
    """Adds the inspection subcommands to an ``add_subparsers`` object."""
    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("model", metavar="MODEL",
                       help="a .mlg file (mg.save), a .json graph (Graph.to_json), an "
                            ".onnx model or module:function returning an mg.Graph")
    model.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, print all of its message and the traceback")
    policy = argparse.ArgumentParser(add_help=False)
    policy.add_argument("--policy", type=_policy, default=None, metavar="NAME",
                        help="compile under this dtype policy: float32, bfloat16 or float16 "
                             "(weights float32); default: no policy")
    dims = argparse.ArgumentParser(add_help=False)
    dims.add_argument("--batch", type=_positive, metavar="N", help="the value of the symbolic dim 'batch'")
    dims.add_argument("--dim", type=_dim, action="append", metavar="NAME=N",
                      help="the value of another symbolic dim (repeatable)")
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--out", metavar="FILE", help="write to this file instead of printing")
    mode = argparse.ArgumentParser(add_help=False)
    mode.add_argument("--inference-mode", action="store_true",
                      help="the inference apply (BatchNorm running statistics, no dropout); "
                           "default: training, as apply")
    raw = argparse.RawDescriptionHelpFormatter

    def add(name, help, description, parents, run, epilog):
        sub = commands.add_parser(name, help=help, description=description, parents=parents,
                                  epilog="examples:\n" + epilog, formatter_class=raw)
        sub.set_defaults(run=run)
        return sub

    sub = add("summary", "print the layer table of a model (with the policy's casts)",
              "Prints the compiled graph's summary: layers, ops, output shapes, dtypes, "
              "params; with --batch, also the forward FLOPs and activation bytes there.",
              [model, policy, dims, out], run_summary,
              "  mlaxgraph summary cnn.mlg\n  mlaxgraph summary mlaxgraph.examples:mlp --policy bfloat16 --batch 32\n")
    sub.add_argument("--expand", action="store_true", help="list the layers of nested blocks")

    sub = add("render", "draw the model's graph with Graphviz (svg, png, pdf) or write DOT",
              "Renders the compiled graph (casts included) to --out; the format comes from "
              "its suffix (.svg, .png, .pdf; .dot needs no Graphviz).",
              [model, policy], run_render,
              "  mlaxgraph render cnn.mlg --out cnn.svg\n  mlaxgraph render model.py:build --out model.dot\n")
    sub.add_argument("--out", metavar="FILE", help="the file to write (default: <graph name>.svg)")
    sub.add_argument("--expand", action="store_true", help="draw nested blocks as clusters")

    sub = add("view", "write the interactive explorer page of the model (one offline HTML file)",
              "Writes the explorer page of the compiled graph (casts included) to --out: "
              "nested blocks expand on a click, search, overlays, a details panel per "
              "layer; with --hlo each layer's optimized HLO operations (needs --batch).",
              [model, policy, dims], run_view,
              "  mlaxgraph view cnn.mlg --out cnn.html\n"
              "  mlaxgraph view mlaxgraph.examples:residual_cnn --policy bfloat16 --batch 8 --hlo\n")
    sub.add_argument("--out", metavar="FILE", help="the page to write (default: <graph name>.html)")
    sub.add_argument("--hlo", action="store_true", help="list each layer's optimized HLO operations")

    sub = add("hlo", "print the StableHLO or optimized HLO of the model's apply",
              "Prints the StableHLO of the lowered apply (with locations naming each "
              "operation's layer), XLA's optimized HLO with --optimized, or each layer's "
              "operations with --by-layer.",
              [model, policy, dims, out, mode], run_hlo,
              "  mlaxgraph hlo cnn.mlg --batch 8\n  mlaxgraph hlo cnn.mlg --batch 8 --optimized --by-layer\n")
    sub.add_argument("--optimized", action="store_true", help="XLA's optimized HLO for this machine")
    sub.add_argument("--by-layer", action="store_true", help="list each layer's operations")

    sub = add("export", "write the jax.export artifact, HLO texts and weights to a folder",
              "Writes exported.jax (jax.export, symbolic dims kept), exported.mlir, the "
              "StableHLO and optimized HLO at --batch, the weights of a .mlg file and a "
              "manifest to --out. mg.load_exported(folder) runs it without the graph's code.",
              [model, policy, dims], run_export,
              "  mlaxgraph export cnn.mlg --batch 8 --out cnn-export\n")
    sub.add_argument("--out", metavar="DIR", help="the folder to write (default: <graph name>-export)")
    sub.add_argument("--training", action="store_true", help="export the training apply")

    sub = add("cost", "print the per-layer FLOPs, params and activation bytes, next to XLA's",
              "Prints the cost table: per layer, params, forward FLOPs as a formula of the "
              "symbolic dims and at --batch, forward+backward FLOPs, activation bytes, and "
              "XLA's count of the layer with a note where they differ.",
              [model, policy, dims, out, mode], run_cost,
              "  mlaxgraph cost cnn.mlg --batch 8\n"
              "  mlaxgraph cost mlaxgraph.examples:mlp --batch 64 --policy bfloat16\n")
    sub.add_argument("--no-xla", action="store_true", help="skip lowering each layer for XLA's count")

    sub = add("compare", "count converts, dots, convolutions and fusions under several policies",
              "Lowers the model under each --policy and prints the counts of converts, dots, "
              "convolutions (StableHLO and optimized HLO) and fusions side by side.",
              [model, dims, out, mode], run_compare,
              "  mlaxgraph compare cnn.mlg --batch 8\n"
              "  mlaxgraph compare cnn.mlg --batch 8 --policy float32 --policy float16\n")
    sub.add_argument("--policy", dest="policies", action="append", metavar="NAME",
                     type=_policy_name,
                     help="a policy to compare, as --policy takes it (repeat; default float32 "
                          "and bfloat16)")
