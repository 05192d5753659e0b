"""Bodies that make sequences, read into the graph node by node once per element or
iteration (as an ``If`` with a condition known when the graph is built is its
branch): ``SequenceMap`` and a ``Loop`` whose values or body hold sequences, whose
trip count and condition are known when the graph is built (ONNX's expanded
``SequenceMap`` is such a ``Loop`` over a ``SequenceLength``). The values the body
makes are kept under names of their own after each reading, so the next one reads
the body afresh; the loop's scan outputs are stacked as ``ConcatFromSequence``
with ``new_axis=1``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import GraphError, ShapeError
from .protos import tensor_to_array
from .sequences import Opt, Seq, _node, _sequence

__all__ = ["sequence_map", "unroll", "MAX_ITERATIONS"]

#: a loop read once per iteration stops with an ``mg.ShapeError`` beyond this many
MAX_ITERATIONS = 4096


def _body(node: Any, where: str) -> Any:
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        raise GraphError(f"{where} has no body")
    return body


def _keep(reader: Any, value: Any, name: str) -> Any:
    """A value the body made, under names that outlive the body's next reading."""
    if isinstance(value, Seq) and value.names is not None:
        kept = [f"{name}__{j}" for j in range(len(value.names))]
        for new, old in zip(kept, value.names):
            reader.values[new] = reader.values[old]
        return Seq(kept)
    if isinstance(value, Opt) and value.name is not None:
        reader.values[f"{name}__value"] = _keep(reader, reader.values[value.name],
                                                f"{name}__value")
        return Opt(f"{name}__value")
    return value


def _made(graph: Any) -> list[str]:
    """The names a body defines, in the branches of its nodes too."""
    names = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    for n in graph.node:
        names += [o for o in n.output if o]
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names += _made(g)
    return names


class _Reading:
    """The body's names (its inputs, initializers and node outputs), set aside while
    it is read and given back afterwards."""

    def __init__(self, reader: Any, body: Any, where: str):
        from .order import _toposort

        self.reader, self.body, self.where = reader, body, where
        self.local = _made(body)
        self.saved = {n: reader.values[n] for n in self.local if n in reader.values}
        self.nodes = _toposort(list(body.node), set(reader.values) | set(self.local))
        for n in body.node:
            for v in n.input:
                reader.consumers.setdefault(v, []).append(n)

    def read(self, values: list, prefix: str) -> list:
        """The body's outputs for these values of its inputs, kept under ``prefix``."""
        reader, body = self.reader, self.body
        for formal, value in zip(body.input, values):
            reader.values[formal.name] = value
        for t in body.initializer:
            reader.values[t.name] = tensor_to_array(t, reader.folder)
        for n in self.nodes:
            reader.node(n)
        outs = []
        for k, value in enumerate(body.output):
            if value.name not in reader.values:
                raise GraphError(f"{self.where}: its body output {value.name!r} is computed "
                                 f"by no node")
            kept = f"{prefix}__{k}"
            reader.values[kept] = _keep(reader, reader.values[value.name], kept)
            outs.append(reader.values[kept])
        for name in self.local:  # the next reading reads the body afresh
            reader.materialized.pop(name, None)
            reader.values.pop(name, None)
        reader.done.difference_update(id(n) for n in body.node)
        return outs

    def close(self) -> None:
        for name in self.local:
            self.reader.values.pop(name, None)
        self.reader.values.update(self.saved)


def sequence_map(reader: Any, node: Any, where: str) -> None:
    """``SequenceMap``: its body read once per element of its sequences (a tensor
    input is given whole to each reading)."""
    body = _body(node, where)
    if len(body.input) != len(node.input) or len(body.output) != len(node.output):
        raise GraphError(f"{where}: its body takes {len(body.input)} inputs and gives "
                         f"{len(body.output)} outputs; the node has {len(node.input)} and "
                         f"{len(node.output)}")
    columns = [_sequence(reader, v, where).items(where) if p == 0 or
               isinstance(reader.values[v], Seq) else None for p, v in enumerate(node.input)]
    n = len(columns[0] or [])
    if any(c is not None and len(c) != n for c in columns):
        raise ShapeError(f"{where}: its sequences have different lengths")
    reading = _Reading(reader, body, where)
    outs: list[list[str]] = [[] for _ in node.output]
    for i in range(n):
        values = [reader.values[c[i] if c is not None else v]
                  for c, v in zip(columns, node.input)]
        reading.read(values, f"{node.output[0]}__map{i}")
        for k in range(len(node.output)):
            outs[k].append(f"{node.output[0]}__map{i}__{k}")
    reading.close()
    for out, names in zip(node.output, outs):
        if out:
            reader.values[out] = Seq(names)


def _known(reader: Any, name: str, where: str, what: str) -> Any:
    if not name:
        return None
    value = reader.values[name]
    array = getattr(value, "array", value)
    if not isinstance(array, np.ndarray) or array.size != 1:
        raise ShapeError(f"{where}: its {what} ({name!r}) must be one value known when the "
                         f"graph is built to read a loop carrying a sequence")
    return array.reshape(-1)[0]


def unroll(reader: Any, node: Any, where: str) -> None:
    """A ``Loop`` whose carried values or body hold sequences: its body read once per
    iteration, while its trip count and condition (constants) let it go on."""
    body = _body(node, where)
    inputs = list(node.input) + [""] * max(0, 2 - len(node.input))
    trips = _known(reader, inputs[0], where, "trip count")
    go = _known(reader, inputs[1], where, "condition")
    carried = [reader.values[v] for v in node.input[2:]]
    n_scan = len(body.output) - 1 - len(carried)
    if len(body.input) != 2 + len(carried) or n_scan < 0:
        raise GraphError(f"{where}: its body takes {len(body.input)} inputs and gives "
                         f"{len(body.output)} outputs for {len(carried)} carried values")
    limit = int(trips) if trips is not None else MAX_ITERATIONS + 1
    reading = _Reading(reader, body, where)
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    i = 0
    while i < limit and (go is None or bool(go)):
        if i == MAX_ITERATIONS:
            raise ShapeError(f"{where} runs more than {MAX_ITERATIONS} iterations")
        prefix = f"{node.output[0] or 'loop'}__it{i}"
        outs = reading.read([np.asarray(i, np.int64), np.asarray(True if go is None else go)]
                            + carried, prefix)
        cond = getattr(outs[0], "array", outs[0])
        if not isinstance(cond, np.ndarray):
            raise ShapeError(f"{where}: its body's condition is computed at run time; a loop "
                             f"carrying a sequence is read only when it is known when the "
                             f"graph is built")
        go = cond.reshape(-1)[0]
        carried = outs[1:1 + len(carried)]
        for k in range(n_scan):
            scans[k].append(f"{prefix}__{1 + len(carried) + k}")
        i += 1
    reading.close()
    results = node.output[:len(carried)]
    for out, value in zip(results, carried):
        if out:
            reader.values[out] = value
    for out, names in zip(node.output[len(carried):], scans):
        if not out:
            continue
        if not names:
            raise ShapeError(f"{where}: a scan output of a loop running no iteration has "
                             f"no shape")
        reader.values[f"{out}__scan"] = Seq(names)
        _node(reader, "ConcatFromSequence", [f"{out}__scan"], [out], node.name, axis=0,
              new_axis=1)
