"""The ``aten`` op family: one layer class per ATen operator (``aten.add.Tensor``,
``aten.view.default``, ...), all driven by one table of definitions (``OpDef``).

A definition holds the operator's computation written with ``jax.numpy`` and
``jax.lax`` as ``fn(*args, **kwargs)`` in the operator's own signature (tensors are
arrays, the rest the program's constants), the dtypes its first tensor may have and
its FLOP rule. From that one function the layer gets its shape and dtype inference
(``jax.eval_shape``, symbolic dims kept) and its ``apply``. The node's non-tensor
arguments are its hyperparameters (``args``, ``kwargs``: hashable tuples, a tensor
written ``("$tensor", i)``), so graphs holding these layers save and load like any
other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, MlaxGraphError, ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec, TensorSpec, is_symbolic, substitute
from ..ops.base import Layer
from ..ops.flops import size

__all__ = ["OpDef", "AtenOp", "Buffer", "TABLE", "define", "op_class", "TENSOR"]

#: How a tensor argument is written among a node's hyperparameters.
TENSOR = "$tensor"


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One ATen operator: ``fn(*args, **kwargs) -> array or tuple``; ``dtypes`` what
    its first tensor may be ("any", "float"); ``flops`` "elementwise" (one per output
    element), "input" (one per input element), "none", or ``fn(inputs, outputs, args)``."""

    fn: Callable[..., Any]
    dtypes: str = "any"
    flops: Any = "elementwise"


#: ATen operator name (``aten.add.Tensor``) -> its definition.
TABLE: dict[str, OpDef] = {}


def define(*names: str, **kwargs: Any) -> Callable[[Callable], Callable]:
    """Adds ``fn`` to the table under each of ``names`` (a decorator)."""

    def add(fn: Callable) -> Callable:
        for name in names:
            TABLE[name] = OpDef(fn, **kwargs)
            op_class(name)
        return fn

    return add


def _fill(value: Any, tensors: list) -> Any:
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == TENSOR:
            return tensors[value[1]]
        return [_fill(v, tensors) for v in value]
    return value


def _bind(value: Any, dims: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_bind(v, dims) for v in value)
    if not isinstance(value, (str, bool, int, float)) and value is not None and is_symbolic(value):
        return substitute((value,), dims)[0]
    return value


@dataclasses.dataclass(frozen=True)
class AtenOp(Layer):
    """An ATen operator as a layer (one subclass per operator, ``aten.<op>.<overload>``).

    ``args``: the node's positional arguments, ``kwargs``: its keyword arguments as
    ``(name, value)`` pairs; tensors among them are ``("$tensor", i)``, the layer's
    i-th input; lists are tuples; sizes may be symbolic dims.
    """

    args: tuple = ()
    kwargs: tuple = ()

    aten_name = ""
    symbolic_fields = ("args", "kwargs")

    @property
    def default_name(self) -> str:
        return self.aten_name.split(".")[1] if "." in self.aten_name else "aten"

    def definition(self) -> OpDef:
        return TABLE[self.aten_name]

    def bind(self, dims):
        if not dims:
            return self
        bound = dataclasses.replace(self, args=_bind(self.args, dims), kwargs=_bind(self.kwargs, dims))
        object.__setattr__(bound, "_created_at", self.__dict__.get("_created_at"))
        return bound

    def compute(self, tensors: list) -> tuple:
        args = [_fill(a, tensors) for a in self.args]
        kwargs = {k: _fill(v, tensors) for k, v in self.kwargs}
        # ATen says its own result types; inside an operator numpy's promotion holds
        with jax.numpy_dtype_promotion("standard"):
            out = self.definition().fn(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def infer(self, inputs):
        if self.definition().dtypes == "float" and inputs and not (
                jnp.issubdtype(inputs[0].dtype, jnp.floating)):
            raise DTypeError(f"{self.aten_name} does not take {inputs[0].dtype}",
                             expected="a float dtype")
        try:
            out = jax.eval_shape(lambda xs: self.compute(list(xs)), [s.to_jax() for s in inputs])
        except MlaxGraphError:
            raise
        except Exception as e:  # the computation refused the shapes or dtypes
            raise ShapeError(f"{self.aten_name} cannot take these inputs: "
                             f"{(str(e).splitlines() or [type(e).__name__])[0][:300]}",
                             expected="inputs as the ATen operator's schema says") from None
        return tuple(TensorSpec.from_jax(o) for o in out)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return self.compute(list(inputs)), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        rule = self.definition().flops
        if rule == "elementwise":
            return sum(size(o) for o in outputs)
        if rule == "input":
            return sum(size(i) for i in inputs)
        if rule == "none":
            return 0
        return rule(inputs, outputs, self.args)


_CLASSES: dict[str, type[AtenOp]] = {}


def op_class(aten_name: str) -> type[AtenOp]:
    """The layer class of an ATen operator (registered as ``aten.<op>.<overload>``)."""
    cls = _CLASSES.get(aten_name)
    if cls is None:
        title = "".join(p.title() for p in aten_name.replace(".", "_").split("_"))
        cls = type(title, (AtenOp,), {"aten_name": aten_name, "__qualname__": title,
                                      "__module__": __name__})
        cls = register(aten_name)(dataclasses.dataclass(frozen=True)(cls))
        _CLASSES[aten_name] = cls
    return cls


def _zeros(key, shape, dtype):
    return jnp.zeros(shape, dtype)


@register("aten.buffer")
@dataclasses.dataclass(frozen=True)
class Buffer(Layer):
    """A module's buffer (a tensor it holds but does not learn: a causal mask, position
    ids), as state named ``value``; called with no inputs."""

    shape: tuple = ()
    dtype: str = "float32"

    @property
    def default_name(self) -> str:
        return "buffer"

    def infer(self, inputs):
        return (TensorSpec(tuple(self.shape), np.dtype(jnp.dtype(self.dtype))),)

    def state_specs(self, inputs):
        return {"value": ParamSpec(tuple(self.shape), _zeros)}

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.asarray(state["value"]).astype(jnp.dtype(self.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0
