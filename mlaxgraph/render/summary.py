"""The summary table of a graph: layer, op, output shape, dtype, params, connected to."""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigError
from ..core.signatures import unknown_keywords
from ..core.specs import dtype_str, flatten_specs, shape_str, trains

__all__ = ["summarize", "count_params", "weight_bytes", "count_text"]


def count_text(count) -> str:
    """A count with thousands separators; a symbolic one (a decoding graph's caches for
    any batch) as its formula of the dims, ``2048*batch+12704``."""
    return f"{count:,}" if isinstance(count, (int, np.integer)) else str(count).replace(" ", "")


def _split(graph, node, measure) -> tuple[int, int]:
    """(trainable, non-trainable) ``measure(spec)`` of ``node``'s weights: its state and
    a quantized layer's stored values (which cannot train) are non-trainable."""
    specs = graph.input_specs_of(node)
    params = [p for _, p in flatten_specs(node.op.param_specs(specs))]
    state = [p for _, p in flatten_specs(node.op.state_specs(specs))]
    frozen = [p for p in params if p.dtype is not None and not trains(p.dtype)]
    return (sum(measure(p) for p in params if not any(p is f for f in frozen)),
            sum(measure(p) for p in state + frozen))


def weight_bytes(graph, param_dtype="float32") -> tuple[int, int]:
    """(trainable, non-trainable) bytes of the weights as stored under ``param_dtype``
    (a weight whose spec fixes its dtype, as a quantized layer's, in that dtype), each
    layer counted once, nested blocks' included; a quantized layer's stored values
    are non-trainable, with the state."""
    seen: set[str] = set()
    trainable = state = 0
    for node in graph.nodes:
        if node.layer in seen:
            continue
        seen.add(node.layer)
        t, s = _split(graph, node, lambda p: p.stored_bytes(param_dtype))
        trainable, state = trainable + t, state + s
    return trainable, state


def count_params(graph) -> dict[str, tuple[int, int]]:
    """Layer name -> (trainable count, non-trainable count), each layer counted once;
    a quantized layer's stored values (int8, packed int4, float8) are non-trainable,
    with the state."""
    counts: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.layer not in counts:
            counts[node.layer] = _split(graph, node, lambda p: p.size)
    return counts


def _rows(graph, expand_nested: bool, indent: str = "", sharding=None, prefix: str = ""):
    counts = count_params(graph)
    for node in graph.nodes:
        trainable, state = counts[node.layer]
        if node.shares_weights:
            params = f"(shared with {node.layer})"
        else:
            params = count_text(trainable + state)
        row = (indent + node.op.display_name(node.name), node.op.op_name,
               ", ".join(shape_str(s.shape) for s in node.outputs),
               ", ".join(dtype_str(s.dtype) for s in node.outputs), params,
               ", ".join(str(v).lstrip("%") for v in node.inputs))
        yield row if sharding is None else row + (sharding.get(prefix + node.name, ""),)
        inner = node.op.subgraph()
        if expand_nested and inner is not None and not node.shares_weights:
            yield from _rows(inner, expand_nested, indent + "  ", sharding,
                             f"{prefix}{node.name}/")


def _size(size) -> str:
    if not isinstance(size, (int, float, np.integer)):  # symbolic: its formula
        return f"{count_text(size)} B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return ""


def summarize(graph, expand_nested: bool = False, param_dtype="float32",
              sharding=None, unknown=None) -> str:
    """The summary table; nested blocks' layers listed under them with ``expand_nested``;
    sizes of weights as stored (at ``param_dtype``, or the dtype a weight fixes: a
    quantized layer's int8 values); with ``sharding`` (path -> text, from a
    compiled model's sharding plan) a last column showing each layer's sharding.
    ``unknown``: keywords the caller's ``summary`` was given and does not take."""
    if unknown:
        raise ConfigError(unknown_keywords("summary", unknown, "summary(expand_nested=False)"))
    header: tuple[str, ...] = ("layer", "op", "output shape", "dtype", "params", "connected to")
    if sharding is not None:
        header += ("sharding",)
    rows = list(_rows(graph, expand_nested, sharding=sharding))
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]

    def fmt(row):
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

    rule = "-" * len(fmt(tuple("-" * w for w in widths)))
    counts = count_params(graph).values()
    trainable, state = sum(c[0] for c in counts), sum(c[1] for c in counts)
    trainable_bytes, state_bytes = weight_bytes(graph, np.dtype(param_dtype))
    return "\n".join([
        f'graph "{graph.name}"', rule, fmt(header), rule, *(fmt(r) for r in rows), rule,
        f"trainable params: {count_text(trainable)} ({_size(trainable_bytes)})",
        f"non-trainable params: {count_text(state)} ({_size(state_bytes)})",
        f"inputs: {', '.join(f'{n} {graph.node(n).outputs[0]}' for n in graph.inputs)}",
        f"outputs: {', '.join(str(graph.spec(v)) for v in graph.outputs)}",
    ])
