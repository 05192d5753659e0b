"""The summary table of a graph: layer, op, output shape, dtype, params, inputs."""

from __future__ import annotations

from ..specs import dtype_str, flatten_specs, shape_str

__all__ = ["summarize", "count_params"]


def count_params(graph) -> dict[str, tuple[int, int]]:
    """Layer name -> (trainable count, non-trainable count), each layer counted once."""
    from .graph import Block

    counts: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.layer in counts:
            continue
        if isinstance(node.op, Block):
            inner = count_params(node.op.graph).values()
            counts[node.layer] = (sum(c[0] for c in inner), sum(c[1] for c in inner))
            continue
        specs = graph.input_specs_of(node)
        trainable = sum(p.size for _, p in flatten_specs(node.op.param_specs(specs)))
        state = sum(p.size for _, p in flatten_specs(node.op.state_specs(specs)))
        counts[node.layer] = (trainable, state)
    return counts


def summarize(graph) -> str:
    counts = count_params(graph)
    header = ("layer", "op", "output shape", "dtype", "params", "inputs")
    rows = []
    for node in graph.nodes:
        trainable, state = counts[node.layer]
        if node.shares_weights:
            params = f"(shared with {node.layer})"
        else:
            params = f"{trainable + state:,}" if trainable + state else "0"
        shape = ", ".join(shape_str(s.shape) for s in node.outputs)
        dtype = ", ".join(dtype_str(s.dtype) for s in node.outputs)
        inputs = ", ".join(str(v).lstrip("%") for v in node.inputs)
        rows.append((node.name, node.op.op_name, shape, dtype, params, inputs))
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]

    def fmt(row):
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

    rule = "-" * len(fmt(tuple("-" * w for w in widths)))
    total_trainable = sum(c[0] for name, c in counts.items())
    total_state = sum(c[1] for name, c in counts.items())
    lines = [f'graph "{graph.name}"', rule, fmt(header), rule]
    lines += [fmt(r) for r in rows]
    lines += [rule,
              f"trainable params: {total_trainable:,}",
              f"non-trainable params: {total_state:,}",
              f"inputs: {', '.join(f'{n} {graph.node(n).outputs[0]}' for n in graph.inputs)}",
              f"outputs: {', '.join(str(graph.spec(v)) for v in graph.outputs)}"]
    return "\n".join(lines)
