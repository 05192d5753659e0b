"""Counting operations in XLA's optimized HLO text (no timing: exact numbers).

Each instruction line of HLO text reads ``[ROOT] %name = SHAPE opcode(operands), ...``
where SHAPE is an array shape (``f32[8,32]{1,0}``) or a tuple of them in parentheses.
``opcode_counts`` counts the opcodes of every instruction of every computation of the
module (fused computations included), so a ``convert`` inside a fusion is counted, and
so is the ``fusion`` instruction that calls it.
"""

from __future__ import annotations

import collections
import re

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")
_OPCODE = re.compile(r"([a-z][a-z0-9\-_]*)\(")

#: The counts the parity test compares; "dot+conv" is dots and convolutions together.
KEYS = ("dot", "convolution", "fusion", "convert")


def _skip_shape(rest: str) -> str:
    """The text after an instruction's result shape."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return rest[i + 1:]
        return ""
    space = rest.find(" ")
    return rest[space:] if space >= 0 else ""


def opcode_counts(hlo_text: str) -> collections.Counter:
    """Opcode -> number of instructions, over the whole module."""
    counts: collections.Counter = collections.Counter()
    for line in hlo_text.splitlines():
        if line.lstrip().startswith(("HloModule", "//", "}", "ENTRY")) or "{" in line.split("=")[0]:
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op = _OPCODE.match(_skip_shape(m.group(1)).lstrip())
        if op:
            counts[op.group(1)] += 1
    return counts


def summary(hlo_text: str) -> dict[str, int]:
    """The counts the parity test and RESULTS.md show."""
    c = opcode_counts(hlo_text)
    out = {k: c.get(k, 0) for k in KEYS}
    out["instructions"] = sum(c.values())
    return out


def diff(a: collections.Counter, b: collections.Counter) -> dict[str, tuple[int, int]]:
    """Opcodes whose counts differ: ``{opcode: (count in a, count in b)}``."""
    return {k: (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
