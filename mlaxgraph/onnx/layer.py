"""The ``onnx`` op family: one layer class per ONNX operator (``onnx.Add``,
``onnx.Reshape``, ...), all driven by one table of definitions (``OpDef``).

The family is a ``mlaxgraph.ops.foreign.Family`` (shape and dtype inference, apply
and FLOP rules are shared with the ``aten`` family there). A definition holds the
operator's computation, written with ``jax.numpy`` and ``jax.lax`` as
``fn(attrs, *inputs)``, the input positions that must be known when
the graph is built (a ``Reshape``'s shape: ``static``), the dtypes its first input
may have and its FLOP rule. From the one function the layer gets its shape and dtype
inference (``jax.eval_shape``, symbolic dims kept), its ``apply`` and the importer its
constant folding. Hyperparameters are the node's attributes and its static inputs,
as hashable tuples, so graphs holding these layers save and load like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from ..core.registry import register
from ..core.specs import TensorSpec
from ..ops.base import Layer
from ..ops.foreign import Family, ForeignOp, OpDef, decode_array, encode_array

__all__ = ["OpDef", "Attrs", "OnnxOp", "Constant", "TABLE", "DOMAINS", "define", "op_class",
           "encode_array", "decode_array", "ONNX_OPS"]


class Attrs:
    """A node's attributes, read by name: ``a.get("axis", 0)``, ``a["perm"]``; ``a.opset``
    the opset the model was written for, ``a.outputs`` how many outputs it asked for."""

    def __init__(self, items: Mapping[str, Any], opset: int, outputs: int):
        self._items = dict(items)
        self.opset = opset
        self.outputs = outputs

    def get(self, name: str, default: Any = None) -> Any:
        value = self._items.get(name, default)
        if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
            return decode_array(value)
        return value

    def __getitem__(self, name: str) -> Any:
        if name not in self._items:
            raise ShapeError(f"the attribute {name!r} is required", expected=f"attribute {name}")
        return self.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._items


@dataclasses.dataclass(frozen=True)
class OnnxOp(ForeignOp):
    """An ONNX operator as a layer (one subclass per operator, ``onnx.<Op>``).

    ``attributes``: the node's attributes, ``(name, value)`` pairs; ``static``: its
    constant inputs, ``(position, encoded array)``; ``present``: which of its ONNX
    inputs are given (omitted optional inputs are False); ``outputs``: how many
    outputs the node has; ``opset``: the operator set the model was written for.
    The layer's tensor inputs are the given inputs that are not static, in order.
    A definition's ``fn`` is called as ``fn(attrs, *inputs)`` (absent optional inputs
    None, static ones numpy arrays); a FLOP rule gets the ``Attrs``.
    """

    attributes: tuple = ()
    static: tuple = ()
    present: tuple = ()
    outputs: int = 1
    opset: int = 21

    expected = "inputs as the ONNX operator's specification says"

    @property
    def onnx_type(self) -> str:
        return self.op_key

    @property
    def default_name(self) -> str:
        return self.op_key.lower() or "onnx"

    def _args(self, tensors: Sequence[Any]) -> list:
        statics = {position: decode_array(value) for position, value in self.static}
        present = self.present or (True,) * (len(tensors) + len(statics))
        args: list[Any] = []
        it = iter(tensors)
        for position, given in enumerate(present):
            if not given:
                args.append(None)
            elif position in statics:
                args.append(statics[position])
            else:
                args.append(next(it))
        while args and args[-1] is None:
            args.pop()
        return args

    def compute(self, tensors: Sequence[Any], rng: Any = None) -> tuple:
        attrs = self.rule_args()
        if self.definition().random:
            attrs._items["__rng__"] = rng
        # ONNX's operators say their own types; inside them numpy's promotion holds,
        # whatever the user's jax_numpy_dtype_promotion
        with jax.numpy_dtype_promotion("standard"):
            out = self.definition().fn(attrs, *self._args(tensors))
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return outs[:self.outputs]

    def rule_args(self) -> Attrs:
        return Attrs(dict(self.attributes), self.opset, self.outputs)


FAMILY = Family(OnnxOp, registered=lambda name: f"onnx.{name}", module=__name__,
                class_name=lambda name: f"Onnx{name}")
#: ONNX operator name -> its definition.
TABLE: dict[str, OpDef] = FAMILY.table
#: Adds a definition to the table under each of its names (a decorator).
define = FAMILY.define
#: The layer class of an ONNX operator (``onnx.<Op>``), made once.
op_class = FAMILY.op_class
#: The operators of other domains than ONNX's own, by name: ``to_onnx`` writes them
#: in their domain (``ai.onnx.ml``'s Binarizer, the training domain's Adam).
DOMAINS: dict[str, str] = {}


@register("onnx.constant")
@dataclasses.dataclass(frozen=True)
class Constant(Layer):
    """A constant tensor held in the graph (an ONNX ``Constant`` or a non-float
    initializer): ``value`` is ``("tensor", dtype, shape, values)``. It takes no input."""

    value: tuple = ()

    @property
    def default_name(self) -> str:
        return "constant"

    def infer(self, inputs):
        _, dtype, shape, _ = self.value
        # As apply makes it: 64-bit narrows to 32 unless jax_enable_x64 is on.
        return (TensorSpec(tuple(shape), np.dtype(jax.dtypes.canonicalize_dtype(jnp.dtype(dtype)))),)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        return (jnp.asarray(decode_array(self.value)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


def ONNX_OPS() -> list[str]:
    """The ONNX operators the family implements, sorted."""
    return sorted(TABLE)
