"""HLO by layer: each operation of a model's StableHLO or optimized HLO, traced back to
the layer that produced it through the named scopes the lowering puts around every
layer (``jit(apply)/<block>/<layer>/<primitive>``).

In StableHLO the name is in each operation's location (``loc(#locN)``, kept with
``debug_info``); in XLA's optimized HLO it is the ``op_name`` of each instruction's
``metadata``. A fusion lists the layers of every instruction it fused, so it shows
under each of them: that is how one sees what a layer became after fusion.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ...compiler.stages import dim_values
from ...core.errors import GraphError
from ...core.specs import bind_dims
from .text import Instruction, StableOp, layer_of, parse_optimized_hlo, parse_stablehlo

__all__ = ["HloOperation", "HloByLayer", "hlo_by_layer"]


@dataclasses.dataclass(frozen=True)
class HloOperation:
    """One operation of an HLO text.

    Attributes:
      name: its name (``%convolution.1``, ``%4``).
      opcode: ``convolution``, ``fusion``, ``stablehlo.add``, ``call``, ...
      type: its result type as printed (``f32[8,8,8,16]{3,2,1,0}``,
        ``tensor<8x10xf32>``).
      computation: the computation (optimized HLO) or function (StableHLO) holding it.
      op_names: the named-scope names of the operation and, for a fusion or a call,
        of the operations inside it.
      layers: the layers those names belong to, in order of appearance.
      fused: for a fusion or call, the opcodes inside it (parameters left out).
      line: the operation's text, as printed.
      inferred: set when the operation carries another layer's name or none and was
        matched to this layer by shape: XLA turns a reshape into a bitcast that keeps
        a neighbouring layer's name, or none. Says which bitcast it found.
      owner: the layer the operation itself is named after (for a fusion, its root's
        layer): the operation is that layer's own, and shared with the other layers
        whose operations it fused (XLA merges equal computations of several layers
        into one, named after the first).
    """

    name: str
    opcode: str
    type: str
    computation: str
    op_names: tuple[str, ...]
    layers: tuple[str, ...]
    fused: tuple[str, ...] = ()
    line: str = dataclasses.field(default="", repr=False)
    inferred: str | None = None
    owner: str | None = None

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for opcode in self.fused:
            counts[opcode] = counts.get(opcode, 0) + 1
        inner = (" [" + ", ".join(o if n == 1 else f"{o} x{n}" for o, n in counts.items()) + "]"
                 if counts else "")
        others = f" (with {', '.join(self.layers)})" if len(self.layers) > 1 else ""
        inferred = f" (matched by {self.inferred})" if self.inferred else ""
        return f"{self.name} = {self.opcode} {self.type}{inner}{others}{inferred}"


@dataclasses.dataclass(frozen=True)
class HloByLayer(Mapping[str, tuple]):
    """Layer path -> the operations that compute it, in program order. Every layer of
    the graph is a key (inputs and blocks are not: their layers are); a layer XLA
    removed, or an identity (Dropout in inference), has no operations.

    Attributes:
      optimized: whether the text is XLA's optimized HLO (else StableHLO).
      text: the HLO text the operations come from.
      unattributed: operations whose name matches no layer (parameters, constants,
        copies XLA added).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> by_layer = mg.compile(mlp(8, (4,), 2)).hlo_by_layer(batch=2)
      >>> any("dot" in (op.opcode,) + op.fused for op in by_layer["dense"])
      True
    """

    layers: Mapping[str, tuple[HloOperation, ...]]
    optimized: bool
    text: str = dataclasses.field(repr=False, default="")
    unattributed: tuple[HloOperation, ...] = dataclasses.field(repr=False, default=())

    def __getitem__(self, layer: str) -> tuple[HloOperation, ...]:
        try:
            return self.layers[layer]
        except KeyError:
            close = difflib.get_close_matches(str(layer), list(self.layers), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise GraphError(f"HLO by layer has no layer {layer!r}{hint} Its layers: "
                             f"{', '.join(self.layers)}") from None

    def __contains__(self, layer: object) -> bool:
        return layer in self.layers

    def get(self, layer: str, default: Any = None) -> Any:
        return self.layers.get(layer, default)

    def own(self, layer: str) -> tuple[HloOperation, ...]:
        """The operations of ``layer`` that are its own (named after it)."""
        return tuple(op for op in self[layer] if op.owner in (layer, None))

    def shared(self, layer: str) -> tuple[HloOperation, ...]:
        """The operations listed under ``layer`` that belong to another layer (their
        ``owner``): fusions that absorbed some of ``layer``'s computation."""
        return tuple(op for op in self[layer] if op.owner not in (layer, None))

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __str__(self) -> str:
        what = "optimized HLO" if self.optimized else "StableHLO"
        lines = [f"{what} by layer"]
        for layer in self.layers:
            own, shared = self.own(layer), self.shared(layer)
            lines.append(f"{layer}: {len(own)} operation{'s' if len(own) != 1 else ''}"
                         + (f", and parts of {len(shared)} of other layers" if shared else ""))
            lines.extend(f"  {op}" for op in own)
            lines.extend(f"  {op} [shared: {op.owner}'s]" for op in shared)
        return "\n".join(lines)


# --- optimized HLO ------------------------------------------------------------

# Computations an instruction applies per element or pair (reductions, sorts, scatters)
# are part of that instruction, not places where operations run on their own.
_APPLIERS = {"reduce", "reduce-window", "select-and-scatter", "scatter", "sort", "map",
             "all-reduce", "reduce-scatter", "all-reduce-start"}


def _optimized_operations(text: str, paths: frozenset[str]):
    computations = parse_optimized_hlo(text)
    inner: set[str] = set()  # fused computations and appliers: not top level
    for instructions in computations.values():
        for ins in instructions:
            for attribute, callee in ins.called:
                if ins.opcode == "fusion" or (attribute == "to_apply" and ins.opcode in _APPLIERS):
                    inner.add(callee)

    def contents(computation: str, seen: set[str]) -> list[Instruction]:
        found = []
        for ins in computations.get(computation, []):
            found.append(ins)
            for _, callee in ins.called:
                if callee not in seen:
                    seen.add(callee)
                    found += contents(callee, seen)
        return found

    operations, every = [], []
    by_name = {(c, i.name): i for c, instructions in computations.items() for i in instructions}
    order = [n for n in computations if n]
    for computation in order:
        if computation in inner:
            continue
        for ins in computations[computation]:
            nested = []
            if ins.opcode == "fusion" and ins.called:
                nested = [i for i in contents(ins.called[0][1], set()) if i.opcode != "parameter"]
            names = [n for n in [ins.op_name] + [i.op_name for i in nested] if n]
            layers = [layer_of(n, paths) for n in names]
            found = tuple(dict.fromkeys(layer for layer in layers if layer))
            owner = (layer_of(ins.op_name, paths) if ins.op_name else None) or \
                (found[0] if found else None)
            operation = HloOperation(
                "%" + ins.name, ins.opcode, ins.type, computation, tuple(dict.fromkeys(names)),
                found, tuple(i.opcode for i in nested), ins.line, owner=owner)
            operations.append(operation)
            every.append((operation, [ins] + nested))
    return operations, (every, by_name)


def _stablehlo_operations(text: str, paths: frozenset[str]):
    functions = parse_stablehlo(text)

    def contents(op: StableOp, seen: set[str]) -> list[StableOp]:
        """The operations inside ``op``: its regions' and, for a call, the callee's."""
        found = []
        for inner in op.inner:
            found += [inner] + contents(inner, seen)
        if op.opcode.startswith("call @"):
            name = op.opcode[len("call @"):]
            if name not in seen:
                seen.add(name)
                for inner in functions.get(name, []):
                    found += [inner] + contents(inner, seen)
        return found

    operations = []
    for op in functions.get("main", []):
        nested = contents(op, set())
        names = [n for n in [op.scope] + [i.scope for i in nested] if n]
        layers = [layer_of(n, paths) for n in names]
        found = tuple(dict.fromkeys(layer for layer in layers if layer))
        owner = (layer_of(op.scope, paths) if op.scope else None) or (found[0] if found else None)
        operations.append(HloOperation(op.name, op.opcode, op.type, "main",
                                       tuple(dict.fromkeys(names)), found,
                                       tuple(i.opcode for i in nested), op.line, owner=owner))
    return operations


# --- by layer --------------------------------------------------------------------------


def _dims_of(type_: str) -> tuple[int, ...] | None:
    match = re.match(r"^[a-z]\w*\[([\d,]*)\]", type_)
    if not match:
        return None
    return tuple(int(d) for d in match.group(1).split(",") if d)


def _neighbours(program) -> dict[str, tuple[list[str], Any, Any]]:
    """Layer path -> (the layers it reads from and that read it, its first input's spec,
    its first output's spec), for layers of one input and one output."""
    readers: dict[str, list[str]] = {}
    for step in program.steps:
        for path, _ in step.inputs:
            readers.setdefault(path, []).append(step.path)
    found = {}
    for step in program.steps:
        if len(step.inputs) != 1 or len(step.output_specs) != 1:
            continue
        near = [path for path, _ in step.inputs if path not in program.inputs]
        near += readers.get(step.path, [])
        found[step.path] = (near, step.input_specs[0], step.output_specs[0])
    return found


def hlo_by_layer(model, *example: Any, optimized: bool = True, inference_mode: bool = False,
                 **dims: int) -> HloByLayer:
    """Each layer of ``model`` with the HLO operations that compute it.

    Args:
      model: an ``mg.CompiledModel``.
      *example: example arrays instead of dim values.
      optimized: XLA's optimized HLO (after fusion) if True, else the StableHLO.
      inference_mode: as for ``model.hlo``.
      **dims: the symbolic dims' values (``batch=8``).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> by_layer = mg.compile(mlp(8, (4,), 2)).hlo_by_layer(batch=2, optimized=False)
      >>> list(by_layer)
      ['dense', 'relu', 'logits']
      >>> by_layer["dense"][0].opcode, by_layer["dense"][-1].opcode
      ('stablehlo.dot_general', 'stablehlo.add')
    """
    text = model.hlo(*example, optimized=optimized, inference_mode=inference_mode, **dims)
    # A scan's body's layers have their own operations (inside the scan's loop); the
    # scan itself has those of the loop around them.
    all_paths = [step.path for step in model.program.all_steps()]
    paths = frozenset(all_paths)
    if optimized:
        operations, unnamed = _optimized_operations(text, paths)
    else:
        operations, unnamed = _stablehlo_operations(text, paths), None
    layers: dict[str, list[HloOperation]] = {p: [] for p in all_paths}
    if unnamed is not None:
        operations = _by_weights(operations, unnamed, paths)
    unattributed = []
    for operation in operations:
        for layer in operation.layers:
            layers[layer].append(operation)
        if not operation.layers:
            unattributed.append(operation)
    if unnamed is not None:
        every, by_name = unnamed
        _infer_unnamed(model, layers, every, by_name, example, dims)
    return HloByLayer({k: tuple(v) for k, v in layers.items()}, optimized, text,
                      tuple(unattributed))


def _infer_unnamed(model, layers, every, by_name, example, dims) -> None:
    """A layer left without operations whose reshape XLA made a bitcast, which carries a
    neighbouring layer's name: the top-level operation holding a bitcast (or reshape)
    from the layer's input shape to its output shape named after a layer it reads from
    or that reads it."""
    bindings = dim_values(model, example, dims)
    neighbours = _neighbours(model.program)
    for layer, ops in layers.items():
        if ops or layer not in neighbours:
            continue
        near, spec_in, spec_out = neighbours[layer]
        try:
            want_in, want_out = bind_dims(spec_in.shape, bindings), bind_dims(spec_out.shape, bindings)
        except Exception:  # a dim not known from the inputs
            continue
        for operation, instructions in every:
            match = None
            for ins in instructions:
                if ins.opcode not in ("bitcast", "reshape") or _dims_of(ins.type) != want_out:
                    continue
                source = by_name.get((ins.computation, ins.operands[0])) if ins.operands else None
                if source is None or _dims_of(source.type) != want_in:
                    continue
                if ins.op_name is None:
                    match = (f"shape: {ins.opcode} {source.type.split('{')[0]} -> "
                             f"{ins.type.split('{')[0]} without a name")
                    break
                owner = layer_of(ins.op_name, frozenset(near))
                if owner:
                    match = (f"shape: {ins.opcode} {source.type.split('{')[0]} -> "
                             f"{ins.type.split('{')[0]} named after {owner}")
                    break
            if match:
                ops.append(dataclasses.replace(operation, inferred=match, owner=layer,
                                               layers=operation.layers + (layer,)))
                break


def _by_weights(operations, unnamed, paths: frozenset[str]) -> list[HloOperation]:
    """An operation XLA left without a name (a convolution it rewrote drops its
    metadata) belongs to the one layer whose weights it reads: through its operands, and
    theirs while they are unnamed too, up to the parameters (``params__<path>__<leaf>``)."""
    every, by_name = unnamed
    named = {op.name[1:]: bool(op.layers) for op in operations}
    flat = {re.sub(r"\W", "_", path): path for path in paths}

    def weights(ins, depth: int) -> set[str]:
        found: set[str] = set()
        for operand in ins.operands:
            source = by_name.get((ins.computation, operand))
            if source is None or named.get(source.name, False):
                continue
            if source.opcode == "parameter":
                parts = [part for part in re.sub(r"\.\d+$", "", source.name).split("__") if part]
                if len(parts) > 2 and parts[0] == "params":
                    layer = flat.get("_".join(parts[1:-1])) or flat.get(
                        re.sub(r"\W", "_", "/".join(parts[1:-1])))
                    found |= {layer} if layer else set()
            elif depth:
                found |= weights(source, depth - 1)
        return found

    out = []
    for operation, instructions in every:
        if not operation.layers and instructions[0].opcode != "parameter":
            owners = weights(instructions[0], 2)
            if len(owners) == 1:
                layer = owners.pop()
                operation = dataclasses.replace(operation, layers=(layer,), owner=layer,
                                                inferred=f"the weights it reads: {layer}'s")
        out.append(operation)
    return out
