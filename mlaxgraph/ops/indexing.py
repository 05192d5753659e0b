"""Indexing and slicing of symbolic tensors (``x[:, 0]``, ``x[..., :64]``,
``x[:, None]``) as one op, ``getitem``, with static indices only."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from .base import Layer, expect_count, field

__all__ = ["GetItem", "as_index"]

#: One entry of an index: an int, None (a new axis of size 1), ``"..."`` (Ellipsis) or
#: a slice as ``(start, stop, step)``.
IndexEntry = int | str | None | tuple[int | None, int | None, int | None]


def _entry(value: Any, layer: Layer) -> IndexEntry:
    if value is Ellipsis or value == "...":
        return "..."
    if value is None:
        return None
    if isinstance(value, slice):
        value = (value.start, value.stop, value.step)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, tuple) and len(value) == 3 and all(
            v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool)) for v in value):
        if value[2] is not None and value[2] <= 0:
            layer.invalid(f"a slice step must be positive, got {value[2]}")
        start, stop, step = (None if v is None else int(v) for v in value)
        return (start, stop, step)
    layer.invalid(f"an index holds ints, slices with int bounds, None and ..., got {value!r}; "
                  f"tensor indices are not supported (use ops.where or ops.F)")


def as_index(value: Any, layer: Layer) -> tuple[IndexEntry, ...]:
    """A Python index (``0``, ``slice(None, 64)``, ``(..., 0)``) as a tuple of entries."""
    items = value if isinstance(value, tuple) else (value,)
    entries = tuple(_entry(v, layer) for v in items)
    if entries.count("...") > 1:
        layer.invalid("an index may hold one ... (Ellipsis)")
    return entries


@register("getitem")
@dataclasses.dataclass(frozen=True)
class GetItem(Layer):
    """``x[index]`` with a static index: ints (the dim is dropped), slices (start, stop,
    step), None (a new axis) and one ``...``. Unlike NumPy, an int or a slice bound
    beyond a known dim is an error, not clamped, and an empty result is refused.

    Example:
      >>> import mlaxgraph as mg
      >>> x = mg.Input(("batch", 16, 64))
      >>> x[:, 0]
      SymbolicTensor(f32[batch,64], from 'getitem')
    """

    index: tuple[IndexEntry, ...] = field(converter=as_index)

    def _python_index(self):
        return tuple(Ellipsis if e == "..." else slice(*e) if isinstance(e, tuple) else e
                     for e in self.index)

    def infer(self, inputs):
        expect_count(inputs, 1)
        (x,) = inputs
        consuming = [e for e in self.index if e is not None and e != "..."]
        if len(consuming) > x.rank:
            raise ShapeError(f"{len(consuming)} indices for a rank-{x.rank} tensor",
                             expected=f"at most {x.rank} indices")
        entries = list(self.index)
        if "..." in entries:
            at = entries.index("...")
            entries[at:at + 1] = [(None, None, None)] * (x.rank - len(consuming))
        else:
            entries += [(None, None, None)] * (x.rank - len(consuming))
        shape, axis = [], 0
        for e in entries:
            if e is None:
                shape.append(1)
                continue
            d = x.shape[axis]
            if isinstance(e, int):
                if not is_symbolic(d) and not -d <= e < d:
                    raise ShapeError(f"index {e} is out of range for axis {axis} of size {d}",
                                     expected=f"an index in [{-d}, {d})")
            elif e == (None, None, None):
                shape.append(d)
            else:
                shape.append(self._slice_length(e, d, axis))
            axis += 1
        return (x.with_shape(shape),)

    def _slice_length(self, e, d, axis):
        start, stop, _ = e
        if not is_symbolic(d):
            for bound in (start, stop):
                if bound is not None and not -d <= bound <= d:
                    raise ShapeError(f"slice {_slice_str(e)} is out of range for axis {axis} of "
                                     f"size {d}", expected=f"bounds in [{-d}, {d}]")
            n = len(range(*slice(*e).indices(d)))
            if n == 0:
                raise ShapeError(f"slice {_slice_str(e)} of axis {axis} (size {d}) is empty",
                                 expected="a non-empty slice")
            return n
        try:
            return jax.eval_shape(lambda v: v[slice(*e)], jax.ShapeDtypeStruct((d,), np.float32)).shape[0]
        except Exception as err:
            raise ShapeError(f"slice {_slice_str(e)} of the symbolic axis {axis} ({d}) has no "
                             f"known length: {err}", expected="a full slice ':'") from None

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (inputs[0][self._python_index()],), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0  # moves data only


def _slice_str(e) -> str:
    start, stop, step = ("" if v is None else str(v) for v in e)
    return f"{start}:{stop}" + (f":{step}" if step else "")
