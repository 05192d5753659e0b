"""The ``aten`` op family: one layer class per ATen operator (``aten.add.Tensor``,
``aten.view.default``, ...), all driven by one table of definitions (``OpDef``).

The family is a ``mlaxgraph.ops.foreign.Family`` (shape and dtype inference, apply
and FLOP rules are shared with the ``onnx`` family there). A definition holds the
operator's computation written with ``jax.numpy`` and
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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import GraphError, ShapeError
from ..core.registry import register
from ..core.specs import ParamSpec, TensorSpec, is_symbolic, substitute
from ..ops.base import Layer
from ..ops.foreign import Family, ForeignOp, OpDef, decode_array
from ..ops.tensor import Identity

__all__ = ["OpDef", "AtenOp", "Buffer", "Mode", "TABLE", "DRAWS", "EVERY_MODE", "define", "op_class",
           "TENSOR"]

#: How a tensor argument is written among a node's hyperparameters.
TENSOR = "$tensor"


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
class AtenOp(ForeignOp):
    """An ATen operator as a layer (one subclass per operator, ``aten.<op>.<overload>``).

    ``args``: the node's positional arguments, ``kwargs``: its keyword arguments as
    ``(name, value)`` pairs; tensors among them are ``("$tensor", i)``, the layer's
    i-th input; lists are tuples; sizes may be symbolic dims. A definition's ``fn``
    is called as ``fn(*args, **kwargs)`` in the operator's own signature; a FLOP rule
    gets ``args``.
    """

    args: tuple = ()
    kwargs: tuple = ()

    symbolic_fields = ("args", "kwargs")
    expected = "inputs as the ATen operator's schema says"

    @property
    def aten_name(self) -> str:
        return self.op_key

    @property
    def default_name(self) -> str:
        return self.op_key.split(".")[1] if "." in self.op_key else "aten"

    def bind(self, dims):
        if not dims:
            return self
        bound = dataclasses.replace(self, args=_bind(self.args, dims), kwargs=_bind(self.kwargs, dims))
        object.__setattr__(bound, "_created_at", self.__dict__.get("_created_at"))
        return bound

    def uses_rng(self) -> bool:
        """Whether this call draws random numbers when ``inference_mode=False``: a random
        operator's ``draws(args, kwargs)`` says (dropout with ``train=True``, attention
        with ``dropout_p > 0``)."""
        draws = DRAWS.get(self.op_key)
        return self.definition().random and (draws is None or draws(self.args, dict(self.kwargs)))

    def compute(self, tensors, rng=None) -> tuple:
        args = [_fill(a, list(tensors)) for a in self.args]
        kwargs = {k: _fill(v, list(tensors)) for k, v in self.kwargs}
        if self.uses_rng():  # a random operator takes the key (None: computing in eval mode)
            kwargs["rng"] = rng
        # ATen says its own result types; inside an operator numpy's promotion holds
        with jax.numpy_dtype_promotion("standard"):
            try:
                out = self.definition().fn(*args, **kwargs)
            except NotImplementedError as e:  # an option the definition does not compute
                raise GraphError(f"{self.op_key} with {e} is not supported") from None
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if self.op_key not in EVERY_MODE:
            return super().apply(params, state, inputs, rng=rng, inference_mode=inference_mode)
        if rng is None:  # torch.rand & co. draw in eval mode too
            raise GraphError(f"{self.op_key} draws random numbers in either mode, as PyTorch's: "
                             f"pass rng=jax.random.key(...) to apply (with inference_mode=True too)")
        return self.compute(list(inputs), rng), state

    def rule_args(self) -> tuple:
        return self.args


FAMILY = Family(AtenOp, registered=lambda name: name, module=__name__,
                class_name=lambda name: "".join(p.title() for p in name.replace(".", "_").split("_")))
#: ATen operator name (``aten.add.Tensor``) -> its definition.
TABLE: dict[str, OpDef] = FAMILY.table
#: Adds a definition to the table under each of its names (a decorator).
define = FAMILY.define
#: The layer class of an ATen operator (registered as ``aten.<op>.<overload>``).
op_class = FAMILY.op_class
#: A random operator's name -> whether a call (its ``args``, ``kwargs``) draws.
DRAWS: dict[str, Any] = {}
#: The random operators that draw in eval mode too (``torch.rand``, ...), given a key.
EVERY_MODE: set[str] = set()


def _zeros(key, shape, dtype):
    return jnp.zeros(shape, dtype)


@register("aten.buffer")
@dataclasses.dataclass(frozen=True)
class Buffer(Layer):
    """A module's buffer (a tensor it holds but does not learn: a causal mask, position
    ids), as state named ``value``; called with no inputs. A buffer the module's
    ``state_dict()`` leaves out (registered with ``persistent=False``: Llama's rotary
    ``inv_freq``, BERT's ``position_ids``) and a tensor constant ``torch.export`` lifted
    hold their ``value`` in the layer instead (``encode_array``'s form), so that the
    graph's state is what the state dict holds. Called again with ``(output, new)``, it
    is the module's update of the buffer: ``new`` its new state, ``output`` passed on."""

    shape: tuple = ()
    dtype: str = "float32"
    value: tuple = ()

    @property
    def default_name(self) -> str:
        return "buffer"

    def infer(self, inputs):
        spec = TensorSpec(tuple(self.shape), np.dtype(jnp.dtype(self.dtype)))
        if inputs:  # an update: (the output it passes on, the buffer's new value)
            if len(inputs) != 2 or tuple(inputs[1].shape) != spec.shape:
                raise ShapeError(f"a buffer's update takes the output it passes on and the "
                                 f"new value of shape {spec.shape}, got {len(inputs)} input(s)")
            return (inputs[0],)
        return (spec,)

    def state_specs(self, inputs):
        if self.value:
            return {}
        # an integer or boolean buffer (indices, a mask) is stored in its own dtype: the
        # policy's float param dtype would round ints past 2**24
        dtype = np.dtype(jnp.dtype(self.dtype))
        fixed = None if jnp.issubdtype(dtype, jnp.floating) else dtype
        return {"value": ParamSpec(tuple(self.shape), _zeros, dtype=fixed)}

    def apply(self, params, state, inputs, *, rng, inference_mode):
        if inputs:  # the module's update: the new value is the state, the output passed on
            return (inputs[0],), {"value": jnp.asarray(inputs[1]).astype(state["value"].dtype)}
        value = decode_array(self.value) if self.value else state["value"]
        return (jnp.asarray(value).astype(jnp.dtype(self.dtype)),), state

    def flops(self, inputs, outputs, *, param_dtype, inference_mode):
        return 0


@register("aten.mode")
@dataclasses.dataclass(frozen=True)
class Mode(Identity):
    """The mode the program was exported in, carried by the graph: the identity on the
    program's first input, named ``train_mode`` (``training=True``: the module was in
    train mode, its dropout drawing and its BatchNorm updating statistics; the graph
    computes as the program with ``inference_mode=False``) or ``eval_mode`` (with
    ``inference_mode=True``). ``mg.aten.inference_mode(graph)`` reads it. An
    ``ops.Identity``, so what takes an identity (the decoder's rewrite: each
    position from itself) takes it."""

    training: bool = False

    @property
    def default_name(self) -> str:
        return "train_mode" if self.training else "eval_mode"
