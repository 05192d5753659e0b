"""The collectives XLA inserted into a sharded computation, read from its optimized HLO.

The SPMD partitioner turns shardings into communication (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute); each op's metadata keeps the named
scope of the layer it came from, so the list says which layer communicates and how.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

__all__ = ["Collective", "collectives", "KINDS"]

#: The HLO ops that move data between devices.
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
         "collective-permute", "collective-broadcast")

_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+(?P<kind>"
                 + "|".join(re.escape(k) for k in sorted(KINDS, key=len, reverse=True))
                 + r")(?:-start)?\(")
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')
_WRAPPER = re.compile(r"^[\w.]+\((?P<inner>.*)\)$")
_JIT = re.compile(r"^(?:p?jit\([^)]*\)/)+")


class Collective(NamedTuple):
    """One collective op: its kind, its result's shape (per device) and the layer
    (path of named scopes) it came from: several, comma-separated, for an op XLA
    combined from several; '' when it came from no layer."""

    kind: str
    shape: str
    layer: str

    def __str__(self) -> str:
        return f"{self.kind} {self.shape}" + (f" in {self.layer}" if self.layer else "")


def _layer(op_name: str) -> str:
    """The layer path in an op's metadata name: ``jit(step)/transpose(jvp(dense_1))/
    dot_general`` -> ``dense_1``. An op XLA combined from several (one all-reduce of all
    gradients) has ``(name:name:...)``: its layers are listed, comma-separated.

    Example:
      >>> _layer("jit(step)/(transpose(jvp(fc))/dot_general:transpose(jvp(out))/reduce_sum)")
      'fc,out'
    """
    rest = _JIT.sub("", op_name)
    names = rest[1:-1].split(":") if rest.startswith("(") and rest.endswith(")") else [rest]
    layers: list[str] = []
    for name in names:
        parts = []
        for part in name.split("/")[:-1]:  # the last part is the primitive
            while (m := _WRAPPER.match(part)) is not None:  # transpose(jvp(layer)) -> layer
                part = m.group("inner")
            if part:
                parts.append(part)
        layer = "/".join(parts)
        if layer and layer not in layers:
            layers.append(layer)
    return ",".join(layers)


def collectives(hlo: Any, *example: Any, inference_mode: bool = False, **dims: int) -> list[Collective]:
    """The collectives of an optimized HLO text, in program order.

    Args:
      hlo: optimized HLO text (``model.hlo(batch=8, optimized=True)``), or a compiled
        model, whose ``apply`` is then compiled for ``example`` arrays or ``dims``.

    Example:
      >>> text = '''
      ... %all-reduce = f32[8,16]{1,0} all-reduce(%fusion), channel_id=1, to_apply=%add, metadata={op_name="jit(apply)/down/dot_general"}
      ... %x = f32[8,16]{1,0} add(%a, %b)
      ... '''
      >>> [str(c) for c in collectives(text)]
      ['all-reduce f32[8,16]{1,0} in down']
    """
    if not isinstance(hlo, str):
        hlo = hlo.hlo(*example, optimized=True, inference_mode=inference_mode, **dims)
    found = []
    for line in hlo.splitlines():
        match = _OP.match(line)
        if match is None:
            continue
        name = _OP_NAME.search(line)
        found.append(Collective(match.group("kind"), match.group("shape").strip(),
                                _layer(name.group("name")) if name else ""))
    return found
