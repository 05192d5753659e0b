"""The torch program file: a ``torch.export`` program in a form read without torch.

A folder holding ``program.json`` and ``tensors.safetensors``. The JSON record:

- ``format``: ``"mlaxgraph.torch_program"``, ``version``: 1, ``torch``: the version
  that exported it, ``training``: whether the module was exported in train mode;
- ``inputs``: the program's placeholders in order, each ``{"name", "kind", "target",
  "shape", "dtype"}``; ``kind`` is ``user_input``, ``parameter``, ``buffer``,
  ``constant_tensor`` (``target`` names its tensor) or ``token``; a buffer the module's
  ``state_dict()`` leaves out (``register_buffer(..., persistent=False)``) has
  ``"persistent": false`` too;
- ``nodes``: its ``call_function`` nodes in order, each ``{"name", "target"`` (the
  ATen overload: ``aten.convolution.default``, or ``getitem``), ``"args"``,
  ``"kwargs"``, ``"outputs"`` (``{"shape", "dtype"}`` or null per output),
  ``"stack"`` (``nn_module_stack``: ``[module path, module class]`` outermost first,
  the root left out) ``}``;
- ``outputs``: the output node's arguments; ``user_outputs``: which of them the
  module returns (the rest update buffers: ``mutations`` maps the node to the buffer);
- ``dims``: each symbolic dim's ``[min, max]``.

Arguments are JSON values, ``{"ref": node}`` for a tensor, ``{"dtype": name}``,
``{"sym": expression}`` for a symbolic size and ``{"float": "inf"}`` for non-finite
floats. A shape's dims are ints or ``{"sym": expression}``. The tensors file holds
the parameters, buffers and constants by their state-dict names.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..core.errors import SerializationError

__all__ = ["FORMAT", "VERSION", "save_program", "load_program", "check_program"]

FORMAT = "mlaxgraph.torch_program"
VERSION = 1
PROGRAM_FILE = "program.json"
TENSORS_FILE = "tensors.safetensors"


def save_program(folder: str | os.PathLike, record: dict, tensors: dict[str, np.ndarray]) -> str:
    """Writes ``record`` and ``tensors`` (``mlaxgraph.aten.capture``'s) to ``folder``."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, PROGRAM_FILE), "w") as f:
        json.dump(record, f, indent=1)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(folder, TENSORS_FILE))
    return str(folder)


def _fail(message: str) -> SerializationError:
    return SerializationError(f"the torch program is damaged: {message}")


def check_program(record: Any) -> dict:
    """The record, checked field by field (a ``SerializationError`` names what is wrong)."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _fail(f"it is not a {FORMAT} record")
    if record.get("version") != VERSION:
        raise SerializationError(f"the torch program's version is {record.get('version')!r}; "
                                 f"this mlaxgraph reads version {VERSION}")
    for key, kind in (("inputs", list), ("nodes", list), ("outputs", list),
                      ("user_outputs", list), ("mutations", dict), ("dims", dict)):
        if not isinstance(record.get(key), kind):
            raise _fail(f"its field {key!r} is missing or not a {kind.__name__}")
    names = set()
    for entry in record["inputs"] + record["nodes"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _fail(f"an entry without a name: {str(entry)[:100]}")
        if entry["name"] in names:
            raise _fail(f"two entries are named {entry['name']!r}")
        names.add(entry["name"])
    for node in record["nodes"]:
        if not isinstance(node.get("target"), str) or not isinstance(node.get("args"), list) \
                or not isinstance(node.get("kwargs"), dict) or not isinstance(node.get("stack"), list) \
                or not isinstance(node.get("outputs"), list):
            raise _fail(f"node {node['name']!r} lacks target, args, kwargs, outputs or stack")
    return record


def load_program(folder: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """``(record, tensors)`` from a folder ``save_program`` wrote; no code runs."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if not os.path.isdir(folder):
        what = "a file" if os.path.exists(folder) else "nothing"
        raise SerializationError(f"{folder}: from_torch reads a program folder (its "
                                 f"{PROGRAM_FILE}, which mg.aten.save_program writes), and this "
                                 f"path is {what}; a PyTorch checkpoint (.pth, .bin, "
                                 f".safetensors) is read by mg.models.load_state_dict")
    path = os.path.join(folder, PROGRAM_FILE)
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise SerializationError(f"{folder}: no {PROGRAM_FILE} (a folder mg.aten.save_program "
                                 f"wrote)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(f"{PROGRAM_FILE} is not JSON ({e})") from None
    record = check_program(record)
    tensors_path = os.path.join(folder, TENSORS_FILE)
    tensors: dict[str, np.ndarray] = {}
    if os.path.exists(tensors_path):
        try:
            tensors = load_file(tensors_path)
        except (SafetensorError, ValueError, OSError) as e:
            raise _fail(f"{TENSORS_FILE} cannot be read ({e})") from None
    return record, tensors
