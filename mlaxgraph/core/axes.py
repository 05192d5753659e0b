"""Logical axis names: what each dim of a weight or an activation means (``"batch"``,
``"embed"``, ``"mlp"``, ``"heads"``, ...), independent of any device mesh.

Layers declare default names for their weights (``ParamSpec.axes``); users override
them per layer (``kernel_axes=`` or ``param_axes={"path": axes}``) and name the dims of
graph inputs (``mg.Input(..., axes=...)``). The names of activations are propagated
from the inputs through the graph, each op saying how (``Layer.output_axes``).
``mlaxgraph.distributed`` maps the names onto a mesh with the user's rules.

In axes a user writes, ``None`` means "not sharded". In propagated activation axes,
``UNKNOWN`` marks a dim whose meaning the propagation cannot tell: no constraint is put
on it, XLA decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import ShardingError
from .specs import TensorSpec, flatten_specs, is_symbolic

__all__ = ["UNKNOWN", "as_axes", "as_param_axes", "declared_weights", "weight_axes",
           "follow_inputs", "same_dim", "input_axes", "axes_str"]


class _Unknown:
    """The propagated name of a dim nothing is known about (prints as ``?``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "?"

    def __reduce__(self):
        return "UNKNOWN"


UNKNOWN = _Unknown()

Axes = tuple  # of str | None (| UNKNOWN for propagated activation axes)


def as_axes(value: Any, what: str = "axes") -> tuple[str | None, ...] | None:
    """User-given logical axes as a tuple of names (or None), one per dim.

    Example:
      >>> as_axes(["embed", None])
      ('embed', None)
    """
    if value is None:
        return None
    if isinstance(value, str):
        raise ShardingError(f"{what} must be a tuple of axis names, one per dim, got the string "
                            f"{value!r}; write ({value!r},) for one dim")
    try:
        items = tuple(value)
    except TypeError:
        raise ShardingError(f"{what} must be a tuple of axis names (str or None), one per "
                            f"dim, got {value!r}") from None
    for item in items:
        if item is not None and (not isinstance(item, str) or not item):
            raise ShardingError(f"{what} must hold axis names (non-empty str) or None, got "
                                f"{item!r} in {items!r}")
    return items


def as_param_axes(value: Any) -> tuple[tuple[str, tuple], ...] | None:
    """``param_axes`` as ``((path, axes), ...)``: from a dict keyed by weight path
    (``"kernel"``, ``"query/kernel"``), nested dicts (``{"query": {"kernel": ...}}``)
    or pairs, so that a layer holding it stays hashable.

    Example:
      >>> as_param_axes({"query": {"kernel": ("embed", "heads", None)}, "out/bias": (None,)})
      (('query/kernel', ('embed', 'heads', None)), ('out/bias', (None,)))
    """
    if value is None:
        return None

    def pairs(tree, prefix):
        items = tree.items() if isinstance(tree, Mapping) else tree
        try:
            items = tuple(items)
        except TypeError:
            raise ShardingError(f"param_axes must map weight paths to axes, got {value!r}") from None
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str) or not item[0]:
                raise ShardingError(f"param_axes must map weight paths (str) to axes, got {item!r}")
            path, axes = prefix + item[0], item[1]
            if isinstance(axes, Mapping):
                yield from pairs(axes, path + "/")
            else:
                yield path, as_axes(axes, f"param_axes[{path!r}]")

    result = tuple(pairs(value, ""))
    paths = [p for p, _ in result]
    for path in paths:
        if paths.count(path) > 1:
            raise ShardingError(f"param_axes gives axes for {path!r} twice")
    return result


def declared_weights(layer, inputs: Sequence[TensorSpec]) -> tuple[dict, dict]:
    """``(params, state)``: the layer's ParamSpec trees for ``inputs`` with its
    ``param_axes`` overrides written into each overridden spec's ``axes`` (a block
    gives its layers' weights this way, so a scanned block keeps their layout).

    Raises:
      ShardingError: an override names no weight of the layer (a short error; callers
        add the layer's name).
    """
    params, state = layer.param_specs(inputs), layer.state_specs(inputs)
    overrides = dict(getattr(layer, "param_axes", None) or ())
    if not overrides:
        return params, state
    names = [path for path, _ in flatten_specs(params) + flatten_specs(state)]
    for path in overrides:
        if path not in names:
            raise ShardingError(f"param_axes names {path!r}, which is no weight of this layer",
                                expected=f"weights {', '.join(map(repr, names)) or '(none)'}")

    def apply(tree, prefix):
        out = {}
        for name, spec in tree.items():
            path = prefix + name
            if isinstance(spec, Mapping):
                out[name] = apply(spec, path + "/")
            else:
                out[name] = dataclasses.replace(spec, axes=overrides[path]) if path in overrides else spec
        return out

    return apply(params, ""), apply(state, "")


def weight_axes(layer, inputs: Sequence[TensorSpec]) -> tuple[dict, dict]:
    """``(params, state)``: weight path -> ``(shape, axes)`` for a layer called on
    ``inputs``, with the layer's ``param_axes`` overrides applied and every weight
    given a name (or None) per dim.

    Raises:
      ShardingError: an override names no weight of the layer, or axes do not have
        one name per dim (a short error; callers add the layer's name).
    """
    params, state = declared_weights(layer, inputs)

    def resolve(entries):
        out = {}
        for path, spec in entries:
            axes = (None,) * len(spec.shape) if spec.axes is None else tuple(spec.axes)
            if len(axes) != len(spec.shape):
                raise ShardingError(
                    f"weight {path!r} of shape {tuple(spec.shape)} has {len(spec.shape)} dims but "
                    f"its logical axes {axes} name {len(axes)}",
                    expected=f"{len(spec.shape)} axis names for {path!r}")
            out[path] = (tuple(spec.shape), axes)
        return out

    return resolve(flatten_specs(params)), resolve(flatten_specs(state))


def same_dim(a: Any, b: Any) -> bool:
    """Whether two dims (ints or symbolic) are the same."""
    try:
        return bool(a == b)
    except Exception:  # incomparable symbolic expressions
        return False


def follow_inputs(input_axes: Sequence[Axes], inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec]) -> tuple[Axes, ...]:
    """The default propagation: an output with the shape of some inputs takes their
    names (elementwise ops, norms, casts); otherwise it keeps the first input's name of
    the leading dim when that dim is unchanged (and, at equal rank, of the last dim);
    every other dim is ``UNKNOWN``.

    Example:
      >>> x = TensorSpec.of(("batch", 8, 8, 16), "float32")
      >>> pooled = TensorSpec.of(("batch", 4, 4, 16), "float32")
      >>> follow_inputs([("batch", None, None, "mlp")], [x], [pooled])
      (('batch', ?, ?, 'mlp'),)
    """
    result = []
    for out in outputs:
        same = [a for a, s in zip(input_axes, inputs)
                if s.rank == out.rank and all(same_dim(p, q) for p, q in zip(s.shape, out.shape))]
        if same:
            result.append(tuple(next((a[i] for a in same if a[i] is not UNKNOWN), UNKNOWN)
                                for i in range(out.rank)))
            continue
        axes = [UNKNOWN] * out.rank
        if inputs and out.rank and inputs[0].rank:
            first, spec = input_axes[0], inputs[0]
            if same_dim(spec.shape[0], out.shape[0]) and (spec.rank == out.rank or is_symbolic(out.shape[0])):
                axes[0] = first[0]
            if spec.rank == out.rank > 1 and same_dim(spec.shape[-1], out.shape[-1]):
                axes[-1] = first[-1]
        result.append(tuple(axes))
    return tuple(result)


def input_axes(spec: TensorSpec, declared: Axes | None) -> Axes:
    """A graph input's axes: as declared, else each symbolic dim named after its
    variable (``("batch", 784)`` -> ``("batch", None)``) and the others not sharded."""
    if declared is not None:
        return tuple(declared)
    return tuple(d._to_var() if is_symbolic(d) else None for d in spec.shape)


def axes_str(axes: Iterable) -> str:
    """Axes as printed: ``(batch, -, mlp)``; ``-`` not sharded, ``?`` unknown.

    Example:
      >>> axes_str(("batch", None, UNKNOWN))
      '(batch,-,?)'
    """
    return "(" + ",".join("-" if a is None else str(a) if a is UNKNOWN else a for a in axes) + ")"
