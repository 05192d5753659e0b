"""The printed form of a graph: one line per node, deterministic, nested blocks indented.

    %conv1: f32[batch,28,28,16] = conv[features=16, kernel_size=(3, 3)](%image)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ..core.specs import dtype_str
from .graph import Graph

__all__ = ["format_graph", "format_node", "format_call", "format_attr", "context_lines"]


def format_attr(value: Any) -> str:
    """An attribute value as printed: dtypes short, functions by qualified name."""
    if isinstance(value, np.dtype):
        return dtype_str(value)
    if isinstance(value, Graph):
        return value.name
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '') or ''}.{value.__qualname__}".lstrip(".")
    if isinstance(value, tuple):
        inner = ", ".join(format_attr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def non_default_attrs(op) -> dict[str, Any]:
    """The op's hyperparameters that differ from their defaults (compared after the
    op's own normalization, so ``strides=1`` and ``(1, 1)`` count as the default)."""
    result = {}
    for field in dataclasses.fields(op):
        if not field.compare:
            continue
        value = getattr(op, field.name)
        if field.default is not dataclasses.MISSING and _same(value, _normalized_default(op, field)):
            continue
        result[field.name] = value
    return result


def _normalized_default(op, field):
    try:
        return _normalized_default_cached(op, field.name, field.default)
    except TypeError:  # an op holding an unhashable value: no cache
        return _normalize(op, field.name, field.default)


@functools.lru_cache(maxsize=4096)
def _normalized_default_cached(op, name, default):
    return _normalize(op, name, default)


def _normalize(op, name, default):
    try:
        return getattr(dataclasses.replace(op, **{name: default}), name)
    except Exception:  # the default alone may be invalid for this op's other fields
        return default


def _same(value, default) -> bool:
    try:
        return bool(value == default) and type(value) is type(default)
    except Exception:
        return False


def format_call(op, args: str) -> str:
    """``op_name[attr=value, ...](args)``, with the non-default hyperparameters (a
    block's graph is printed after it, not as an attribute)."""
    attrs = {} if op.subgraph() is not None else non_default_attrs(op)
    attr_text = "[" + ", ".join(f"{k}={format_attr(v)}" for k, v in attrs.items()) + "]" if attrs else ""
    return f"{op.op_name}{attr_text}({args})"


def format_node(node) -> str:
    outputs = node.outputs
    spec = str(outputs[0]) if len(outputs) == 1 else "(" + ", ".join(map(str, outputs)) + ")"
    args = ", ".join(str(v) for v in node.inputs)
    line = f"%{node.name}: {spec} = {format_call(node.op, args)}"
    if node.shares_weights:
        line += f"  # shares weights with %{node.layer}"
    return line


def format_graph(graph, indent: str = "") -> str:
    params = ", ".join(f"%{name}: {graph.node(name).outputs[0]}" for name in graph.inputs)
    lines = [f"{indent}graph {graph.name}({params}) {{"]
    inputs = set(graph.inputs)
    for node in graph.nodes:
        if node.name in inputs:
            continue
        lines.append(f"{indent}  {format_node(node)}")
        inner = node.op.subgraph()
        if inner is not None and not node.shares_weights:
            lines[-1] += " {"
            lines.append(format_graph(inner, indent + "    "))
            lines.append(f"{indent}  }}")
    lines.append(f"{indent}  return " + ", ".join(str(v) for v in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def context_lines(graph, name: str, radius: int = 2) -> list[str]:
    """The printed lines of the node called ``name`` and its neighbours, the node's
    own line marked with '>'."""
    names = [n.name for n in graph.nodes]
    if name not in names:
        return []
    at = names.index(name)
    lines = []
    for node in graph.nodes[max(0, at - radius): at + radius + 1]:
        mark = ">" if node.name == name else " "
        where = f"  # {node.source}" if node.source is not None and node.name == name else ""
        lines.append(f"{mark} {format_node(node)}{where}")
    return lines
