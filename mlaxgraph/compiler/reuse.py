"""``init(key, reuse=(params, state))``: the weights a changed graph shares with the one
it came from kept, the others drawn, and nothing else drawn.

Each weight of the model whose path, shape and dtype ``reuse`` has is kept (the very
array); a float weight given in another float dtype (a bfloat16 copy of float32
weights) is kept cast to the model's, as loading casts; only the others are drawn,
by an init restricted to them (the values the full ``init`` gives them; compiled
once per set of new weights). Weights given in the graph's own layout for a model
that scans runs of blocks are stacked first (``stack_weights``). Reuse that keeps
nothing, float weights given for a quantized layer's stored ones, a weight of the
right shape in a dtype that cannot be cast (an integer for a float, int32 for int8),
and arrays deleted by a donation are errors naming the weight.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..core.donated import deleted_error
from ..core.errors import DTypeError, GraphError, QuantizeWarning
from ..core.signatures import unknown_keywords
from ..core.specs import trains
from .lowering import make_init
from .program import Program, leaf_paths
from .stacking import stack_weights, unstack_given

__all__ = ["ModelInit", "ReuseReport", "reuse_report"]


@dataclasses.dataclass(frozen=True)
class ReuseReport:
    """What ``init(key, reuse=...)`` keeps: weight paths (``h.0/attn/qkv/kernel``;
    state entries under ``state/``) kept from ``reuse`` (``cast`` lists those given
    in another float dtype, kept cast to the model's), drawn new (absent there, or of
    another shape or dtype: ``changed`` lists those), and in ``reuse`` but not in the
    model (dropped)."""

    kept: tuple[str, ...]
    new: tuple[str, ...]
    changed: tuple[str, ...]
    dropped: tuple[str, ...]
    cast: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"kept {len(self.kept)}, new {len(self.new)} ({len(self.changed)} of another "
                 f"shape or dtype), dropped {len(self.dropped)}"
                 + (f", {len(self.cast)} kept cast to the model's dtype" if self.cast else "")]
        for label, paths in (("cast", self.cast), ("new", self.new), ("dropped", self.dropped)):
            for path in paths:
                mark = " (shape or dtype changed)" if path in self.changed else ""
                lines.append(f"  {label}: {path}{mark}")
        return "\n".join(lines)


def _same_shape(a: Any, b: Any) -> bool:
    return tuple(getattr(a, "shape", ())) == tuple(getattr(b, "shape", ()))


def _same(a: Any, b: Any) -> bool:
    return _same_shape(a, b) and np.dtype(getattr(a, "dtype", None)) == np.dtype(getattr(b, "dtype", None))


def _castable(want: Any, given: Any) -> bool:
    """A weight given in another float dtype of 16 bits or more, for a float weight of
    the same shape: kept, cast (a float8 or integer array is a quantized layer's
    stored values, which a cast would not make weights)."""
    dtype = getattr(given, "dtype", None)
    return _same_shape(want, given) and dtype is not None and trains(want.dtype) and trains(dtype)


def _check_reuse(reuse: Any) -> tuple[Mapping, Mapping]:
    if (not isinstance(reuse, (tuple, list)) or len(reuse) != 2
            or not all(isinstance(t, Mapping) for t in reuse)):
        raise GraphError(f"reuse takes (params, state) as init or mg.load gave them, got "
                         f"{type(reuse).__name__}")
    return reuse[0], reuse[1]


def _leaves(fresh: tuple[Any, Any]) -> dict[str, Any]:
    """Every weight of ``(params, state)`` by its report path (state under ``state/``)."""
    return {**leaf_paths(fresh[0]), **{"state/" + k: v for k, v in leaf_paths(fresh[1]).items()}}


def _deleted_weight(params: Any, state: Any, paths: Any) -> str | None:
    """The path of the first of the weights ``paths`` of ``(params, state)`` (those
    ``reuse`` keeps) whose array was deleted by a donation."""
    leaves = _leaves((params if isinstance(params, Mapping) else {},
                      state if isinstance(state, Mapping) else {}))
    for path in paths:
        deleted = getattr(leaves.get(path), "is_deleted", None)
        if deleted is not None and deleted():
            return path
    return None


def reuse_report(fresh: tuple[Any, Any], reuse: Any) -> ReuseReport:
    """Compares the weights a model draws (arrays or shape structs) with ``reuse``."""
    return _report(_leaves(fresh), _leaves(_check_reuse(reuse)))


def _report(ours: Mapping[str, Any], old: Mapping[str, Any]) -> ReuseReport:
    kept = tuple(p for p, leaf in ours.items() if p in old and (
        _same(leaf, old[p]) or _castable(leaf, old[p])))
    cast = tuple(p for p in kept if not _same(ours[p], old[p]))
    new = tuple(p for p in ours if p not in kept)
    changed = tuple(p for p in new if p in old)
    dropped = tuple(p for p in old if p not in ours)
    return ReuseReport(kept, new, changed, dropped, cast)


def _described(leaf: Any) -> str:
    return f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"


def _check_report(report: ReuseReport, ours: Mapping[str, Any], old: Mapping[str, Any]) -> None:
    """A quantized layer's weight given as a float one, or reuse keeping nothing of
    what it has, is an error."""
    for path in report.changed:
        want, given = ours[path], old[path]
        if (not trains(want.dtype)
                and np.issubdtype(np.dtype(getattr(given, "dtype", np.float32)), np.floating)
                and np.dtype(given.dtype).itemsize > 1):
            raise GraphError(
                f"init(reuse=...): weight {path} is {_described(want)} here (a quantized "
                f"layer's stored weight) and {_described(given)} in reuse: reuse would draw it "
                f"at random. Quantize the float weights first: qparams, qstate = "
                f"mg.quantize_weights(quantized_graph, params, state), then init(key, "
                f"reuse=(qparams, qstate))")
        if _same_shape(want, given):
            raise DTypeError(
                f"init(reuse=...): weight {path} is {_described(want)} here and "
                f"{_described(given)} in reuse: reuse keeps a weight of the same shape in its "
                f"dtype, or cast from another float dtype, and {np.dtype(given.dtype).name} "
                f"cannot be cast to {np.dtype(want.dtype).name} as weights. Give "
                f"{np.dtype(want.dtype).name} arrays, or leave the weight out of reuse to draw it")
    if report.kept or not old:
        return
    parts = []
    if report.changed:
        path = report.changed[0]
        parts.append(f"{len(report.changed)} are of another shape or dtype (such as {path}: "
                     f"{_described(old[path])} in reuse, {_described(ours[path])} here)")
    if report.dropped:
        parts.append(f"{len(report.dropped)} are at paths this model does not have (such as "
                     f"{', '.join(report.dropped[:2])})")
    scanned = any(".." in path.split("/")[0] for path in report.dropped)
    hint = (" reuse's weights are in a scanned layout: give them in the graph's own "
            "(scanned_model.unstack_weights(params, state))." if scanned else "")
    raise GraphError(f"init(reuse=...) keeps no weight of the {len(old)} in reuse: "
                     f"{'; '.join(parts)}. reuse takes the (params, state) of the graph this "
                     f"one was made from (model.reuse_report(params, state) lists every "
                     f"weight).{hint}")


def _at(tree: Any, key: str) -> Any:
    return tree.get(key) if isinstance(tree, Mapping) else None


def _assemble(shapes: Any, drawn: Any, old: Any, shardings: Any) -> Any:
    """The model's tree (``shapes``' structure and order): each leaf drawn where
    ``drawn`` has it, else kept from ``old`` (moved to the model's sharding)."""
    if isinstance(shapes, Mapping):
        return {key: _assemble(value, _at(drawn, key), _at(old, key),
                               _at(shardings, key))
                for key, value in shapes.items()}
    if drawn is not None:
        return drawn
    if np.dtype(old.dtype) != np.dtype(shapes.dtype):  # a float weight in another float dtype
        old = jax.numpy.asarray(old).astype(shapes.dtype)
    if shardings is not None and getattr(old, "sharding", None) != shardings:
        return jax.device_put(old, shardings)  # where this model keeps the weight
    return old


class ModelInit:
    """``init(key, reuse=None) -> (params, state)``: with ``reuse=(params, state)``,
    every weight whose path, shape and dtype are unchanged is taken from it (the very
    arrays; one in another float dtype cast to the model's), the others drawn as
    ``init`` draws them (and nothing else drawn). The plain jitted function's
    attributes (``lower``, ``trace``) are its own."""

    def __init__(self, plain: Callable, pure: Callable, program: Program, param_dtype: Any,
                 sharding: Any = None, compiler_options: Mapping[str, Any] | None = None):
        self._plain = plain
        self._pure = pure  # the function before jit: inside a transformation (eval_shape)
        self._program = program
        self._param_dtype = param_dtype
        self._sharding = sharding
        self._options = dict(compiler_options or {})
        self._shapes: Any = None
        self._partial: dict[frozenset[str], tuple[Callable, Callable]] = {}

    def shapes(self) -> tuple[Any, Any]:
        """The ``(params, state)`` the model draws, as shape structs (drawing nothing)."""
        if self._shapes is None:
            self._shapes = jax.eval_shape(self._pure, jax.random.key(0))
        return self._shapes

    def given(self, reuse: Any) -> tuple[Mapping, Mapping]:
        """``reuse`` in this model's layout: stacked where it scans runs of blocks and
        ``reuse`` has them one by one, per block where it holds them one by one and
        ``reuse`` has them stacked (a scanned model's)."""
        params, state = _check_reuse(reuse)
        params, state = unstack_given(self._program, params, state)
        return stack_weights(self._program, params, state)

    def report(self, reuse: Any) -> ReuseReport:
        return reuse_report(self.shapes(), self.given(reuse))

    def __call__(self, key: jax.Array, reuse: Any = None, **unknown: Any):
        if unknown:
            raise GraphError(unknown_keywords("init", unknown, "init(key, reuse=None)"))
        # init is compiled with its own XLA options, which only a top-level jit takes.
        traced = isinstance(key, jax.core.Tracer)
        if not traced and not (isinstance(key, jax.Array) and (
                jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
                or key.dtype == np.uint32 and key.shape == (2,))):  # init(0): JAX's own error
            raise GraphError(f"init takes one JAX random key, init(jax.random.key(0)), got "
                             f"{key!r}")
        if reuse is None:
            if not traced:
                self._warn_stored(list(leaf_paths(self.shapes()[0])))
            return (self._pure if traced else self._plain)(key)
        shapes = self.shapes()
        old = self.given(reuse)
        ours, given = _leaves(shapes), _leaves(old)
        report = _report(ours, given)
        _check_report(report, ours, given)
        path = _deleted_weight(*old, report.kept)
        if path is not None:
            raise deleted_error("init(reuse=...)", f"weight {path} of reuse")
        if not traced:
            self._warn_stored(report.new)
        pure, jitted = self._draw(frozenset(report.new))
        drawn = (pure if traced else jitted)(key)
        shardings = (None, None) if self._sharding is None else (self._sharding.params,
                                                                 self._sharding.state)
        return tuple(_assemble(s, d, o, sh) for s, d, o, sh in zip(shapes, drawn, old, shardings))

    def _warn_stored(self, drawn: Any) -> None:
        """A ``QuantizeWarning`` when ``init`` would draw stored quantized weights
        (``drawn``: param paths), which it makes zeros: their values come from
        ``mg.quantize_weights``."""
        params = leaf_paths(self.shapes()[0])
        stored = [p for p in drawn if p in params and not trains(params[p].dtype)]
        if stored:
            warnings.warn(
                f"init draws the quantized weights of model {self._program.graph.name!r} "
                f"({', '.join(stored[:2])}{' ...' if len(stored) > 2 else ''}) as zeros, so "
                f"its outputs are the biases alone: mg.quantize_weights(qgraph, params, state) "
                f"gives them from the float model's weights (init(key, reuse=(qparams, "
                f"qstate)) keeps them)", QuantizeWarning, stacklevel=3)

    def _draw(self, new: frozenset[str]) -> tuple[Callable, Callable]:
        """The init of the weights ``new`` alone: pure and jitted, made once per set."""
        if new not in self._partial:
            pure = make_init(self._program, self._param_dtype, self._sharding, only=new)
            self._partial[new] = (pure, jax.jit(pure, compiler_options=self._options))
        return self._partial[new]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plain, name)
