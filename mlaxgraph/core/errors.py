"""The exception classes of mlaxgraph and the one formatter for their messages.

Every error about a node names the layer, its op, what it got and what it expected
(in that order) and the user's ``file.py:LINE`` where the node was created, followed
by the node's neighbourhood in the printed graph or the user's source line.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = [
    "MlaxGraphError",
    "GraphError",
    "ShapeError",
    "DTypeError",
    "SerializationError",
    "ShardingError",
    "ConfigError",
    "UnverifiedFileWarning",
    "FoldWarning",
    "CheckError",
    "SourceInfo",
    "capture_source",
    "user_stacklevel",
    "node_message",
]


class MlaxGraphError(Exception):
    """Base class of every error mlaxgraph raises on purpose.

    Args:
      message: what is wrong.
      expected: what was expected instead, when an op raises the error and the caller
        (which knows the layer's name, inputs and source line) formats the full message.
    """

    def __init__(self, message: str = "", *, expected: str | None = None):
        super().__init__(message)
        self.problem = message
        self.expected = expected


class GraphError(MlaxGraphError, ValueError):
    """The graph's structure is wrong: cycles, unknown or duplicate names, unknown ops."""


class ConfigError(MlaxGraphError, ValueError):
    """A layer's hyperparameter is wrong (a negative size, an unknown padding, heads that
    ``num_kv_heads`` does not divide): raised when the layer is made, naming it and the
    user's line."""


class ShapeError(MlaxGraphError, ValueError):
    """A tensor or a hyperparameter has a shape the layer cannot take."""


class DTypeError(MlaxGraphError, TypeError):
    """A tensor has a dtype the layer cannot take, or two inputs disagree."""


class SerializationError(MlaxGraphError, ValueError):
    """A graph or weights file is malformed, or a graph cannot be written."""


class ShardingError(MlaxGraphError, ValueError):
    """Logical axes, rules and a mesh do not fit: a rule names a mesh axis the mesh
    lacks, a dim is not divisible by its mesh axes, or one mesh axis shards two dims."""


class CheckError(MlaxGraphError, ValueError):
    """A run-time check of a model compiled with ``mg.compile(..., checks=True)``
    failed: an embedding id out of range, a NaN or an inf, naming the layer."""


class UnverifiedFileWarning(UserWarning):
    """A file written before mlaxgraph's files carried checksums was loaded: its bytes
    could not be checked. Saving it again adds them. Turn it into an error with
    ``warnings.simplefilter("error", mg.UnverifiedFileWarning)``."""


class FoldWarning(UserWarning):
    """``mg.fold_batch_norm`` kept BatchNorms it could not fold into the layer before
    them; the message lists each with the reason. Turn it into an error with
    ``warnings.simplefilter("error", mg.FoldWarning)``."""


class QuantizeWarning(UserWarning):
    """``mg.quantize`` with its default targets left layers float that the scheme cannot
    quantize as they are (an int4 group that does not divide a layer's inputs); the
    message lists each with the reason. Turn it into an error with
    ``warnings.simplefilter("error", mg.QuantizeWarning)``."""


class AdapterWarning(UserWarning):
    """A PEFT adapter config names what no module of the graph is (an entry of
    ``target_modules`` or ``exclude_modules``, a key of ``rank_pattern`` or
    ``alpha_pattern``), which PEFT ignores too; the message lists them. Turn it into an
    error with ``warnings.simplefilter("error", mg.AdapterWarning)``."""


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """Where in the user's code a node was created."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def code(self) -> str:
        """The source line itself, stripped, or '' when the file cannot be read."""
        return linecache.getline(self.file, self.line).strip()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _internal(code) -> bool:
    # mlaxgraph's own frames, and the __init__ that dataclasses generate for layers.
    return code.co_filename.startswith(_PACKAGE_DIR) or (
        code.co_filename == "<string>" and code.co_name == "__init__")


def user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost frame outside mlaxgraph, for a warning
    ``warnings.warn`` gives at the line of the user's that called into mlaxgraph."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _internal(frame.f_code):
        frame, level = frame.f_back, level + 1
    return level


def capture_source() -> SourceInfo | None:
    """The innermost caller frame outside mlaxgraph itself."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _internal(frame.f_code):
        frame = frame.f_back
    if frame is None:
        return None
    return SourceInfo(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def node_message(
    layer: str,
    op: str,
    problem: str,
    *,
    got: str | None = None,
    expected: str | None = None,
    source: SourceInfo | None = None,
    context: Sequence[str] = (),
) -> str:
    """Formats an error about one node.

    Args:
      layer: the layer's (node's) name.
      op: the op's registered name.
      problem: one sentence saying what is wrong and, where possible, how to fix it.
      got: what the layer got (shapes and dtypes), printed before ``expected``.
      expected: what the layer expected.
      source: where the user created the node.
      context: printed-graph lines around the node; the offending one starts with '>'.

    Example:
      >>> print(node_message("fc", "linear", "input features differ from the kernel's",
      ...                    got="f32[batch,3]", expected="f32[batch,4]"))
      layer 'fc' (op linear): input features differ from the kernel's
        got:      f32[batch,3]
        expected: f32[batch,4]
    """
    lines = [f"layer {layer!r} (op {op}): {problem}"]
    if got is not None:
        lines.append(f"  got:      {got}")
    if expected is not None:
        lines.append(f"  expected: {expected}")
    if source is not None:
        lines.append(f"  created at {source}" + (f" in {source.function}" if source.function else ""))
        code = source.code()
        if code:
            lines.append(f"    {code}")
    if context:
        lines.append("  in the graph:")
        lines.extend(f"  {line}" for line in context)
    return "\n".join(lines)
