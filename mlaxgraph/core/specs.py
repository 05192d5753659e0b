"""TensorSpec: a shape, possibly with symbolic dims, and a dtype.

Symbolic dims are ``jax.export`` dimension expressions, all in one scope shared by
every graph, so that a dim named ``batch`` is the same dim everywhere: in shape
inference, in ``jax.eval_shape`` and in ``jax.export``. They support the arithmetic
that shape inference needs (``7 * 7 * batch``) and print as their name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import jax
import numpy as np
from jax import export

from .errors import DTypeError, ShapeError

__all__ = ["Dim", "TensorSpec", "ParamSpec", "Initializer", "flatten_specs", "specs_str",
           "SCOPE", "as_dim", "as_dtype", "is_symbolic", "dim_names", "bind_dims", "match_shape",
           "substitute", "shape_str", "dtype_str", "trains", "is_int", "has_control_characters"]

#: The one symbolic scope of every mlaxgraph dim.
SCOPE = export.SymbolicScope()

# An int or a jax.export symbolic dimension expression. The expressions have no public
# type (their class is private to jax), and ints and expressions are mixed freely in
# arithmetic, so the alias is ``Any``; ``is_symbolic`` tells the two apart at run time.
Dim: TypeAlias = Any

_SHORT_DTYPES = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool",
    "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2",
}
_LONG_DTYPES = {short: long for long, short in _SHORT_DTYPES.items()}


def is_int(value: Any) -> bool:
    """An int (NumPy's too), not a bool, a float or a string, which ``int()`` would
    truncate or parse."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds an ASCII control character (a tab, a line break), which the
    file formats do not store in a name."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def is_symbolic(dim: Dim) -> bool:
    """True for a symbolic dim (a dimension expression that is not a constant)."""
    return not isinstance(dim, (int, np.integer))


def as_dim(dim: Any) -> Dim:
    """An int, or a symbolic dim parsed from a string such as ``"batch"`` or ``"2*batch"``."""
    if isinstance(dim, (bool, np.bool_)):
        raise ShapeError(f"a dim must be an int or a name, got {dim!r}")
    if isinstance(dim, (int, np.integer)):
        if dim < 0:
            raise ShapeError(f"a dim must be >= 0, got {dim}")
        return int(dim)
    if isinstance(dim, str):
        if not dim.strip():
            raise ShapeError("a symbolic dim needs a name, got ''")
        try:
            (parsed,) = export.symbolic_shape(dim, scope=SCOPE)
        except Exception as e:  # jax raises ValueError or a private error class
            raise ShapeError(f"cannot parse the symbolic dim {dim!r}: {e}") from e
        return int(parsed) if not is_symbolic(parsed) else parsed
    if is_symbolic(dim) and hasattr(dim, "scope"):
        if dim.scope is not SCOPE:
            # A dim from another scope cannot be compared with ours: re-parse its text.
            return as_dim(str(dim))
        return dim
    if dim is None:  # Keras's and ONNX's spelling of an unknown dim
        raise ShapeError("a dim must be an int or a name, got None: name a symbolic dim, "
                         "e.g. mg.Input((\"batch\", 16)) where Keras writes (None, 16)")
    raise ShapeError(f"a dim must be an int or a name, got {dim!r} of type {type(dim).__name__}")


def as_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a name (``"float32"``, ``"bf16"``), a numpy or a jnp dtype."""
    if isinstance(dtype, str) and dtype in _LONG_DTYPES:
        dtype = _LONG_DTYPES[dtype]
    try:
        requested = np.dtype(dtype)
    except Exception as e:
        raise DTypeError(f"unknown dtype {dtype!r}") from e
    result = np.dtype(jax.dtypes.canonicalize_dtype(requested))
    if result != requested:
        raise DTypeError(f"dtype {requested} is not available with this JAX configuration "
                         f"(64-bit types need jax_enable_x64)")
    return result


@functools.lru_cache(maxsize=64)
def dtype_str(dtype: np.dtype) -> str:
    """The short name of a dtype: f32, bf16, i32."""
    return _SHORT_DTYPES.get(str(dtype), str(dtype))


def shape_str(shape: Iterable[Dim]) -> str:
    return "[" + ",".join(str(d).replace(" ", "") for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The type of a tensor in a graph: shape (ints and symbolic dims) and dtype.

    Example:
      >>> spec = TensorSpec.of(("batch", 128), "float32")
      >>> spec
      f32[batch,128]
      >>> spec.shape
      (batch, 128)
      >>> spec.rank, spec.dtype
      (2, dtype('float32'))
    """

    shape: tuple[Dim, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, shape: Iterable[Any], dtype: Any) -> TensorSpec:
        """A spec from user values: dims as ints or names, dtype as a name or dtype."""
        if isinstance(shape, (str, int)):
            raise ShapeError(f"a shape must be a tuple of dims, got {shape!r}")
        return cls(tuple(as_dim(d) for d in shape), as_dtype(dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return bool(jax.numpy.issubdtype(self.dtype, jax.numpy.floating))

    def with_dtype(self, dtype: Any) -> TensorSpec:
        return TensorSpec(self.shape, as_dtype(dtype))

    def with_shape(self, shape: Iterable[Dim]) -> TensorSpec:
        return TensorSpec(tuple(shape), self.dtype)

    def to_jax(self) -> jax.ShapeDtypeStruct:
        """The spec as a ``jax.ShapeDtypeStruct`` (symbolic dims kept)."""
        return jax.ShapeDtypeStruct(self.shape, self.dtype)

    @classmethod
    def from_jax(cls, value: Any) -> TensorSpec:
        return cls(tuple(as_dim(d) for d in value.shape), np.dtype(value.dtype))

    def bind(self, bindings: Mapping[str, int]) -> jax.ShapeDtypeStruct:
        """A concrete ``ShapeDtypeStruct`` with symbolic dims given values by name."""
        return jax.ShapeDtypeStruct(bind_dims(self.shape, bindings), self.dtype)

    def __str__(self) -> str:
        return dtype_str(self.dtype) + shape_str(self.shape)

    __repr__ = __str__


def dim_names(shape: Iterable[Dim]) -> tuple[str, ...]:
    """Names of the symbolic variables in a shape, in order of first appearance."""
    names: list[str] = []
    for d in shape:
        if is_symbolic(d):
            for var in sorted(d._get_vars()):
                if var not in names:
                    names.append(var)
    return tuple(names)


def bind_dims(shape: Iterable[Dim], bindings: Mapping[str, int]) -> tuple[int, ...]:
    """The shape with every symbolic dim evaluated with ``bindings`` (name -> int)."""
    out = []
    for d in shape:
        if is_symbolic(d):
            missing = [v for v in d._get_vars() if v not in bindings]
            if missing:
                raise ShapeError(f"no value for the symbolic dim {missing[0]!r}: pass "
                                 f"{missing[0]}=<int>")
            # 64-bit values: JAX keeps a term's coefficient as an int32, which times a
            # Python int wraps around past 2**31 (FLOP counts do).
            out.append(int(d._evaluate({k: np.int64(v) for k, v in bindings.items()})))
        else:
            out.append(int(d))
    return tuple(out)


def match_shape(spec_shape: Iterable[Dim], shape: Iterable[Any], bindings: dict[str, Any]) -> bool:
    """Whether a concrete (or symbolic) ``shape`` fits ``spec_shape``, binding symbolic
    dims that are plain names in ``bindings`` (name -> size) as it goes."""
    spec_shape, shape = tuple(spec_shape), tuple(shape)
    if len(spec_shape) != len(shape):
        return False
    deferred = []
    for want, got in zip(spec_shape, shape):
        if not is_symbolic(want):
            if is_symbolic(got) or int(got) != want:
                return False
        elif want._to_var() is not None:
            name = want._to_var()
            if name in bindings and not bindings[name] == got:
                return False
            bindings.setdefault(name, got)
        else:
            deferred.append((want, got))
    for want, got in deferred:
        if _identical(want, got):  # the same expression (a block built on its caller's dims)
            continue
        if any(v not in bindings for v in want._get_vars()):
            return False
        if not want._evaluate(dict(bindings)) == got:
            return False
    return True


def _identical(want: Any, got: Any) -> bool:
    """Whether two dims are one expression (``-floordiv(-height, 2)`` both); False where
    jax cannot say (dims of different symbolic scopes)."""
    try:
        return bool(is_symbolic(got) and want == got)
    except Exception:  # noqa: BLE001  (jax's inconclusive comparison)
        return False


def substitute(shape: Iterable[Dim], bindings: Mapping[str, Any]) -> tuple[Dim, ...]:
    """The shape with its symbolic variables replaced by ``bindings`` (ints or dims);
    dims with an unbound variable stay as they are."""
    out = []
    for d in shape:
        if is_symbolic(d) and all(v in bindings for v in d._get_vars()):
            d = d._evaluate(dict(bindings))
            d = int(d) if not is_symbolic(d) else d
        out.append(d)
    return tuple(out)


Initializer = Callable[[jax.Array, tuple, Any], jax.Array]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """A weight a layer declares: its shape, initializer and logical axis names.

    Weights are created in the policy's ``param_dtype`` and cast to the compute dtype
    inside the layer, unless ``dtype`` names the one dtype the weight is stored in
    whatever the policy (a quantized layer's int8 kernel and float32 scales).
    """

    shape: tuple[int, ...]
    init: Initializer
    axes: tuple[str | None, ...] | None = None
    #: The weights-file layout version (``mlaxgraph.version``) that first holds this
    #: weight: a file of an older layout lacks it and loads it as zeros, the value that
    #: computes what the layer computed before the weight was added.
    added_in: int = 1
    #: The dtype the weight is stored in whatever the policy's ``param_dtype`` (None:
    #: the policy's). A weight of an integer dtype is never trained.
    dtype: np.dtype | None = None

    @property
    def size(self) -> int:
        size = 1
        for d in self.shape:
            size *= d
        return size

    def stored_dtype(self, param_dtype: Any) -> np.dtype:
        """The dtype this weight is made and kept in under ``param_dtype``."""
        return np.dtype(param_dtype) if self.dtype is None else np.dtype(self.dtype)

    def stored_bytes(self, param_dtype: Any) -> int:
        """The bytes of this weight as stored under ``param_dtype``."""
        return self.size * self.stored_dtype(param_dtype).itemsize


def trains(dtype: Any) -> bool:
    """Whether a weight stored in ``dtype`` can train: a float of 16 bits or more, not a
    quantized layer's stored values (int8, packed int4, float8: one byte each) or its
    integer sums (``kernel_sum``, int32), which have no gradient."""
    return bool(jax.numpy.issubdtype(dtype, jax.numpy.floating)) and np.dtype(dtype).itemsize > 1


def flatten_specs(specs: Mapping[str, Any], prefix: str = "") -> list[tuple[str, ParamSpec]]:
    """``(path, spec)`` pairs of a possibly nested dict of ParamSpecs, paths joined by '/'."""
    out = []
    for name, spec in specs.items():
        if isinstance(spec, Mapping):
            out += flatten_specs(spec, f"{prefix}{name}/")
        else:
            out.append((prefix + name, spec))
    return out


def specs_str(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(str(s) for s in specs)
