"""How the DOT rendering looks: its options, the colours of dtype categories, the
fonts, and the escaping that makes any layer name render as itself (``dot.py``
writes the graph)."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..core.specs import flatten_specs
from ..ir.printer import format_attr, format_node, non_default_attrs

__all__ = ["DEFAULT_OPTIONS", "check_options", "unknown_option", "OptionError", "DTYPE_COLORS",
           "dtype_category", "FONTNAME"]


class OptionError(GraphError, TypeError):
    """A keyword a rendering function does not take (a ``GraphError``, and a
    ``TypeError`` as Python's own for an unexpected keyword)."""


def unknown_option(function: str, name: str, options: list[str], more: str = "") -> OptionError:
    """The error for ``function(name=...)``, suggesting the near option."""
    import difflib

    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return OptionError(f"{function} got an unknown option {name!r}{hint}. It takes "
                       f"{', '.join(o + '=' for o in options)}{more}")

#: The options of ``graph_to_dot`` (and of ``Graph.to_dot`` / ``Graph.render``).
DEFAULT_OPTIONS: dict[str, Any] = {
    "show_shapes": True,     # output shapes, symbolic dims by name
    "show_dtype": True,      # output dtypes (f32, bf16, ...)
    "show_params": True,     # parameter counts (trainable + non-trainable)
    "show_attrs": False,     # the op's non-default hyperparameters
    "expand_nested": False,  # nested blocks as clusters of their own layers (or a list of names)
    "rankdir": "TB",         # TB, LR, BT or RL, as Graphviz
    "show_legend": False,    # a legend of the dtype colours and marks used
    "sharding": None,        # layer path -> sharding text (CompiledModel.to_dot fills it)
    "remat": None,           # block or layer path -> its rematerialization (likewise)
}

_RANKDIRS = ("TB", "LR", "BT", "RL")


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """``DEFAULT_OPTIONS`` updated with ``options``; ``TypeError`` for an unknown option,
    ``mg.GraphError`` (a ``ValueError``) for a bad ``rankdir``."""
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise unknown_option("the drawing (to_dot, render)", unknown[0], list(DEFAULT_OPTIONS))
    merged = {**DEFAULT_OPTIONS, **options}
    rankdir = merged["rankdir"]
    if not isinstance(rankdir, str) or rankdir.upper() not in _RANKDIRS:
        raise GraphError(f"the drawing's rankdir must be one of {', '.join(_RANKDIRS)}, got "
                         f"{rankdir!r}")
    merged["rankdir"] = rankdir.upper()
    for key in DEFAULT_OPTIONS:
        if key not in ("rankdir", "sharding", "remat", "expand_nested"):
            if not isinstance(merged[key], (bool, np.bool_, int)):  # "no" read as true
                raise GraphError(f"the drawing's {key} is True or False, got {merged[key]!r}")
            merged[key] = bool(merged[key])
    merged["expand_nested"] = _expand_option(merged["expand_nested"])
    for key in ("sharding", "remat"):
        if merged[key] is not None and not isinstance(merged[key], dict):
            raise TypeError(f"{key} must be a dict of layer path -> text, got "
                            f"{type(merged[key]).__name__}")
    return merged


def _expand_option(value: Any) -> bool | frozenset:
    """``expand_nested``: a bool (all blocks or none), or the names (or paths, such as
    ``block0/attention``) of the blocks to expand, as a str or a list of them."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return bool(value)
    if isinstance(value, str):
        value = [value]
    try:
        names = list(value)
    except TypeError:
        raise TypeError(f"expand_nested must be True, False or a list of block names, got "
                        f"{type(value).__name__}") from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"expand_nested must be True, False or a list of block names, got {bad[0]!r}")
    return frozenset(names)


def _check_blocks(graph, names: frozenset) -> None:
    """``GraphError`` for a name in ``expand_nested`` that is no block's name or path."""
    blocks: set[str] = set()
    for path, node in graph.walk():
        if node.op.subgraph() is not None:
            blocks |= {path, node.name}
    unknown = sorted(names - blocks)
    if unknown:
        raise GraphError(f"expand_nested names {unknown[0]!r}, which is no block of graph "
                         f"{graph.name!r} (its blocks: {', '.join(sorted(blocks)) or 'none'})")

#: dtype category -> (fill colour, line colour). Categories: see ``dtype_category``.
DTYPE_COLORS: dict[str, tuple[str, str]] = {
    "float32": ("#d0e4f5", "#1c5d99"),
    "bfloat16": ("#ffd8a8", "#d9480f"),
    "float16": ("#fff3bf", "#e67700"),
    "float64": ("#e5dbff", "#5f3dc4"),
    "float8": ("#ffc9c9", "#c92a2a"),
    "int": ("#d3f9d8", "#2b8a3e"),
    "bool": ("#e9ecef", "#495057"),
    "complex": ("#c5f6fa", "#0b7285"),
    "other": ("#f8f9fa", "#495057"),
}

_BLOCK_FILL = "#f1f3f5"
_BLOCK_LINE = "#868e96"
_TEXT_GREY = "#495057"


def layer_category(op: Any, input_specs: Any, output_dtype: Any) -> str:
    """The colour category of a layer: a quantized layer's (its op has a ``scheme``) by
    the dtype its weights are stored in (int8, packed int4's uint8, float8), so that a
    weight-only layer, whose output is float, shows as quantized; any other by its
    output's dtype."""
    if getattr(op, "scheme", None) is not None:
        stored = [spec.dtype for _, spec in flatten_specs(op.param_specs(input_specs))
                  if spec.dtype is not None and spec.dtype.itemsize == 1]
        if stored:
            return dtype_category(stored[0])
    return dtype_category(output_dtype)


def dtype_category(dtype: Any) -> str:
    """The colour category of a dtype: ``float32``, ``bfloat16``, ``float16``,
    ``float64``, ``float8`` (any other float, e.g. float8_e4m3fn), ``int`` (signed and
    unsigned), ``bool``, ``complex`` or ``other``.

    Example:
      >>> dtype_category("int32"), dtype_category(np.dtype("float16"))
      ('int', 'float16')
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return "other"
    name = dt.name
    if name in ("float32", "bfloat16", "float16", "float64"):
        return name
    if dt.kind == "b":
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "c":
        return "complex"
    if name.startswith("float") or dt.kind == "f":
        return "float8"
    return "other"


#: Fonts for labels, the first a system has: fontconfig reads the list when Graphviz
#: measures the labels, and the SVG's font-family hands the same list to the viewer.
FONTNAME = "DejaVu Sans,Liberation Sans,Arial,Helvetica,sans-serif"


# --- escaping ---------------------------------------------------------------------------

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _visible(text: Any) -> str:
    """``text`` with every character that is not printable text (control characters,
    line and paragraph separators, lone surrogates, non-characters) written as a
    Python escape, so it is valid XML and shows what is there."""
    text = str(text)
    if text.isascii() and text.isprintable():  # nearly every label: nothing to escape
        return text
    out = []
    for ch in text:
        code = ord(ch)
        category = unicodedata.category(ch)
        if category in ("Cc", "Cs", "Zl", "Zp") or 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            if ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ch == "\r":
                out.append("\\r")
            elif code <= 0xFF:
                out.append(f"\\x{code:02x}")
            elif code <= 0xFFFF:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _html(text: Any) -> str:
    """Text for an HTML-like label: visible, with the XML specials as entities and
    backslashes doubled (Graphviz expands \\N, \\G, \\E in HTML text too, and reads
    ``\\\\`` as one backslash)."""
    text = _visible(text)
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;").replace("\\", "\\\\"))


def _esc_string(text: Any) -> str:
    """A double-quoted DOT string for an escString attribute (tooltips). Backslashes
    come in pairs, so no backslash can escape the closing quote, and Graphviz's escape
    sequences (\\N, \\G, \\n, ...) cannot be formed from a name."""
    text = _visible(text)
    return '"' + text.replace("\\", "\\\\\\\\").replace('"', '\\"') + '"'


def _plain_id(name: str) -> str:
    """A DOT identifier made from a name: letters, digits and underscores only."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name) or "graph"
    return ident if not ident[0].isdigit() else "g_" + ident


def _node_line(node) -> str:
    """The node's printed line (for tooltips), without memory addresses."""
    return _ADDRESS.sub("", format_node(node))


def _attrs_text(op, width: int = 40, longest: int = 120) -> list[str]:
    """The op's non-default hyperparameters, without memory addresses (which differ
    between runs), packed into lines of about ``width`` characters: a line breaks between
    attributes, or inside a long one after a comma, a dot or a bracket (its next lines
    indented), never inside a name or a number; a value longer than ``longest``
    characters (a callable's repr) is cut at such a break, marked ``…``."""
    attrs = list(non_default_attrs(op).items())
    lines: list[str] = []
    line = ""
    for n, (k, v) in enumerate(attrs):
        value = _ADDRESS.sub("", format_attr(v))
        if len(value) > longest:
            cut = max(value.rfind(c, 0, longest) for c in ",.([")
            value = value[:cut + 1 if cut > 0 else longest].rstrip() + "\u2026"
        item = f"{k}={value}" + ("," if n < len(attrs) - 1 else "")
        if line and len(line) + 1 + len(item) <= width:
            line += " " + item
            continue
        if line:
            lines.append(line)
        line = ""
        for piece in _BREAKS.split(item):  # a long attribute over lines, at its breaks
            if line.strip() and len(line) + len(piece.rstrip()) > width:
                lines.append(line.rstrip())
                line = "  "
            line += piece
        line = line.rstrip()
        if line.startswith("  "):  # the end of a long one: the next starts a line
            lines.append(line)
            line = ""
    if line:
        lines.append(line)
    return lines


#: Where a long attribute may break: after a comma (and its space), an opening bracket,
#: or a dot before a name (not a number's).
_BREAKS = re.compile(r"(?<=, )|(?<=,)(?! )|(?<=[(\[])|(?<=\.)(?=[A-Za-z_])")


# --- the writer -----------------------------------------------------------------------


# Edges leave and arrive along the flow; input nodes point along it.
_COMPASS = {"TB": ("s", "n"), "BT": ("n", "s"), "LR": ("e", "w"), "RL": ("w", "e")}
_INPUT_SHAPE = {"TB": "shape=invhouse", "BT": "shape=house", "LR": "shape=invhouse, orientation=90",
                "RL": "shape=invhouse, orientation=270"}

