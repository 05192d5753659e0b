"""``mg.from_torch``: a PyTorch module, a ``torch.export`` program or a saved program
folder as ``(graph, params, state)``."""

from __future__ import annotations

import os
import re
from typing import Any

from ..core.errors import ConfigError, GraphError, ShapeError
from ..core.signatures import unknown_keywords
from ..ir.graph import Graph
from . import program as program_file
from .layer import TABLE, Mode
from .layers import LAYER_TARGETS
from .reader import read_program

__all__ = ["from_torch", "save_program", "supported_ops", "inference_mode"]

FROM_TORCH_SIGNATURE = "from_torch(source, example_args=None, dynamic_shapes=None)"
#: torch.export's and torch.onnx.export's names for what from_torch takes.
FROM_TORCH_HINTS = {
    "args": "torch.export's args are example_args=",
    "kwargs": "keyword inputs are not taken: pass the module's inputs in order in example_args",
    "strict": "from_torch exports as torch.export does by default (strict=False); to export "
              "otherwise, pass the ExportedProgram you made",
    "dynamic_axes": "torch.onnx.export's dynamic_axes are dynamic_shapes=, a "
                    "torch.export.Dim for each dim that varies",
    "input_names": "the graph's inputs are named after the module's forward arguments",
}


def supported_ops() -> list[str]:
    """The ATen operators ``from_torch`` reads, sorted.

    Example:
      >>> import mlaxgraph as mg
      >>> "aten.convolution.default" in mg.aten.supported_ops()
      True
    """
    return sorted(set(TABLE) | set(LAYER_TARGETS) | {"aten.sym_size.int"})


def inference_mode(graph: Graph) -> bool | None:
    """The ``inference_mode`` under which an imported graph computes as the program it
    was read from: False for a program exported in train mode (dropout drawing,
    BatchNorm on the batch's statistics, updating its running ones), True for one
    exported in eval mode; None for a graph ``from_torch`` did not make. The graph
    carries the mode as its ``train_mode`` or ``eval_mode`` node (an identity on the
    first input). A program holding none of those operators reads as eval mode: it
    computes the same in both.

    Example:
      >>> import mlaxgraph as mg
      >>> graph, params, state = mg.from_torch("tests/fixtures/torch/small_cnn")
      >>> mg.aten.inference_mode(graph)
      True
    """
    modes = [n.op for n in graph.nodes if isinstance(n.op, Mode)]
    return not modes[0].training if modes else None


def _export(module: Any, example_args: Any, dynamic_shapes: Any) -> Any:
    from .capture import require_torch

    torch = require_torch()
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"from_torch takes a torch.nn.Module (exported with example_args), a "
                         f"torch.export.ExportedProgram or the folder of a saved program, got "
                         f"{type(module).__name__}: wrap a function in an nn.Module's forward")
    args = tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,)
    _check_dims_axes(torch, args, dynamic_shapes)
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if t.is_meta:
            raise GraphError(f"the module's tensor {name!r} is on the meta device (it has no "
                             f"values): materialize the module first (module.to_empty("
                             f"device='cpu') then load_state_dict(...) of its weights)")
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch's own errors: data-dependent flow, bad dims
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        text = (lines or [type(e).__name__])[0][:400]
        kind = type(e).__name__
        if "in output, which is not a known type" in text:
            cache = "Cache" in text
            raise GraphError(
                f"torch.export could not export {type(module).__name__}: its output holds an "
                f"object torch.export cannot flatten ({text.split(' in output')[0]}); "
                + ("build the model with use_cache=False (config.use_cache = False): "
                   "mg.decoder derives the key/value cache from the graph" if cache else
                   "return tensors (or tuples, lists and dicts of them)")) from None
        if "Constraint" in kind or "constraint" in text.lower() or "dynamic_shapes" in text \
                or re.search(r"\bDim\b", text):
            # torch's reasons follow its first line (a dim specialized to the example's size)
            why = [line.lstrip("- ") for line in lines[1:6] if line.startswith("- ")]
            if any("constant (1)" in w for w in why):
                why.append("torch specializes an example size of 1: give an example of size 2 or more")
            raise ShapeError(f"torch.export could not export {type(module).__name__} with these "
                             f"dims: {kind}: {text}" + "".join(f"; {w[:300]}" for w in why[:3])) from None
        if "data-dependent" in text.lower() or "control flow" in text.lower() or "DataDependent" in kind:
            hint = ("data-dependent control flow must be written with torch.cond (both branches "
                    "computed, the predicate picking one) or removed")
        elif _fails_eagerly(torch, module, args):
            hint = "the module itself fails on these example inputs (check their shapes and dtypes)"
        else:
            hint = "the module runs on these inputs in PyTorch, but torch.export cannot trace it"
        raise GraphError(f"torch.export could not export {type(module).__name__} ({kind}): {text}; "
                         f"{hint}") from None


def _check_dims_axes(torch: Any, args: tuple, dynamic_shapes: Any) -> None:
    """Each axis ``dynamic_shapes`` names (``{axis: Dim}`` per tensor argument, in a tuple
    or list) lies inside its tensor (torch's own check fails on an IndexError)."""
    if not isinstance(dynamic_shapes, (tuple, list)):
        return
    for number, (arg, spec) in enumerate(zip(args, dynamic_shapes)):
        if isinstance(spec, dict) and isinstance(arg, torch.Tensor):
            for axis in spec:
                if isinstance(axis, int) and not -arg.dim() <= axis < arg.dim():
                    raise ShapeError(f"from_torch: dynamic_shapes names axis {axis} of example "
                                     f"argument {number}, which has {arg.dim()} axes "
                                     f"(shape {tuple(arg.shape)})")


def _fails_eagerly(torch: Any, module: Any, args: tuple) -> bool:
    """Whether ``module(*args)`` raises in PyTorch itself (asked once export has failed).
    The module's buffers (a BatchNorm's running statistics in training mode) are put
    back as they were."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        with torch.no_grad():
            module(*args)
    except Exception:
        return True
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    return False


def _capture(program: Any, dynamic_shapes: Any = None) -> tuple[dict, dict]:
    from .capture import capture

    return capture(program, dynamic_shapes)


def from_torch(source: Any, example_args: Any = None, *,
               dynamic_shapes: Any = None, **unknown: Any) -> tuple[Graph, dict, dict]:
    """A PyTorch model as ``(graph, params, state)``.

    Args:
      source: a ``torch.export.ExportedProgram``; a ``torch.nn.Module`` (exported here
        with ``example_args`` and ``dynamic_shapes``); or the path of a folder
        ``mg.aten.save_program`` wrote (read without torch).
      example_args: the module's example inputs (a tensor or a tuple of them).
      dynamic_shapes: ``torch.export``'s ``dynamic_shapes`` (``torch.export.Dim``s):
        those dims are symbolic in the graph, named as the ``Dim``s (with an
        ``ExportedProgram``, pass the ``dynamic_shapes`` it was exported with to
        keep the names; torch's ``s0`` ... otherwise).

    Returns:
      The graph (its blocks the module hierarchy, named by module path relative to
      the parent: ``layer1`` >> ``0`` >> ``conv1``), its weights nested the same way
      (``mg.models.to_state_dict`` gives the module's state-dict names back) and its
      state (BatchNorm statistics, buffers). A program exported in train mode computes
      as PyTorch's with ``apply(..., inference_mode=False)``, one exported in eval mode
      with ``inference_mode=True``: the graph carries the mode (its ``train_mode`` or
      ``eval_mode`` node), ``mg.aten.inference_mode(graph)`` reads it.

    Raises:
      mg.GraphError: an ATen operator the importer does not support (named with its
        module path), or a module torch.export cannot capture; mg.ShapeError: a
        data-dependent size, or dims that contradict the module;
        mg.SerializationError: a damaged program folder.

    Example:
      >>> import mlaxgraph as mg
      >>> graph, params, state = mg.from_torch("tests/fixtures/torch/small_cnn")
      >>> graph.select(op="conv")[:3]
      ['stem/0', 'layer1/0/conv1', 'layer1/0/conv2']
      >>> sorted(mg.models.to_state_dict(graph, params, state))[:2]
      ['head.bias', 'head.weight']
    """
    if unknown:
        raise ConfigError(unknown_keywords("from_torch", unknown, FROM_TORCH_SIGNATURE,
                                           FROM_TORCH_HINTS))
    if isinstance(source, (str, os.PathLike)):
        record, tensors = program_file.load_program(source)
        name = os.path.basename(os.path.normpath(source)) or "torch"
    else:
        if not hasattr(source, "graph_signature"):
            name = type(source).__name__
            source = _export(source, example_args, dynamic_shapes)
        else:
            name = type(source.module()).__name__ if hasattr(source, "module") else "torch"
        record, tensors = _capture(source, dynamic_shapes)
        record = program_file.check_program(record)
    return read_program(record, tensors, name=name)


def save_program(source: Any, folder: str | os.PathLike, example_args: Any = None, *,
                 dynamic_shapes: Any = None) -> str:
    """Writes a module or ``ExportedProgram`` as a program folder (``program.json`` and
    ``tensors.safetensors``, documented in ``mlaxgraph.aten.program``) that
    ``from_torch(folder)`` reads without torch; returns the folder. Needs torch.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.aten.save_program  # doctest: +ELLIPSIS
      <function save_program at ...>
    """
    if not hasattr(source, "graph_signature"):
        source = _export(source, example_args, dynamic_shapes)
    record, tensors = _capture(source, dynamic_shapes)
    return program_file.save_program(folder, record, tensors)
