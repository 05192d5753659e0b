"""The collectives XLA inserted into a sharded computation, read from its optimized HLO.

The SPMD partitioner turns shardings into communication (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute); each op's metadata keeps the named
scope of the layer it came from, so the list says which layer communicates and how.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .text import instructions, scope_paths

__all__ = ["Collective", "collectives", "KINDS"]

#: The HLO ops that move data between devices.
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
         "collective-permute", "collective-broadcast")

class Collective(NamedTuple):
    """One collective op: its kind, its result's shape (per device) and the layer
    (path of named scopes) it came from: several, comma-separated, for an op XLA
    combined from several; '' when it came from no layer."""

    kind: str
    shape: str
    layer: str

    def __str__(self) -> str:
        return f"{self.kind} {self.shape}" + (f" in {self.layer}" if self.layer else "")


def collectives(hlo: Any, *example: Any, inference_mode: bool = False, **dims: int) -> list[Collective]:
    """The collectives of an optimized HLO text, in program order.

    Args:
      hlo: optimized HLO text (``model.hlo(batch=8, optimized=True)``), or a compiled
        model, whose ``apply`` is then compiled for ``example`` arrays or ``dims``.

    Example:
      >>> text = '''
      ... ENTRY %main (p: f32[8,16]) -> f32[8,16] {
      ...   %all-reduce = f32[8,16]{1,0} all-reduce(%fusion), channel_id=1, metadata={op_name="jit(apply)/down/dot"}
      ...   ROOT %x = f32[8,16]{1,0} add(%a, %b)
      ... }
      ... '''
      >>> [str(c) for c in collectives(text)]
      ['all-reduce f32[8,16]{1,0} in down']
    """
    if not isinstance(hlo, str):
        hlo = hlo.hlo(*example, optimized=True, inference_mode=inference_mode, **dims)
    found = []
    for ins in instructions(hlo):
        kind = ins.opcode.removesuffix("-start")
        if kind in KINDS:
            layers = ",".join(scope_paths(ins.op_name)) if ins.op_name else ""
            found.append(Collective(kind, ins.type, layers))
    return found
