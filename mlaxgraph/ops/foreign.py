"""Foreign op families: the operators of another framework's graphs (ONNX's ``Add``,
ATen's ``aten.add.Tensor``) as layers, one class per operator, all driven by one table
of definitions (``OpDef``) per family (``Family``).

A definition holds the operator's computation written with ``jax.numpy`` and
``jax.lax``, the dtypes its first input may have, its FLOP rule and whether it draws
random numbers. From that one function the layer gets its shape and dtype inference
(``jax.eval_shape``, symbolic dims kept) and its ``apply``. How a node's arguments
reach the function (ONNX's attributes and static inputs, ATen's positional and keyword
arguments) is the family's layer class's ``compute``; the rest is here, once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, MlaxGraphError, ShapeError
from ..core.registry import register
from ..core.specs import TensorSpec
from .base import Layer
from .flops import size

__all__ = ["OpDef", "Family", "ForeignOp", "DTYPE_KINDS", "encode_array", "decode_array"]

#: What an ``OpDef.dtypes`` allows of the operator's first input.
DTYPE_KINDS: dict[str, Callable[[Any], bool]] = {
    "float": lambda d: jnp.issubdtype(d, jnp.floating),
    "numeric": lambda d: jnp.issubdtype(d, jnp.number),
    "int": lambda d: jnp.issubdtype(d, jnp.integer),
    "bool": lambda d: d == np.bool_,
    "any": lambda d: True,
}


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One operator: ``fn`` its computation (called as the family's layer says);
    ``static`` the input positions that must be constants (ONNX); ``dtypes`` what its
    first input may be (a key of ``DTYPE_KINDS``); ``flops`` "elementwise" (one per
    output element), "input" (one per input element), "none", or
    ``fn(inputs, outputs, hyperparameters) -> int``; ``random`` whether it draws
    random numbers when ``inference_mode=False``."""

    fn: Callable[..., Any]
    static: tuple[int, ...] = ()
    dtypes: str = "any"
    flops: Any = "elementwise"
    random: bool = False


class Family:
    """A foreign op family: its table (operator name -> ``OpDef``) and its layer
    classes, made once per operator from ``base`` and registered under
    ``registered(name)`` with the class name ``class_name(name)``."""

    def __init__(self, base: type[ForeignOp], *, registered: Callable[[str], str],
                 class_name: Callable[[str], str], module: str):
        self.base = base
        self.table: dict[str, OpDef] = {}
        self._registered = registered
        self._class_name = class_name
        self._module = module
        self._classes: dict[str, type] = {}
        base.family = self

    def define(self, *names: str, **kwargs: Any) -> Callable[[Callable], Callable]:
        """Adds ``fn`` to the table under each of ``names`` (a decorator)."""

        def add(fn: Callable) -> Callable:
            for name in names:
                self.table[name] = OpDef(fn, **kwargs)
                self.op_class(name)
            return fn

        return add

    def op_class(self, name: str) -> type:
        """The layer class of operator ``name``, made and registered once."""
        cls = self._classes.get(name)
        if cls is None:
            title = self._class_name(name)
            cls = type(title, (self.base,), {"op_key": name, "__qualname__": title,
                                             "__module__": self._module})
            cls = register(self._registered(name))(dataclasses.dataclass(frozen=True)(cls))
            self._classes[name] = cls
        return cls


@dataclasses.dataclass(frozen=True)
class ForeignOp(Layer):
    """An operator of a foreign family as a layer. A family's base class sets
    ``expected`` (what its operators' inputs must be, for errors) and implements
    ``compute(tensors, rng) -> tuple`` and ``rule_args()`` (what a FLOP rule gets)."""

    family: ClassVar[Family]
    op_key: ClassVar[str] = ""
    expected: ClassVar[str] = "inputs as the operator's specification says"

    def definition(self) -> OpDef:
        return self.family.table[self.op_key]

    def uses_rng(self) -> bool:
        return self.definition().random

    def compute(self, tensors: Sequence[Any], rng: Any = None) -> tuple:
        raise NotImplementedError

    def rule_args(self) -> Any:
        raise NotImplementedError

    def infer(self, inputs):
        kind = self.definition().dtypes
        if inputs and not DTYPE_KINDS[kind](inputs[0].dtype):
            raise DTypeError(f"{self.op_key} does not take {inputs[0].dtype}",
                             expected=f"a {kind} dtype")
        rng = jax.eval_shape(jax.random.key, 0) if self.definition().random else None
        try:
            out = jax.eval_shape(lambda xs, key: self.compute(list(xs), key),
                                 [s.to_jax() for s in inputs], rng)
        except MlaxGraphError:
            raise
        except Exception as e:  # the computation refused the shapes or dtypes
            raise ShapeError(f"{self.op_key} cannot take these inputs: "
                             f"{(str(e).splitlines() or [type(e).__name__])[0][:300]}",
                             expected=self.expected) from None
        return tuple(TensorSpec.from_jax(o) for o in out)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return self.compute(list(inputs), None if inference_mode else rng), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        rule = self.definition().flops
        if rule == "elementwise":
            return sum(size(o) for o in outputs)
        if rule == "input":
            return sum(size(i) for i in inputs)
        if rule == "none":
            return 0
        return rule(inputs, outputs, self.rule_args())


def encode_array(value: Any) -> tuple:
    """An array as a hashable hyperparameter: ``("tensor", dtype, shape, values)``."""
    array = np.asarray(value)
    flat = array.reshape(-1)
    # ml_dtypes' types (bfloat16, float8_*, int4, uint4) are of NumPy kind "V"
    if array.dtype.kind == "c":
        values: tuple = tuple(complex(v) for v in flat)
    elif array.dtype.kind == "b":
        values = tuple(bool(v) for v in flat)
    elif jnp.issubdtype(array.dtype, jnp.floating):
        values = tuple(float(v) for v in flat.astype(np.float64))
    elif jnp.issubdtype(array.dtype, jnp.integer):
        values = tuple(int(v) for v in flat.astype(np.int64))
    else:
        values = tuple(str(v) for v in flat)
    return ("tensor", array.dtype.name, tuple(int(d) for d in array.shape), values)


def decode_array(encoded: tuple) -> np.ndarray:
    _, dtype, shape, values = encoded
    dtype = jnp.dtype(dtype)
    return np.asarray(values, dtype=np.float64 if dtype.name == "bfloat16" else None) \
        .astype(dtype).reshape(shape) if values else np.zeros(shape, dtype)
