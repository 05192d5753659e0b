"""HLO text, read once: the one parser of XLA's optimized HLO modules and of StableHLO,
and the one rule that maps an operation's named-scope name back to the layer it came
from (the convention is ``mlaxgraph.core.scopes``). HLO by layer, the collectives and
the policy comparison read HLO through this module.

In StableHLO the name is in each operation's location (``loc(#locN)``, kept with
``debug_info``); in XLA's optimized HLO it is the ``op_name`` of each instruction's
``metadata``. Names of operations of the backward pass wrap the layer's scope
(``transpose(jvp(dense))``); an operation XLA combined from several lists their names
(``(a/x:b/y)``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from ...core.scopes import path_of_scope

__all__ = ["Instruction", "StableOp", "parse_optimized_hlo", "parse_stablehlo",
           "scope_paths", "layer_of", "instructions", "OP_NAME"]

_JIT = re.compile(r"^(?:p?jit\([^)]*\)/)+")
_WRAPPER = re.compile(r"^[\w.]+\((?P<inner>.*)\)$")


def scope_paths(op_name: str) -> list[str]:
    """The scope paths an operation's name carries, each without the ``jit(...)``
    prefix, the primitive, and the ``transpose(jvp(...))`` wrappers of autodiff; one
    per name of an operation XLA combined from several.

    Example:
      >>> scope_paths("jit(step)/(transpose(jvp(fc))/dot_general:transpose(jvp(b))/transpose(jvp(out#1))/reduce_sum)")
      ['fc', 'b/out@1']
    """
    rest = _JIT.sub("", op_name)
    names = rest[1:-1].split(":") if rest.startswith("(") and rest.endswith(")") else [rest]
    found: list[str] = []
    for name in names:
        parts = []
        for part in name.split("/")[:-1]:  # the last part is the primitive
            while (m := _WRAPPER.match(part)) is not None:  # transpose(jvp(layer)) -> layer
                part = m.group("inner")
            if part:
                parts.append(part)
        path = path_of_scope("/".join(parts))
        if path and path not in found:
            found.append(path)
    return found


def layer_of(op_name: str, paths: Iterable[str]) -> str | None:
    """The layer of ``paths`` that ``op_name``'s scope names (the first name, for an
    operation combined from several), or None: the longest run of the scope's parts
    that is a layer path, the innermost of equal length (a scan's body's operations
    are named ``b0..b3/while/body/closed_call/b0..b3/attention/...``).

    Example:
      >>> layer_of("jit(apply)/block0/dense#1/dot_general", {"block0/dense@1", "block0"})
      'block0/dense@1'
      >>> layer_of("jit(apply)/s/while/body/closed_call/s/fc/add", {"s", "s/fc", "fc"})
      's/fc'
    """
    paths = paths if isinstance(paths, (set, frozenset, dict)) else frozenset(paths)
    for scope in scope_paths(op_name):
        parts = scope.split("/")
        best: tuple[int, int] | None = None
        for start in range(len(parts)):
            for end in range(len(parts), start, -1):
                if "/".join(parts[start:end]) in paths:
                    if best is None or (end - start, start) > (best[1] - best[0], best[0]):
                        best = (start, end)
                    break
        if best is not None:
            return "/".join(parts[best[0]:best[1]])
    return None


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLED = re.compile(r"\b(calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALLED_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
@dataclasses.dataclass
class Instruction:
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


def parse_optimized_hlo(text: str) -> dict[str, list[Instruction]]:
    """Computation name -> its instructions, from an HLO module's text. The entry
    computation is also under the key ``""`` (an alias); a fragment (instructions
    without their computation) is read as the entry computation."""
    computations: dict[str, list[Instruction]] = {}
    lines = text.splitlines()
    fragment = not any(_COMPUTATION.match(line) for line in lines)
    current: list[Instruction] | None = computations.setdefault("", []) if fragment else None
    name = ""
    for line in lines:
        if current is None:
            match = _COMPUTATION.match(line)
            if match and not line.startswith("HloModule"):
                name = match.group(2)
                current = computations.setdefault(name, [])
                if match.group(1):
                    computations[""] = current
            continue
        if line.startswith("}") and not fragment:
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        type_, remainder = _split_type(match.group(2))
        opcode = re.match(r"[\w\-]+", remainder)
        op_name = OP_NAME.search(remainder)
        called = [(m.group(1), m.group(2)) for m in _CALLED.finditer(remainder)]
        for listed in _CALLED_LISTS.finditer(remainder):
            called += [("calls", c.strip().lstrip("%")) for c in listed.group(1).split(",") if c.strip()]
        operands = re.match(r"[\w\-]+\(([^)]*)\)", remainder)
        current.append(Instruction(
            match.group(1), type_, opcode.group(0) if opcode else "", name,
            op_name.group(1) if op_name else None, called, line.strip(),
            tuple(o.strip().split(" ")[-1].lstrip("%") for o in operands.group(1).split(",")
                  if o.strip()) if operands else ()))
    return computations




def instructions(text: str) -> Iterable[Instruction]:
    """Every instruction of an optimized HLO module, in every computation, in order."""
    seen: set[int] = set()
    for found in parse_optimized_hlo(text).values():
        if id(found) not in seen:  # the entry is listed twice
            seen.add(id(found))
            yield from found


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
class StableOp:
    name: str
    opcode: str
    type: str
    scope: str | None
    line: str
    inner: list[StableOp] = dataclasses.field(default_factory=list)  # its regions' ops


def parse_stablehlo(text: str) -> dict[str, list[StableOp]]:
    """Function name -> its top-level operations; an operation with regions (a
    reduce's body, a while's condition and body) holds their operations in ``inner``
    and takes its location from the line closing them."""
    locations = _resolve_locations(text)
    functions: dict[str, list[StableOp]] = {}
    lines = text.splitlines()
    # A fragment (operations without their func.func) is read as one function, "".
    fragment = not any(_FUNC.match(line) for line in lines)
    current: list[StableOp] | None = functions.setdefault("", []) if fragment else None
    depth = 1 if fragment else 0
    open_ops: list[tuple[StableOp, int]] = []  # operations whose regions are open
    last: StableOp | None = None  # the operation a region opened on its own line belongs to
    for raw in lines:
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
            entry = StableOp(op.group(1) or "", opcode, type_,
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
        if depth <= 0 and not fragment:
            current = None
    return functions


