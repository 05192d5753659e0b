"""Whether the weights chosen to train can: not stored quantized (int8, packed int4 or
float8 values, which an optimizer cannot update), and not upstream of an activation
cast to int8 or float8. Rounding to int8 passes no gradient back (the integers carry
none; only the per-token scale would), and a float8 value carries its gradient in
float8 (three mantissa bits), so a weight whose gradient goes through such a cast
would train on a wrong gradient. The weight-only schemes keep activations float:
QLoRA's form, whose adapters train."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..compiler.program import Program, Step, leaf_paths
from ..core.errors import GraphError
from ..core.specs import trains

__all__ = ["check_trainable"]


def _casts_activations(step: Step) -> bool:
    """Whether the step casts a float activation to int8 or float8 (a ``Quantize``
    node, or an attention quantizing its projections' inputs itself); a scan's, when
    one of its block's steps does."""
    if step.body is not None:
        return any(_casts_activations(s) for s in step.body.steps)
    return bool(getattr(step.op, "casts_activations", False))


def _users(path: str, users: dict[str, list[str]]) -> list[str]:
    """The steps reading the leaf at ``path`` (its longest prefix that is a step's
    weight path; a shared layer's calls all read it, a tied embedding's head too)."""
    parts = path.split("/")
    for i in range(len(parts) - 1, 0, -1):
        found = users.get("/".join(parts[:i]))
        if found:
            return found
    return []


def check_trainable(program: Program, shapes: Any, chosen: Iterable[str] | None) -> None:
    """A ``GraphError`` naming a weight chosen to train (``chosen``; None: all) that is
    stored quantized, or whose gradient passes through an activation cast to int8 or
    float8 (naming the cast and what to do)."""
    leaves = leaf_paths(shapes)
    trained = list(leaves) if chosen is None else [p for p in leaves if p in chosen]
    for path in trained:
        if not trains(leaves[path].dtype):
            raise GraphError(
                f"Trainer: weight {path} is stored in {leaves[path].dtype} (a quantized layer's) "
                f"and cannot train; freeze it: Trainer(trainable=...) naming the weights "
                f"that train (\"**/*.lora_*\" for adapters added by mg.lora)")
    casts = [s for s in program.steps if _casts_activations(s)]
    if not casts:
        return
    steps = {s.path: s for s in program.steps}
    users: dict[str, list[str]] = {}
    for s in program.steps:
        if s.weights:
            users.setdefault(s.weights_path, []).append(s.path)
    by_step: dict[str, str] = {}
    for path in trained:
        for user in _users(path, users):
            by_step.setdefault(user, path)
    for cast in casts:
        upstream, stack = set(), [cast.path] if cast.body is not None else []
        stack += [ref[0] for ref in cast.inputs]
        while stack:
            here = stack.pop()
            if here in upstream or here not in steps:
                continue
            upstream.add(here)
            if here != cast.path:
                stack.extend(ref[0] for ref in steps[here].inputs)
        hit = next((by_step[s.path] for s in program.steps if s.path in upstream and s.path in by_step), None)
        if hit is not None:
            raise GraphError(
                f"Trainer: weight {hit} would train on a wrong gradient: it passes through "
                f"{cast.path!r} (op {cast.op.op_name}), which casts activations to int8 or float8 "
                f"(rounding to int8 passes no gradient back; float8 carries it in 3 mantissa "
                f"bits). Train adapters on a weight-only quantization, QLoRA's form: "
                f"mg.quantize(graph, \"int8_weight_only\") or \"int4_weight_only\" (the "
                f"activations stay float), or leave the layers after the trained ones float "
                f"(mg.quantize(..., targets=...))")
