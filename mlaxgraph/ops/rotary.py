"""Rotary position embeddings (RoPE), as Llama computes them (Hugging Face's
``rotate_half`` form): the feature pairs ``(i, i + dim/2)`` of each position are rotated
by ``position * base ** (-2i / dim)``."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, ShapeError
from ..core.registry import register
from ..core.specs import is_symbolic
from .base import Layer, expect_float
from .flops import size

__all__ = ["RotaryEmbedding", "rotary_embedding", "rotary_tables", "rotate", "rotary_flops",
           "to_rope_base", "to_rope_scaling", "inverse_frequencies", "rotary_scale"]

#: The scalings of the frequencies (Hugging Face's ``rope_type``) and their parameters.
ROPE_SCALINGS = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"),
                 "yarn": ("factor", "original_max_position_embeddings", "attention_factor",
                          "beta_fast", "beta_slow", "truncate")}

#: YaRN's parameters that have defaults (the paper's, as Hugging Face's): the attention
#: factor ``0.1 ln(factor) + 1`` is computed from ``factor`` when not given.
_YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}


def to_rope_base(value, layer) -> float | None:
    """``rope=``: None or False (none), True (base 10000, as Llama) or the base."""
    if value is None or value is False:
        return None
    if value is True:
        return 10000.0
    try:
        base = float(value)
    except (TypeError, ValueError):
        layer.invalid(f"rope must be None, True or a base (a float > 1), got {value!r}")
    if not base > 1.0:
        layer.invalid(f"the rope base must be > 1, got {value!r}")
    return base


def to_rope_scaling(value, layer) -> tuple[tuple[str, object], ...] | None:
    """``rope_scaling=``: None, or the scaling as a mapping or pairs: ``rope_type``
    (``"linear"``, ``"llama3"`` or ``"yarn"``) and its parameters (``factor``; Llama 3's
    also ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
    YaRN's also ``original_max_position_embeddings`` and, with defaults,
    ``attention_factor``, ``beta_fast``, ``beta_slow``, ``truncate``), kept as sorted
    pairs."""
    if value is None:
        return None
    try:
        items = dict(value.items() if hasattr(value, "items") else value)
    except (TypeError, ValueError):
        layer.invalid(f"rope_scaling must be None or a mapping with rope_type and its "
                      f"parameters, got {value!r}")
    kind = items.get("rope_type")
    if not isinstance(kind, str) or kind not in ROPE_SCALINGS:
        layer.invalid(f"rope_scaling's rope_type must be one of {', '.join(map(repr, ROPE_SCALINGS))}, "
                      f"got {kind!r}")
    if kind == "yarn":
        items = {**_YARN_DEFAULTS, **items}
        if isinstance(items.get("factor"), (int, float)) and "attention_factor" not in items:
            items["attention_factor"] = 0.1 * np.log(items["factor"]) + 1.0 if items["factor"] > 1 else 1.0
        if not isinstance(items["truncate"], (bool, np.bool_)):
            layer.invalid(f"rope_scaling['truncate'] must be a bool, got {items['truncate']!r}")
        items["truncate"] = bool(items["truncate"])
    wanted = set(ROPE_SCALINGS[str(kind)]) | {"rope_type"}
    if set(items) != wanted:
        layer.invalid(f"rope_scaling of type {kind!r} takes exactly "
                      f"{', '.join(sorted(wanted - {'rope_type'}))}; got {', '.join(sorted(items))}")
    for name in wanted - {"rope_type", "truncate"}:
        number = items[name]
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
            layer.invalid(f"rope_scaling[{name!r}] must be a positive number, got {number!r}")
        items[name] = float(number)
    if kind == "llama3" and not items["high_freq_factor"] > items["low_freq_factor"]:
        layer.invalid("rope_scaling: high_freq_factor must be greater than low_freq_factor")
    return tuple(sorted(items.items()))


def inverse_frequencies(dim: int, base: float, scaling=None) -> np.ndarray:
    """``base ** (-2i / dim)`` for ``i < dim / 2`` in float32 (computed in float64), with
    the ``scaling`` of ``to_rope_scaling`` applied as Hugging Face's
    ``modeling_rope_utils`` does: ``"linear"`` divides every frequency by ``factor``;
    ``"llama3"`` divides those of wavelength above ``original / low_freq_factor`` by
    ``factor``, keeps those below ``original / high_freq_factor`` and blends in between."""
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if scaling is not None:
        s = dict(scaling)
        factor = s["factor"]
        if s["rope_type"] == "linear":
            inv_freq = inv_freq / factor
        elif s["rope_type"] == "yarn":
            inv_freq = _yarn(inv_freq, dim, base, s)
        else:  # llama3
            original = s["original_max_position_embeddings"]
            low, high = s["low_freq_factor"], s["high_freq_factor"]
            wavelength = 2 * np.pi / inv_freq
            scaled = np.where(wavelength > original / low, inv_freq / factor, inv_freq)
            smooth = (original / wavelength - low) / (high - low)
            blended = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelength >= original / high) & (wavelength <= original / low)
            inv_freq = np.where(medium, blended, scaled)
    return inv_freq.astype(np.float32)


def _yarn(inv_freq: np.ndarray, dim: int, base: float, s: dict) -> np.ndarray:
    """YaRN: the frequencies that turn fewer than ``beta_slow`` times over the original
    context divided by ``factor``, those turning more than ``beta_fast`` times kept, a
    linear ramp over the feature index between (bounds rounded outwards with
    ``truncate``), as Hugging Face's ``_compute_yarn_parameters``."""
    def index(rotations: float) -> float:  # the feature index turning this many times
        return dim * np.log(s["original_max_position_embeddings"] / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = index(s["beta_fast"]), index(s["beta_slow"])
    if s["truncate"]:
        low, high = np.floor(low), np.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the frequency kept (extrapolated), 0: divided by factor
    return inv_freq / s["factor"] * (1 - keep) + inv_freq * keep


def rotary_scale(scaling) -> float:
    """The factor on ``cos`` and ``sin`` (YaRN's ``attention_factor``; 1 otherwise)."""
    return float(dict(scaling)["attention_factor"]) if scaling and dict(scaling)["rope_type"] == "yarn" else 1.0


def rotary_tables(positions, dim: int, base: float, dtype, scaling=None):
    """``(cos, sin)`` of shape ``positions.shape + (dim,)``: the angles
    ``position * base ** (-2i / dim)`` (scaled by ``scaling``, see
    ``inverse_frequencies``), computed in float32, repeated for both halves, cast to
    ``dtype``."""
    inv_freq = inverse_frequencies(dim, base, scaling)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    scale = rotary_scale(scaling)
    if scale != 1.0:
        cos, sin = cos * np.float32(scale), sin * np.float32(scale)
    return cos.astype(dtype), sin.astype(dtype)


def rotate(x, cos, sin):
    """``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = concat(-x2, x1)`` of the
    two halves of the last axis."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def rotary_flops(rotated, positions, dim: int, dtype, scaling=None) -> object:
    """The tables (convert the positions, multiply by the frequencies, YaRN's scale of
    cos and sin, their casts to ``dtype`` unless float32) and the rotation of
    ``rotated`` elements (two multiplies, an add, the negation of half)."""
    count = positions + positions * (dim // 2)
    if rotary_scale(scaling) != 1.0:
        count = count + 2 * positions * dim
    if np.dtype(dtype) != np.float32:
        count = count + 2 * positions * dim
    return count + 3 * rotated + rotated // 2


@register("rotary_embedding")
@dataclasses.dataclass(frozen=True)
class RotaryEmbedding(Layer):
    """Rotates ``x`` of shape ``(batch, length, ..., dim)`` (``dim`` even) by its
    positions along axis 1: ``0 .. length - 1``, or the integer ``positions`` input of
    shape ``(length,)`` or ``(batch, length)``. ``base`` 10000 as Llama.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> q = mg.Input(("batch", 16, 4, 32))
      >>> ops.rotary_embedding(q)
      SymbolicTensor(f32[batch,16,4,32], from 'rotary_embedding')
    """

    base: float = 10000.0

    def validate(self):
        if not float(self.base) > 1.0:
            self.invalid(f"base must be > 1, got {self.base!r}")

    def infer(self, inputs):
        if len(inputs) not in (1, 2):
            raise ShapeError(f"takes x and optional positions, got {len(inputs)} inputs",
                             expected="1 or 2 tensors")
        x = inputs[0]
        expect_float(x)
        if x.rank < 3 or is_symbolic(x.shape[-1]) or x.shape[-1] % 2:
            raise ShapeError("takes (batch, length, ..., dim) with a known even dim",
                             expected=f"{x.dtype}[batch,length,...,2k]")
        if len(inputs) == 2:
            pos = inputs[1]
            if not jnp.issubdtype(pos.dtype, jnp.integer):
                raise DTypeError(f"positions must be integers, got {pos.dtype}", expected="int32")
            if pos.shape not in (x.shape[1:2], x.shape[:2]):
                raise ShapeError("positions must be (length,) or (batch, length)",
                                 expected=f"int32[{x.shape[1]}] or int32[{x.shape[0]},{x.shape[1]}]")
        return (x,)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        x = inputs[0]
        pos = inputs[1] if len(inputs) == 2 else jnp.arange(x.shape[1])
        cos, sin = rotary_tables(pos, x.shape[-1], self.base, x.dtype)
        # positions (length,) or (batch, length): the tables broadcast over the other axes.
        shape = ((1,) if pos.ndim == 1 else (pos.shape[0],)) + (x.shape[1],) + (1,) * (x.ndim - 3) + (x.shape[-1],)
        return (rotate(x, cos.reshape(shape), sin.reshape(shape)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        x = inputs[0]
        positions = size(inputs[1]) if len(inputs) == 2 else x.shape[1]
        return rotary_flops(size(x), positions, x.shape[-1], x.dtype)


def rotary_embedding(x, positions=None, base: float = 10000.0):
    """``RotaryEmbedding(base)(x)`` or ``(x, positions)``."""
    layer = RotaryEmbedding(base)
    return layer(x) if positions is None else layer(x, positions)
