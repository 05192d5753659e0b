"""Rematerialization under a memory budget: ``mg.compile(graph, memory_budget="2GiB",
dims={"batch": 64})`` chooses what the backward pass recomputes so that the train
step's peak memory fits the budget, with as little recomputation as it can.

The candidates are the graph's top-level blocks (a scanned run is one candidate, its
blocks recomputed one by one), or its layers when it has no blocks; each may be
left alone, rematerialized with ``"dots"`` (matmul results kept) or ``"full"``. The
typed graph says what each choice saves (the bytes of the activations the candidate
no longer keeps) and costs (the FLOPs it recomputes). The planner measures the
gradient step without rematerialization (XLA's ``memory_analysis`` of the compiled
step), takes the choices with the most bytes saved per FLOP recomputed until the
prediction fits, then compiles the step with them and measures again, adding choices
until the measured peak fits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ..core.errors import GraphError
from ..ops.flops import size
from .program import Program, ScanStep, Step

__all__ = ["MemoryPlan", "parse_bytes", "plan_memory"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any) -> int:
    """A memory size: an int of bytes or text such as ``"2GiB"``, ``"500 MB"``.

    Example:
      >>> parse_bytes("1.5GiB"), parse_bytes(4096)
      (1610612736, 4096)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if match is None or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
        raise GraphError(f"memory_budget must be a positive number of bytes or a size such as "
                         f"'2GiB' or '500MB', got {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclasses.dataclass(frozen=True)
class Option:
    """One candidate's choice: what it saves and what it recomputes."""

    path: str
    policy: str
    saved_bytes: int
    recomputed_flops: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """What the planner chose (``model.memory_plan()``).

    Attributes:
      budget: the budget, in bytes.
      dims: the symbolic dims' values the step was measured at.
      choice: block or layer path -> ``"full"`` or ``"dots"``.
      baseline_peak: the measured peak of the gradient step without rematerialization.
      predicted_peak: the baseline less the bytes the choice saves, by the graph's specs.
      measured_peak: XLA's peak of the compiled step with the choice.
      recomputed_flops: the forward FLOPs the backward pass recomputes.
      options: every candidate choice considered, best first.
    """

    budget: int
    dims: Mapping[str, int]
    choice: Mapping[str, str]
    baseline_peak: int
    predicted_peak: int
    measured_peak: int
    recomputed_flops: int
    options: tuple[Option, ...] = dataclasses.field(repr=False, default=())

    def __str__(self) -> str:
        mib = 2**20
        chosen = ", ".join(f"{p} {c}" for p, c in self.choice.items()) or "nothing"
        return (f"memory plan at {', '.join(f'{k}={v}' for k, v in self.dims.items())}: budget "
                f"{self.budget / mib:,.1f} MiB; without remat {self.baseline_peak / mib:,.1f} MiB; "
                f"recompute {chosen}; predicted {self.predicted_peak / mib:,.1f} MiB, measured "
                f"{self.measured_peak / mib:,.1f} MiB; {self.recomputed_flops:,} FLOPs recomputed")


def _value(expression: Any, dims: Mapping[str, int]) -> int:
    if hasattr(expression, "_evaluate"):
        return int(expression._evaluate(dict(dims)))
    return int(expression)


def _activations(steps: list[Step], dims: Mapping[str, int]) -> tuple[int, int, int]:
    """(bytes of every output, bytes of the dot/conv outputs, forward FLOPs) of steps."""
    total = dots = flops = 0
    for step in steps:
        made = sum(_value(size(o), dims) * o.dtype.itemsize for o in step.output_specs)
        total += made
        if step.op.op_name in ("linear", "conv", "multi_head_attention"):
            dots += made
        count = step.op.flops(step.input_specs, step.output_specs, param_dtype=jnp.float32,
                              inference_mode=False)
        flops += 0 if count is None else _value(count, dims)
    return total, dots, flops


def _options(program: Program, dims: Mapping[str, int]) -> list[Option]:
    groups: dict[str, list[Step]] = {}
    repeat: dict[str, int] = {}
    blocks = [p for p, n in program.nodes.items() if "/" not in p and n.op.subgraph() is not None]
    for step in program.steps:
        if isinstance(step, ScanStep):
            groups[step.path] = list(step.block.steps)
            repeat[step.path] = len(step.blocks)
            continue
        top = step.path.split("/")[0]
        key = top if blocks and top in blocks else (step.path if not blocks else None)
        if key is not None:
            groups.setdefault(key, []).append(step)
    options = []
    for path, steps in groups.items():
        total, dots, flops = _activations(steps, dims)
        last = sum(_value(size(o), dims) * o.dtype.itemsize for o in steps[-1].output_specs)
        times = repeat.get(path, 1)
        # Full: only the candidate's input is kept (its output is the next one's input).
        options.append(Option(path, "full", (total - last) * times, flops * times))
        if dots:
            options.append(Option(path, "dots", (total - last - dots) * times, flops * times // 2))
    return sorted(options, key=lambda o: -o.saved_bytes / max(o.recomputed_flops, 1))


def _peak(compiled) -> int:
    memory = compiled.memory_analysis()
    return int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
               + memory.output_size_in_bytes - memory.alias_size_in_bytes)


def plan_memory(program: Program, budget: int, dims: Mapping[str, int],
                measure: Callable[[Mapping[str, str]], Any],
                time_step: Callable[[Any], float] | None = None) -> MemoryPlan:
    """Chooses the rematerialization that fits ``budget``; ``measure(choice)`` compiles
    the gradient step with a choice and returns the compiled step. With ``time_step``
    (the seconds of one run of a compiled step), the plans that fit (the greedy one,
    and every candidate left alone, on ``"dots"`` or on ``"full"``) are timed and the
    fastest is kept: recomputing can be faster than reading activations back, and only
    a measurement says when."""
    compiled = measure({})
    baseline = _peak(compiled)
    options = _options(program, dims)
    choice: dict[str, str] = {}
    saved: dict[str, int] = {}
    flops: dict[str, int] = {}
    pending = list(options)
    measured = baseline
    while measured > budget:
        # The best remaining choices until the prediction fits, then a measurement.
        added = False
        while pending:
            option = pending.pop(0)
            if option.saved_bytes <= saved.get(option.path, 0):
                continue  # no better than what the candidate has
            choice[option.path] = option.policy
            saved[option.path] = option.saved_bytes
            flops[option.path] = option.recomputed_flops
            added = True
            if baseline - sum(saved.values()) <= budget:
                break
        if not added:
            raise GraphError(
                f"memory_budget of {budget:,} bytes cannot be met: the gradient step needs "
                f"{measured:,} bytes with every block rematerialized ({baseline:,} without)")
        compiled = measure(choice)
        measured = _peak(compiled)
    if time_step is not None:
        paths = list(dict.fromkeys(o.path for o in options))
        plans: dict[tuple, tuple[dict[str, str], Any, int]] = {
            tuple(sorted(choice.items())): (dict(choice), compiled, measured)}
        for policy in ("none", "dots", "full"):
            uniform = {} if policy == "none" else {p: policy for p in paths}
            key = tuple(sorted(uniform.items()))
            if key not in plans:
                step = compiled if not uniform and not choice else measure(uniform)
                plans[key] = (uniform, step, _peak(step))
        fitting = [plan for plan in plans.values() if plan[2] <= budget]
        seconds = {id(plan): min(time_step(plan[1]) for _ in range(3)) for plan in fitting}
        choice, compiled, measured = min(fitting, key=lambda plan: seconds[id(plan)])
    chosen = {o.path: o for o in options if choice.get(o.path) == o.policy}
    return MemoryPlan(budget, dict(dims), dict(choice), baseline,
                      baseline - sum(o.saved_bytes for o in chosen.values()), measured,
                      sum(o.recomputed_flops for o in chosen.values()), tuple(options))


def gradient_step(apply_fn: Callable, params: Any, state: Any, inputs: tuple) -> Callable:
    """The compiled gradient of a loss of the outputs (the mean of their squares)
    with respect to the params (a quantized layer's integer weights, as in QLoRA, get
    empty float0 ones): the step whose peak memory the planner measures."""

    def loss(p, s, xs):
        outputs, _ = apply_fn(p, s, *xs, rng=jax.random.key(0))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return sum(jnp.mean(jnp.square(o.astype(jnp.float32))) for o in outputs)

    return jax.jit(jax.grad(loss, allow_int=True)).lower(params, state, inputs).compile()
