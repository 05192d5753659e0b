"""Taps: reading (capture) and replacing (intervention) layers' outputs while a
program runs, by concrete path (``h.3/attn``), inside scanned runs and remat regions.

The plan is made once per trace, from the program's value table: every node path
(layers and blocks; a scanned run's body under each block's name) names the refs of
its outputs. Captured refs are kept through remat regions and come out of a scan as
its per-block outputs; an intervention is applied where its ref is made, and inside a
scan it is chosen per block by the block's index, so one traced body serves the
blocks it changes and those it leaves alone.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, GraphError, MlaxGraphError, ShapeError
from ..core.signatures import call_problem
from ..ir.graph import InputLayer
from ..ir.paths import is_pattern, module_view, near_names, path_matcher
from ..ir.scan import Scan
from .program import Program, Ref, ScanStep, Step
from .tap_functions import TapFunction, tap_function

__all__ = ["Taps", "TapPlan", "plan_taps", "tap_paths"]


@dataclasses.dataclass(frozen=True)
class Taps:
    """What ``apply`` captures (path patterns) and where it intervenes (pattern, fn):
    ``fn(value)`` or ``fn(value, path)`` replaces the output there."""

    capture: tuple[str, ...] = ()
    intervene: tuple[tuple[str, Callable], ...] = ()

    @staticmethod
    def of(capture: Any = None, intervene: Any = None) -> Taps | None:
        """Checks ``apply``'s ``capture=`` and ``intervene=`` arguments; None when both
        are empty."""
        if capture is None:
            patterns: tuple[str, ...] = ()
        elif isinstance(capture, str):
            patterns = (capture,)
        elif isinstance(capture, (list, tuple)) and all(isinstance(c, str) for c in capture):
            patterns = tuple(capture)
        else:
            raise GraphError(f"capture takes a path, a pattern or a list of them (what "
                             f"graph.select returns), got {capture!r}")
        if intervene is None:
            changes: tuple[tuple[str, Callable], ...] = ()
        elif isinstance(intervene, Mapping) and all(isinstance(k, str) and callable(f)
                                                    for k, f in intervene.items()):
            changes = tuple(intervene.items())
            for pattern, fn in changes:
                if call_problem(fn, 1) is not None and call_problem(fn, 2) is not None:
                    raise GraphError(f"intervene at {pattern!r}: the function is called as "
                                     f"fn(value) or fn(value, path), and {call_problem(fn, 2)}")
        else:
            raise GraphError(f"intervene takes a dict of path or pattern -> function of the "
                             f"output (fn(value) or fn(value, path)), got {intervene!r}")
        if not patterns and not changes:
            return None
        return Taps(patterns, changes)

    def functions(self, concrete: bool = False) -> tuple[TapFunction, ...]:
        """The intervention functions split into what decides the compiled function
        and the floats and arrays they read (``mlaxgraph.compiler.tap_functions``)."""
        return tuple(tap_function(fn, concrete) for _, fn in self.intervene)

    def key(self, functions: tuple[TapFunction, ...]) -> Hashable:
        """What decides ``apply``'s compiled function for these taps."""
        return (self.capture, tuple((p, f.key) for (p, _), f in zip(self.intervene, functions)))

    def bound(self, functions: tuple[TapFunction, ...], values: tuple) -> Taps:
        """These taps with each function reading ``values`` (traced, inside the jitted
        function) instead of what it read when split."""
        return Taps(self.capture, tuple((p, f.rebuild(v)) for (p, _), f, v
                                        in zip(self.intervene, functions, values)))


def _entries(program: Program, expand: Callable[[str], tuple[str, ...]]):
    """(concrete paths, one per iteration; the refs of the node's outputs) of every
    layer and block of ``program`` at this level (a nested scan's body is its own)."""
    for path, refs in program.values.items():
        node = program.nodes.get(path)
        if node is None or isinstance(node.op, (InputLayer, Scan)):
            continue
        yield expand(path), _layer_output(program, path, node.op, refs)


#: The node ``mg.lora`` adds after an attention whose output projection it adapts:
#: the attention's output with the adapter's delta (the op's second output, the
#: attended values, feeds the adapter).
_OUT_ADAPTER_SUM = ".out.lora"


def _layer_output(program: Program, path: str, op: Any, refs: tuple[Ref, ...]) -> tuple[Ref, ...]:
    """What a layer's path taps: its outputs; for an attention with an adapter on its
    output projection, the attention's output as its readers read it (the adapter's
    sum, where it is), not the op's two outputs."""
    if "out" not in getattr(op, "adapters", ()):
        return refs
    return program.values.get(path + _OUT_ADAPTER_SUM, refs[:1])


def tap_paths(program: Program) -> list[str]:
    """Every concrete path ``apply`` can capture or intervene at."""
    paths = [c for concrete, _ in _entries(program, lambda p: (p,)) for c in concrete]
    for step in program.steps:
        if isinstance(step, ScanStep):
            paths.extend(step.blocks)
            paths.extend(c for concrete, _ in _entries(step.block, _block_paths(step))
                         for c in concrete)
    return paths


def _block_paths(step: ScanStep) -> Callable[[str], tuple[str, ...]]:
    """A path in the scan's body -> its concrete path in each block; the cast a
    policy put after each block (the body's last step, ``Scan.casts``) -> those casts'
    own names, as the graph before folding has them."""
    cut = len(step.path) + 1
    casts = getattr(step.node.op, "casts", ())
    last = step.block.outputs[0][0] if casts else None
    return lambda path: casts if path == last else tuple(f"{name}/{path[cut:]}" for name in step.blocks)


def _block_outputs(step: ScanStep) -> tuple[Ref, ...]:
    """What a block's own path taps in the scan's body: the body's outputs, or with a
    cast after each block (``Scan.casts``) the cast's input, the block's output."""
    body = step.block
    if not getattr(step.node.op, "casts", ()):
        return body.outputs
    last = body.outputs[0][0]
    return next(s.inputs for s in body.steps if isinstance(s, Step) and s.path == last)


def _takes_path(fn: Callable) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    # fn(value, path) when it requires two positional arguments; fn(value) otherwise
    # (jnp.zeros_like's optional dtype must not receive the path).
    required = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return len(required) >= 2


def _call(fn: Callable, value: Any, path: str) -> Any:
    try:
        result = fn(value, path) if _takes_path(fn) else fn(value)
    except jax.errors.TracerArrayConversionError:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        numpy = isinstance(fn, np.ufunc) or str(getattr(fn, "__module__", "")).startswith("numpy")
        example = f"jnp.{name} for np.{name}" if numpy else "jnp.negative for np.negative"
        raise GraphError(f"intervene at {path!r}: the function ({name}) turned the value into a "
                         f"NumPy array; it runs inside jax.jit on a traced value, so use "
                         f"jax.numpy ({example}) and jax.lax, not NumPy") from None
    except (TypeError, ValueError, AttributeError, LookupError, ArithmeticError) as e:
        if isinstance(e, (MlaxGraphError, jax.errors.ConcretizationTypeError,
                          jax.errors.NonConcreteBooleanIndexError)):
            raise  # a value it reads in Python: apply traces it again with constants
        name = getattr(fn, "__name__", None) or type(fn).__name__
        raise GraphError(f"intervene at {path!r}: the function ({name}) failed on the output "
                         f"{np.dtype(value.dtype).name}{list(value.shape)} (a traced value, inside "
                         f"jax.jit; it is called as fn(value), or fn(value, path) when it takes "
                         f"two arguments): {type(e).__name__}: {e}") from e
    shape, dtype = getattr(result, "shape", None), getattr(result, "dtype", None)
    if shape is None or tuple(shape) != tuple(value.shape):
        raise ShapeError(f"intervene at {path!r}: the function must return an array of the "
                         f"output's shape {tuple(value.shape)}, got "
                         f"{tuple(shape) if shape is not None else type(result).__name__}")
    if np.dtype(dtype) != np.dtype(value.dtype):
        raise DTypeError(f"intervene at {path!r}: the function must return the output's dtype "
                         f"{value.dtype}, got {dtype} (cast it: .astype(value.dtype))")
    return result


@dataclasses.dataclass
class TapPlan:
    """The taps of one program (a scan's body has its own, per block).

    Attributes:
      wanted: the refs to keep for capture (through remat regions, out of scans).
      captures: (concrete path, iteration, refs) of every capture.
      interventions: ref -> [(fn, the concrete path per iteration, or None where the
        pattern does not match that block)].
    """

    taps: Taps
    wanted: tuple[Ref, ...]
    captures: list[tuple[str, int, tuple[Ref, ...]]]
    interventions: dict[Ref, list[tuple[Callable, tuple[str | None, ...]]]]
    nested: bool = False
    bodies: dict[str, TapPlan | None] = dataclasses.field(default_factory=dict)

    def body(self, step: ScanStep) -> TapPlan | None:
        """The plan of a scan step's body (None inside a body: a scan nested in a
        scanned block is not tapped)."""
        if self.nested:
            return None
        if step.path not in self.bodies:
            self.bodies[step.path] = _plan(step.block, self.taps, _block_paths(step),
                                           step.blocks, nested=True, outputs=_block_outputs(step))
        return self.bodies[step.path]

    def intervene(self, step: Step, outs: tuple, index: Any) -> tuple:
        if not self.interventions:
            return outs
        changed = list(outs)
        for i in range(len(outs)):
            for fn, per in self.interventions.get((step.path, i), ()):
                changed[i] = _intervene(fn, changed[i], per, index)
        return tuple(changed)

    def collect(self, env: Mapping, scans: Mapping[str, Mapping]) -> dict[str, Any]:
        """Concrete path -> captured output (a tuple for several outputs)."""
        captured: dict[str, Any] = {}
        for path, _, refs in self.captures:
            values = tuple(env[ref] for ref in refs)
            captured[path] = values[0] if len(values) == 1 else values
        for scan_path, plan in self.bodies.items():
            if plan is None:
                continue
            stacked = scans[scan_path]
            for path, block, refs in plan.captures:
                values = tuple(stacked[ref][block] for ref in refs)
                captured[path] = values[0] if len(values) == 1 else values
        return captured


def _intervene(fn: Callable, value: Any, per: tuple[str | None, ...], index: Any) -> Any:
    if index is None:  # not in a scan: one iteration
        path = per[0]
        return value if path is None else _call(fn, value, path)
    with_path = _takes_path(fn)
    if None not in per and not with_path:  # every block alike
        return _call(fn, value, str(per[0]))
    keys = [None if p is None else (p if with_path else "") for p in per]
    branches = list(dict.fromkeys(keys))
    table = jnp.asarray([branches.index(k) for k in keys], jnp.int32)
    paths = {k: str(next(p for p, kk in zip(per, keys) if kk == k)) for k in branches if k is not None}
    functions = [(lambda v: v) if k is None else functools.partial(_call, fn, path=paths[k])
                 for k in branches]
    return jax.lax.switch(table[index], [lambda v, f=f: f(v) for f in functions], value)


def _plan(program: Program, taps: Taps, expand: Callable[[str], tuple[str, ...]],
          blocks: tuple[str, ...] = (), nested: bool = False,
          outputs: tuple[Ref, ...] = ()) -> TapPlan:
    entries = list(_entries(program, expand))
    if blocks:  # a scan's blocks: their outputs are the body's (before a cast after them)
        entries.append((blocks, outputs or program.outputs))
    captures, wanted = [], []
    interventions: dict[Ref, list] = {}
    matchers = [(p, path_matcher(p)) for p in taps.capture]
    changes = [(path_matcher(p), fn) for p, fn in taps.intervene]
    for concrete, refs in entries:
        for iteration, path in enumerate(concrete):
            if any(match(path) for _, match in matchers):
                # a path the user wrote as its module view (h.3/mlp/act) keys it so; both
                # spellings given, both keys
                view = module_view(path)
                keys = [view] if view != path and view in taps.capture else []
                if not keys or path in taps.capture or any(
                        match(path) for p, match in matchers if p != view):
                    keys.append(path)
                for key in keys:
                    captures.append((key, iteration, tuple(refs)))
                wanted.extend(refs)
        for match, fn in changes:
            per = tuple(path if match(path) else None for path in concrete)
            if any(p is not None for p in per):
                for ref in refs:
                    interventions.setdefault(ref, []).append((fn, per))
    return TapPlan(taps, tuple(dict.fromkeys(wanted)), captures, interventions, nested)


def plan_taps(program: Program, taps: Taps) -> TapPlan:
    """The plan of ``taps`` on ``program``; a pattern or path that names no layer or
    block is a ``GraphError`` listing near names."""
    known = tap_paths(program)
    for pattern in list(taps.capture) + [p for p, _ in taps.intervene]:
        matches = path_matcher(pattern)
        if not any(matches(path) for path in known):
            kind = "pattern" if is_pattern(pattern) else "path"
            hint = near_names(pattern, known)
            head = pattern.split("/", 1)[0]
            runs = [step for step in program.steps if isinstance(step, ScanStep) and step.path == head]
            if runs:
                hint = (f"; {head!r} is the scan of blocks {', '.join(runs[0].blocks)}: name a "
                        f"block as in the graph built ({runs[0].blocks[0]}{pattern[len(head):]}){hint}")
            elif isinstance(getattr(program.nodes.get(pattern), "op", None), InputLayer):
                hint = (f"; {pattern!r} is an input, not tapped: its value is what feeds it (the "
                        f"array given to apply, or the output of the layer before the block){hint}")
            if any(isinstance(inner, ScanStep) for step in program.steps
                   if isinstance(step, ScanStep) for inner in step.block.steps):
                hint += ("; a scan nested in a scanned block is not tapped: compile without "
                         "scan_blocks to reach its layers")
            raise GraphError(f"capture/intervene {kind} {pattern!r} names no layer or block of "
                             f"graph {program.graph.name!r}{hint}")
    return _plan(program, taps, lambda path: (path,))
