"""What a dtype policy does to the HLO: one graph compiled under several policies, with
the converts, dots, convolutions and fusions of each StableHLO and optimized HLO counted
side by side."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..compiler.compile import compile
from ..compiler.policy import Policy
from ..compiler.stages import dim_values
from ..core.errors import DTypeError
from .hlo.text import instructions, parse_stablehlo

__all__ = ["PolicyComparison", "compare_policies", "count_stablehlo", "count_optimized_hlo",
           "STABLEHLO_OPS", "OPTIMIZED_OPS"]

#: The StableHLO operations counted, as they are printed.
STABLEHLO_OPS = ("convert", "dot_general", "convolution")
#: The optimized-HLO opcodes counted, in every computation (inside fusions too).
OPTIMIZED_OPS = ("convert", "dot", "convolution", "fusion")

def count_stablehlo(text: str) -> dict[str, int]:
    """How many of each of ``STABLEHLO_OPS`` a StableHLO text holds (in every function).

    Example:
      >>> count_stablehlo('''func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xbf16> {
      ...   %0 = stablehlo.convert %arg0 : (tensor<2xf32>) -> tensor<2xbf16>
      ...   return %0 : tensor<2xbf16>
      ... }''')
      {'convert': 1, 'dot_general': 0, 'convolution': 0}
    """
    found: list[str] = []

    def visit(ops) -> None:
        for op in ops:
            found.append(op.opcode.removeprefix("stablehlo."))
            visit(op.inner)

    for ops in parse_stablehlo(text).values():
        visit(ops)
    return {op: found.count(op) for op in STABLEHLO_OPS}


def count_optimized_hlo(text: str) -> dict[str, int]:
    """How many instructions of each of ``OPTIMIZED_OPS`` an HLO module's text holds, in
    every computation (the instructions inside fusions too).

    Example:
      >>> count_optimized_hlo('''ENTRY %main (p: f32[2]) -> bf16[2] {
      ...   ROOT %c = bf16[2]{0} convert(f32[2]{0} %p)
      ... }''')
      {'convert': 1, 'dot': 0, 'convolution': 0, 'fusion': 0}
    """
    found = [ins.opcode for ins in instructions(text)]
    return {op: found.count(op) for op in OPTIMIZED_OPS}


@dataclasses.dataclass(frozen=True)
class PolicyComparison:
    """The counts of one graph's HLO under several policies.

    Attributes:
      graph: the graph's name.
      dims: the symbolic dims' values the HLO was lowered at.
      labels: a label per policy, in the order given.
      policies: the policies.
      stablehlo: label -> StableHLO text.
      optimized: label -> optimized HLO text.
      counts: label -> {"stablehlo": {...}, "optimized": {...}}.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> comparison = mg.compare_policies(mlp(16, (32,), 4), ["float32", "bfloat16"], batch=8)
      >>> print(str(comparison).splitlines()[1])
                                  float32  bfloat16
    """

    graph: str
    dims: Mapping[str, int]
    labels: tuple[str, ...]
    policies: tuple[Policy, ...]
    stablehlo: Mapping[str, str] = dataclasses.field(repr=False)
    optimized: Mapping[str, str] = dataclasses.field(repr=False)
    counts: Mapping[str, Mapping[str, Mapping[str, int]]] = dataclasses.field(repr=False)

    def __str__(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        rows = [("", "", *self.labels)]
        for stage, ops in (("StableHLO", STABLEHLO_OPS), ("optimized HLO", OPTIMIZED_OPS)):
            key = "stablehlo" if stage == "StableHLO" else "optimized"
            for i, op in enumerate(ops):
                rows.append((stage if i == 0 else "", op,
                             *(str(self.counts[label][key][op]) for label in self.labels)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f'HLO of "{self.graph}" at {at} under {len(self.labels)} policies']
        for row in rows:
            lines.append("  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        return "\n".join(lines)


def _label(policy: Any) -> tuple[str, Policy]:
    if isinstance(policy, str):
        return policy, Policy.named(policy)
    if isinstance(policy, Policy):
        label = str(policy.compute_dtype)
        if policy.output_dtype != policy.compute_dtype:
            label += f"->{policy.output_dtype}"
        if str(policy.param_dtype) != "float32":
            label += f" (params {policy.param_dtype})"
        return label + (" +overrides" if policy.overrides else ""), policy
    raise DTypeError(f"a policy must be an mg.Policy or a name, got {type(policy).__name__}")


def compare_policies(graph, policies: Sequence[Any] | Mapping[str, Any], *example: Any,
                     inference_mode: bool = False, **dims: int) -> PolicyComparison:
    """Compiles ``graph`` under each policy and counts the converts, dots, convolutions
    and fusions of its StableHLO and XLA's optimized HLO.

    Args:
      graph: an ``mg.Graph``.
      policies: two or more ``mg.Policy`` objects or policy names (``"float32"``,
        ``"bfloat16"``); a dict gives them labels.
      *example: example arrays instead of dim values.
      inference_mode: lower the inference ``apply`` instead of the training one.
      **dims: the symbolic dims' values (``batch=8``).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> table = mg.compare_policies(mlp(16, (32,), 4), ["float32", "bfloat16"], batch=8)
      >>> table.counts["float32"]["stablehlo"]["convert"], table.counts["bfloat16"]["stablehlo"]["convert"]
      (0, 5)
    """
    if isinstance(policies, Mapping):
        pairs = [(str(label), _label(p)[1]) for label, p in policies.items()]
    else:
        pairs = [_label(p) for p in policies]
    labels = tuple(label for label, _ in pairs)
    if len(set(labels)) != len(labels):
        raise DTypeError(f"two policies have the label {labels!r}: give them as a dict of labels")
    stablehlo, optimized, counts = {}, {}, {}
    at: dict[str, int] = {}
    for label, policy in pairs:
        model = compile(graph, policy)
        at = dim_values(model, example, dims)
        stablehlo[label] = model.hlo(*example, optimized=False, inference_mode=inference_mode,
                                     debug_info=False, **dims)
        optimized[label] = model.hlo(*example, optimized=True, inference_mode=inference_mode,
                                     debug_info=True, **dims)
        counts[label] = {"stablehlo": count_stablehlo(stablehlo[label]),
                         "optimized": count_optimized_hlo(optimized[label])}
    return PolicyComparison(graph.name, at, labels, tuple(p for _, p in pairs),
                            stablehlo, optimized, counts)
