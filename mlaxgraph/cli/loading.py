"""The model a command-line argument names: a saved graph file (``.mlg`` from
``mg.save``, ``.json`` from ``Graph.to_json``), an ONNX model (``.onnx``, read by
``mg.from_onnx``) or ``module:function`` (a module path or a ``file.py``) returning a
``Graph``."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pathlib
import sys

from ..core.errors import MlaxGraphError, SerializationError
from ..io.model_file import load
from ..ir.graph import Graph

__all__ = ["UsageError", "LoadedModel", "load_model"]


class UsageError(MlaxGraphError, ValueError):
    """A command-line argument is wrong or names a missing file (exit status 2)."""


class LoadedModel:
    """A graph named on the command line, with its weights when the file has them and
    the policy of a compiled model a function returned (None: none)."""

    def __init__(self, graph, params=None, state=None, source: str = "", policy=None):
        self.graph, self.params, self.state, self.source = graph, params, state, source
        self.policy = policy


def load_model(spec: str) -> LoadedModel:
    """The graph (and weights) that a MODEL argument names.

    Example:
      >>> loaded = load_model("mlaxgraph.examples:mlp")
      >>> loaded.graph.name, loaded.params is None
      ('mlp', True)

    Raises:
      UsageError: no such file or module, an unknown file kind, no such function, or
        the function returns no Graph.
      MlaxGraphError: the file or the function is broken (a bad file, a graph error).
    """
    path = pathlib.Path(spec)
    if path.is_dir():
        raise UsageError(f"{spec} is a folder: give a .mlg, .json or .onnx file, or module:function")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".json":
            try:
                return LoadedModel(Graph.from_json(path.read_bytes()), source=spec)
            except SerializationError as e:  # its messages say "the file": this one
                raise SerializationError(f"{spec}: {e}") from None
        if suffix in (".mlg", ".safetensors"):
            graph, params, state = load(path)
            return LoadedModel(graph, params, state, spec)
        if suffix == ".onnx":
            from ..onnx.reader import from_onnx

            graph, params, state = from_onnx(path)
            return LoadedModel(graph, params, state, spec)
        raise UsageError(f"cannot tell what {spec} is: give a .mlg file (mg.save), a .json "
                         f"graph (Graph.to_json), an .onnx model or module:function")
    module_name, colon, attribute = spec.rpartition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"no such file: {spec} (give a .mlg, .json or .onnx file, or module:function)")
    module = _import(module_name)
    target = getattr(module, attribute, None) if attribute.isidentifier() else None
    if target is None:
        near = difflib.get_close_matches(attribute, [n for n in dir(module) if not n.startswith("_")], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UsageError(f"{module_name} has no attribute {attribute!r}{hint}")
    try:
        made = target() if callable(target) and not isinstance(target, Graph) else target
    except MlaxGraphError:
        raise
    except Exception as e:
        raise MlaxGraphError(f"{spec} raised {type(e).__name__}: {_first_line(e)}") from e
    policy = None
    if hasattr(made, "source_graph") and isinstance(made.source_graph, Graph):
        # a CompiledModel: its graph, compiled again under its policy (or --policy's)
        made, policy = made.source_graph, getattr(made, "policy", None)
    if not isinstance(made, Graph):  # the name points at something else: a wrong argument
        raise UsageError(f"{spec} returned {type(made).__name__}, not an mg.Graph")
    return LoadedModel(made, source=spec, policy=policy)


def _import(name: str):
    if name.endswith(".py"):
        file = pathlib.Path(name)
        if not file.is_file():
            raise UsageError(f"no such file: {name}")
        module_spec = importlib.util.spec_from_file_location(file.stem, file)
        if module_spec is None or module_spec.loader is None:
            raise UsageError(f"cannot import {name} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except MlaxGraphError:
            raise
        except Exception as e:
            raise MlaxGraphError(f"{name} raised {type(e).__name__}: {_first_line(e)}") from e
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: modules beside the user
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise UsageError(f"no module named {e.name!r} (for {name}:...)") from None
        raise MlaxGraphError(f"importing {name} failed: {_first_line(e)}") from e
    except MlaxGraphError:
        raise
    except Exception as e:
        raise MlaxGraphError(f"importing {name} raised {type(e).__name__}: {_first_line(e)}") from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
