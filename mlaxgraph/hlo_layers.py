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
import re
from typing import Any, Iterator, Mapping

from .ir.graph import Block, Graph
from .specs import bind_dims

__all__ = ["HloOperation", "HloByLayer", "hlo_by_layer", "parse_optimized_hlo",
           "parse_stablehlo", "layer_paths"]


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

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for opcode in self.fused:
            counts[opcode] = counts.get(opcode, 0) + 1
        inner = (" [" + ", ".join(o if n == 1 else f"{o} x{n}" for o, n in counts.items()) + "]"
                 if counts else "")
        others = f" (with {', '.join(self.layers)})" if len(self.layers) > 1 else ""
        inferred = f" (matched by shape: {self.inferred})" if self.inferred else ""
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
        return self.layers[layer]

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __str__(self) -> str:
        what = "optimized HLO" if self.optimized else "StableHLO"
        lines = [f"{what} by layer"]
        for layer, operations in self.layers.items():
            lines.append(f"{layer}: {len(operations)} operation{'s' if len(operations) != 1 else ''}")
            lines.extend(f"  {op}" for op in operations)
        return "\n".join(lines)


def layer_paths(graph: Graph, prefix: str = "") -> list[str]:
    """Paths of the graph's computing layers (not inputs, not blocks) in order, nested
    blocks' layers included (each call of a shared block under its own name)."""
    paths = []
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        if isinstance(node.op, Block):
            paths += layer_paths(node.op.graph, f"{prefix}{node.name}/")
        else:
            paths.append(prefix + node.name)
    return paths


def _layer_of(op_name: str, paths: frozenset[str]) -> str | None:
    """The longest layer path that prefixes the scope names after ``jit(...)/``."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end])
        if candidate in paths:
            return candidate
        candidate = candidate.replace("#", "@")  # the scope of a shared layer's call
        if candidate in paths:
            return candidate
    return None


# --- optimized HLO text ------------------------------------------------------------

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLED = re.compile(r"\b(calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALLED_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
# Computations an instruction applies per element or pair (reductions, sorts, scatters)
# are part of that instruction, not places where operations run on their own.
_APPLIERS = {"reduce", "reduce-window", "select-and-scatter", "scatter", "sort", "map",
             "all-reduce", "reduce-scatter", "all-reduce-start"}


@dataclasses.dataclass
class _Instruction:
    name: str
    type: str
    opcode: str
    computation: str
    op_name: str | None
    called: list[tuple[str, str]]  # (attribute, computation)
    line: str
    operands: tuple[str, ...] = ()


def _split_type(rest: str) -> tuple[str, str]:
    """``(type, remainder)`` of ``f32[8]{0} add(...)`` or ``(s32[], u32[4]) tuple(...)``."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].lstrip()
    type_, _, remainder = rest.partition(" ")
    return type_, remainder


def parse_optimized_hlo(text: str) -> dict[str, list[_Instruction]]:
    """Computation name -> its instructions, from an HLO module's text. The entry
    computation is also under the key ``""`` (an alias)."""
    computations: dict[str, list[_Instruction]] = {}
    current: list[_Instruction] | None = None
    name = ""
    for line in text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and not line.startswith("HloModule"):
                name = match.group(2)
                current = computations.setdefault(name, [])
                if match.group(1):
                    computations[""] = current
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        type_, remainder = _split_type(match.group(2))
        opcode = re.match(r"[\w\-]+", remainder)
        op_name = _OP_NAME.search(remainder)
        called = [(m.group(1), m.group(2)) for m in _CALLED.finditer(remainder)]
        for listed in _CALLED_LISTS.finditer(remainder):
            called += [("calls", c.strip().lstrip("%")) for c in listed.group(1).split(",") if c.strip()]
        operands = re.match(r"[\w\-]+\(([^)]*)\)", remainder)
        current.append(_Instruction(
            match.group(1), type_, opcode.group(0) if opcode else "", name,
            op_name.group(1) if op_name else None, called, line.strip(),
            tuple(o.strip().split(" ")[-1].lstrip("%") for o in operands.group(1).split(",")
                  if o.strip()) if operands else ()))
    return computations


def _optimized_operations(text: str, paths: frozenset[str]):
    computations = parse_optimized_hlo(text)
    inner: set[str] = set()  # fused computations and appliers: not top level
    for instructions in computations.values():
        for ins in instructions:
            for attribute, callee in ins.called:
                if ins.opcode == "fusion" or (attribute == "to_apply" and ins.opcode in _APPLIERS):
                    inner.add(callee)

    def contents(computation: str, seen: set[str]) -> list[_Instruction]:
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
            layers = [_layer_of(n, paths) for n in names]
            operation = HloOperation(
                "%" + ins.name, ins.opcode, ins.type, computation, tuple(dict.fromkeys(names)),
                tuple(dict.fromkeys(l for l in layers if l)),
                tuple(i.opcode for i in nested), ins.line)
            operations.append(operation)
            every.append((operation, [ins] + nested))
    return operations, (every, by_name)


# --- StableHLO text ------------------------------------------------------------------

_LOC_DEF = re.compile(r"^#(loc\d*)\s*=\s*loc\((.*)\)\s*$")
_LOC_REF = re.compile(r"loc\(#(loc\d*)\)\s*$")
_FUNC = re.compile(r"^\s*func\.func\s+(?:public\s+|private\s+)?@([\w.$\-]+)")
_OP = re.compile(r'^\s*(?:(%[\w#:.\-]+(?:\s*,\s*%[\w#:.\-]+)*)\s*=\s*)?"?([a-z_][\w]*\.[\w.]+|call)"?[\s(<@{]')
_CALLEE = re.compile(r"\bcall @([\w.$\-]+)")  # call and func.call
_RESULT_TYPE = re.compile(r"->\s*(\(?tensor<[^>]*>[^{]*?)\s*(?:loc\(|$)|:\s*(tensor<[^>]*>)\s*loc\(")


def _resolve_locations(text: str) -> dict[str, str | None]:
    """``locN`` -> the named-scope name it carries (``jit(apply)/conv/add``), or None."""
    bodies = {}
    for line in text.splitlines():
        match = _LOC_DEF.match(line)
        if match:
            bodies[match.group(1)] = match.group(2)
    cache: dict[str, str | None] = {}

    def resolve(body: str, depth: int = 0) -> str | None:
        if depth > 50:
            return None
        name = re.match(r'^"((?:[^"\\]|\\.)*)"(?:\((.*)\))?$', body.strip())
        if name:
            if name.group(1).startswith("jit("):
                return name.group(1)
            return resolve(name.group(2), depth + 1) if name.group(2) else None
        for ref in re.findall(r"#(loc\d*)", body):  # callsite(callee at caller), fused[...]
            found = lookup(ref, depth + 1)
            if found:
                return found
        return None

    def lookup(ref: str, depth: int = 0) -> str | None:
        if ref not in cache:
            cache[ref] = None  # guards against cycles
            cache[ref] = resolve(bodies.get(ref, ""), depth)
        return cache[ref]

    return {ref: lookup(ref) for ref in bodies}


@dataclasses.dataclass
class _StableOp:
    name: str
    opcode: str
    type: str
    scope: str | None
    line: str
    inner: list["_StableOp"] = dataclasses.field(default_factory=list)  # its regions' ops


def parse_stablehlo(text: str) -> dict[str, list[_StableOp]]:
    """Function name -> its top-level operations; an operation with regions (a
    reduce's body, a while's condition and body) holds their operations in ``inner``
    and takes its location from the line closing them."""
    locations = _resolve_locations(text)
    functions: dict[str, list[_StableOp]] = {}
    current: list[_StableOp] | None = None
    depth = 0
    open_ops: list[tuple[_StableOp, int]] = []  # operations whose regions are open
    last: _StableOp | None = None  # the operation a region opened on its own line belongs to
    for raw in text.splitlines():
        line = raw.rstrip()
        func = _FUNC.match(line)
        if func and current is None:
            current = functions.setdefault(func.group(1), [])
            depth, open_ops = line.count("{") - line.count("}"), []
            continue
        if current is None or line.startswith("#loc"):
            continue
        delta = line.count("{") - line.count("}")
        ref = _LOC_REF.search(line)
        op = _OP.match(line)
        if op and op.group(2) not in ("func.return", "stablehlo.return"):
            opcode = op.group(2)
            if opcode in ("call", "func.call"):
                callee = _CALLEE.search(line)
                opcode = f"call @{callee.group(1)}" if callee else "call"
            result = _RESULT_TYPE.search(line)
            type_ = (result.group(1) or result.group(2)).strip() if result else ""
            if not type_ and " : " in line:  # `while(...) : tensor<a>, tensor<b>`
                type_ = re.sub(r"\s*loc\(.*$", "", line.rsplit(" : ", 1)[1]).strip()
            entry = _StableOp(op.group(1) or "", opcode, type_,
                              locations.get(ref.group(1)) if ref else None, line.strip())
            (open_ops[-1][0].inner if open_ops else current).append(entry)
            last = entry
            if delta > 0:
                open_ops.append((entry, depth))
        elif delta > 0 and last is not None:  # `cond {` of a while on the line before
            open_ops.append((last, depth))
        depth += delta
        if delta < 0 and open_ops and depth <= open_ops[-1][1]:
            entry, _ = open_ops.pop()
            if ref:
                entry.scope = locations.get(ref.group(1))
            result = _RESULT_TYPE.search(line)
            if result and not entry.type:
                entry.type = (result.group(1) or result.group(2)).strip()
        if depth <= 0:
            current = None
    return functions


def _stablehlo_operations(text: str, paths: frozenset[str]):
    functions = parse_stablehlo(text)

    def contents(op: _StableOp, seen: set[str]) -> list[_StableOp]:
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
        layers = [_layer_of(n, paths) for n in names]
        operations.append(HloOperation(op.name, op.opcode, op.type, "main",
                                       tuple(dict.fromkeys(names)),
                                       tuple(dict.fromkeys(l for l in layers if l)),
                                       tuple(i.opcode for i in nested), op.line))
    return operations, None


# --- by layer --------------------------------------------------------------------------


def _dims_of(type_: str) -> tuple[int, ...] | None:
    match = re.match(r"^[a-z]\w*\[([\d,]*)\]", type_)
    if not match:
        return None
    return tuple(int(d) for d in match.group(1).split(",") if d)


def _neighbours(graph: Graph, prefix: str = "") -> dict[str, tuple[list[str], Any, Any]]:
    """Layer path -> (the layers it reads from and that read it, its first input's spec,
    its first output's spec), for layers of one input and one output."""
    found: dict[str, tuple[list[str], Any, Any]] = {}

    def output_path(g: Graph, node_name: str, pre: str) -> str:
        node = g.node(node_name)
        if isinstance(node.op, Block):
            value = node.op.graph.outputs[0]
            return output_path(node.op.graph, value.node, f"{pre}{node.name}/")
        return pre + node_name

    readers = graph.consumers()
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        if isinstance(node.op, Block):
            found.update(_neighbours(node.op.graph, f"{prefix}{node.name}/"))
            continue
        if len(node.inputs) != 1 or len(node.outputs) != 1:
            continue
        near = [output_path(graph, v.node, prefix) for v in node.inputs if v.node not in graph.inputs]
        near += [prefix + n.name for n in readers[node.name] if not isinstance(n.op, Block)]
        found[prefix + node.name] = (near, graph.spec(node.inputs[0]), node.outputs[0])
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
    all_paths = layer_paths(model.graph)
    paths = frozenset(all_paths)
    parse = _optimized_operations if optimized else _stablehlo_operations
    operations, found = parse(text, paths)
    layers: dict[str, list[HloOperation]] = {p: [] for p in all_paths}
    unattributed = []
    for operation in operations:
        for layer in operation.layers:
            layers[layer].append(operation)
        if not operation.layers:
            unattributed.append(operation)
    if optimized:
        _infer_unnamed(model, layers, *found, example, dims)
    return HloByLayer({k: tuple(v) for k, v in layers.items()}, optimized, text,
                      tuple(unattributed))


def _infer_unnamed(model, layers, every, by_name, example, dims) -> None:
    """A layer left without operations whose reshape XLA made a bitcast, which carries a
    neighbouring layer's name: the top-level operation holding a bitcast (or reshape)
    from the layer's input shape to its output shape named after a layer it reads from
    or that reads it."""
    from .inspect import dim_values

    bindings = dim_values(model, example, dims)
    neighbours = _neighbours(model.graph)
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
                    match = (f"{ins.opcode} {source.type.split('{')[0]} -> "
                             f"{ins.type.split('{')[0]} without a name")
                    break
                owner = _layer_of(ins.op_name, frozenset(near))
                if owner:
                    match = (f"{ins.opcode} {source.type.split('{')[0]} -> "
                             f"{ins.type.split('{')[0]} named after {owner}")
                    break
            if match:
                ops.append(dataclasses.replace(operation, inferred=match,
                                               layers=operation.layers + (layer,)))
                break
