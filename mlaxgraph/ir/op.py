"""The layer contract: ``Layer``, the one base class of every op (the IR records ops
in its nodes, as ``jax.core`` records primitives in equations).

An op is a frozen dataclass whose fields are its hyperparameters (static, hashable,
compared by value). Each op defines, in one place, all its rules:

- ``infer(inputs) -> outputs``: output specs from input specs; raises ``ShapeError`` or
  ``DTypeError`` (with ``expected=``) for inputs it cannot take.
- ``param_specs(inputs)`` / ``state_specs(inputs)``: its trainable and non-trainable
  weights, by name, with shape and initializer (nested dicts for layers made of
  layers).
- ``apply(params, state, inputs, *, rng, inference_mode) -> (outputs, new_state)``.
- ``flops(inputs, outputs, *, param_dtype, inference_mode)``: its forward FLOPs, by
  XLA's counting conventions (``ops/flops.py``), for the cost table.
- ``output_axes(input_axes, inputs, outputs)``: the logical axis names of its outputs'
  dims, for sharding (``mlaxgraph/core/axes.py``); weights name theirs in
  ``ParamSpec.axes``.
- ``subgraph()``: the graph a layer runs inside it (a block), or None.

Calling a layer object on symbolic tensors records a node in the graph being built.
Calling the same object again shares its weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import jax
import numpy as np

from ..core.axes import follow_inputs
from ..core.errors import ConfigError, capture_source, node_message
from ..core.signatures import KeywordsNamed, call_problem
from ..core.specs import ParamSpec, TensorSpec, has_control_characters, is_int, substitute
from .builder import call_layer

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["Layer", "field", "Converter"]

#: ``converter(value, layer) -> value``: normalizes a hyperparameter at construction,
#: raising through ``layer.invalid`` for a value it cannot take. Converters run in the
#: order the fields are declared, so one may read a field converted before it.
Converter = Callable[[Any, "Layer"], Any]

# The class declaring the field: its converter gets an instance of it, so a converter may
# read that class's fields (``Conv``'s data_format converter reads ``kernel_size``).
_L = TypeVar("_L", bound="Layer")


def field(*, converter: Callable[[Any, _L], Any], **kwargs: Any) -> Any:
    """A hyperparameter normalized by ``converter`` when the layer is made (as
    Equinox's field converters), so the field holds, and its annotation says, one form:
    ``kernel_size: tuple[int, ...] = field(converter=...)`` takes ``3`` or ``[3, 3]``
    and stores ``(3, 3)``.

    Example:
      >>> import dataclasses
      >>> @dataclasses.dataclass(frozen=True)
      ... class Scale(Layer):
      ...     factor: float = field(default=1, converter=lambda v, layer: float(v))
      >>> Scale(2).factor
      2.0
    """
    metadata = dict(kwargs.pop("metadata", None) or {}, converter=converter)
    return dataclasses.field(metadata=metadata, **kwargs)


@dataclasses.dataclass(frozen=True)
class Layer(KeywordsNamed):
    """Base class of ops. Subclasses are frozen dataclasses registered by op name.

    ``name`` is the name the user asked for; it does not take part in equality, so
    two layers with the same hyperparameters compare equal, and their identity (one
    object called twice) is what shares weights.
    """

    name: str | None = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)

    op_name: ClassVar[str] = ""
    #: Computes in float32 under a half-precision policy (the policy inserts the casts).
    precision_sensitive: ClassVar[bool] = False
    #: Needs an rng when ``inference_mode=False``.
    random: ClassVar[bool] = False
    #: Fields holding symbolic dims (``ops.arange(tokens.shape[1])``): the interpreter
    #: evaluates them with the values the dims take in the running call (``bind``).
    symbolic_fields: ClassVar[tuple[str, ...]] = ()
    #: Slides a window over spatial dims (convolutions, pooling): an input too small for
    #: the window, its symbolic dims bound in a call, is named before it runs.
    windowed: ClassVar[bool] = False
    #: Runs a user's function (``ops.F``): what fails inside is named with the layer.
    user_code: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # Where the user made the layer, for errors raised by validate() (it may live in
        # a user module, so the frames above it are not all mlaxgraph's).
        object.__setattr__(self, "_created_at", capture_source())
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            self.invalid(f"a layer name must be a non-empty string, got {self.name!r}")
        if self.name is not None and has_control_characters(self.name):
            self.invalid(f"a layer name cannot hold control characters (tabs, line breaks): "
                         f"files cannot store it, got {self.name!r}")
        if self.name is not None and any(c in self.name for c in "/#"):
            self.invalid(f"a layer name cannot hold '/' (it joins the names of a path: "
                         f"'h.3/attn') or '#' (it numbers a node's outputs), got {self.name!r}")
        for f in dataclasses.fields(self):
            convert = f.metadata.get("converter")
            if convert is not None:
                object.__setattr__(self, f.name, convert(getattr(self, f.name), self))
            elif f.type in ("Initializer | None", "Initializer"):
                _check_initializer(self, f.name, getattr(self, f.name))
            elif f.type in ("int", "int | None"):  # a tuple axis failed at the call, 2.5 later
                value = getattr(self, f.name)
                if not (is_int(value) or value is None and f.type != "int"):
                    self.invalid(f"{f.name} is an int, got {value!r}")
                if value is not None:
                    object.__setattr__(self, f.name, int(value))
            elif f.type in ("bool", "bool | None"):  # "False" would be true
                value = getattr(self, f.name)
                if not (isinstance(value, (bool, np.bool_)) or value is None and f.type != "bool"):
                    self.invalid(f"{f.name} is True or False, got {value!r}")
                if value is not None:
                    object.__setattr__(self, f.name, bool(value))
        self.validate()
        try:  # hyperparameters are hashable: graphs are compared, cached and folded by them
            hash(self)
        except TypeError as e:
            self.invalid(f"its hyperparameters must be hashable (tuples, not lists or dicts): {e}")

    # --- hooks for subclasses -------------------------------------------------------

    def validate(self) -> None:
        """Checks hyperparameters (already in the form their converters give them);
        raise through ``self.invalid``."""

    def infer(self, inputs: Sequence[TensorSpec]) -> tuple[TensorSpec, ...]:
        raise NotImplementedError

    def param_specs(self, inputs: Sequence[TensorSpec]) -> Mapping[str, ParamSpec]:
        return {}

    def state_specs(self, inputs: Sequence[TensorSpec]) -> Mapping[str, ParamSpec]:
        return {}

    def apply(self, params: Mapping[str, jax.Array], state: Mapping[str, jax.Array],
              inputs: Sequence[jax.Array], *, rng: jax.Array | None,
              inference_mode: bool) -> tuple[tuple[jax.Array, ...], Mapping[str, jax.Array]]:
        raise NotImplementedError

    def flops(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
              param_dtype: Any, inference_mode: bool) -> Any:
        """The forward FLOPs of one call, an int or a formula of the symbolic dims,
        counted by XLA's conventions (mlaxgraph/ops/flops.py). None (the default) when
        the op has no rule: the cost table then shows XLA's count for the layer."""
        return None

    def backward_flops(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                       forward: Any, *, input_gradients: bool = True) -> Any:
        """The FLOPs of the backward pass, given the forward count. The default is the
        usual estimate: the forward count once for the inputs' gradient (unless no
        gradient flows to them: ``input_gradients=False`` for a layer reading only
        the graph's inputs), and once more for the weights' gradient when the layer
        has trainable weights."""
        if forward is None:
            return None
        return (forward if input_gradients else 0) + (forward if self.param_specs(inputs) else 0)

    def runtime_checks(self, inputs: Sequence[jax.Array]) -> Sequence[tuple[jax.Array, str]]:
        """``(ok, what)`` pairs checked at run time when compiled with ``checks=True``:
        ``ok`` a boolean scalar computed from the input arrays, ``what`` the problem
        when it is false (the compiler adds the layer's path). NaN and inf outputs are
        checked for every layer; this adds what only the op knows (an id range)."""
        return ()

    def xla_cost_caveat(self, inference_mode: bool) -> str | None:
        """Why XLA's cost analysis of this op cannot be compared with its rule (None
        when it can); the cost table prints the reason instead of XLA's number."""
        return None

    def output_axes(self, input_axes: Sequence[tuple], inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec]) -> tuple[tuple, ...]:
        """The logical axis names of each output's dims, from the inputs' names (one
        tuple per input; ``mlaxgraph.core.axes.UNKNOWN`` for an unknown dim). The compiler
        constrains activations to them when compiling with a mesh. By default an
        output with an input's shape keeps its names, else the leading (batch) dim's
        name is kept (see ``mlaxgraph.core.axes.follow_inputs``); layers whose weights name
        an output dim (``Linear``, ``Conv``, ...) override it."""
        return follow_inputs(input_axes, inputs, outputs)

    def display_name(self, node_name: str) -> str:
        """How summaries and renderings name a call of this layer (a scan names its run
        of blocks and their count)."""
        return node_name

    def subgraph(self) -> Graph | None:
        """The graph this layer runs inside it (a block's), or None: printing,
        rendering, saving and the passes descend into it."""
        return None

    def with_subgraph(self, graph: Graph) -> Layer:
        """This layer running ``graph`` instead of its own (passes rewrite nested graphs
        through it)."""
        raise TypeError(f"{type(self).__name__} holds no graph")

    def bind(self, dims: Mapping[str, Any]) -> Layer:
        """This layer with the symbolic dims in its ``symbolic_fields`` replaced by their
        values (ints, or the dims of the arrays being traced), by variable name; itself
        when it has none."""
        if not self.symbolic_fields or not dims:
            return self
        changes: dict[str, Any] = {}
        for name in self.symbolic_fields:
            value = getattr(self, name)
            if isinstance(value, tuple):
                changes[name] = substitute(value, dims)
            elif value is not None:
                changes[name] = substitute((value,), dims)[0]
        bound = dataclasses.replace(self, **changes)
        object.__setattr__(bound, "_created_at", self.__dict__.get("_created_at"))
        return bound

    # --- shared behaviour -----------------------------------------------------------

    def call_inputs(self, *args: Any, **kwargs: Any) -> tuple:
        """Maps a call's arguments to the node's positional inputs. Layers taking
        keyword tensors (``mha(q, kv, mask=m)``) override it; the default takes
        positional tensors only."""
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        return args

    def uses_rng(self) -> bool:
        """Whether the layer needs an rng when ``inference_mode=False``."""
        return self.random

    @property
    def default_name(self) -> str:
        """The base of automatic names: ``linear``, ``linear_1``, ..."""
        return self.op_name

    def attrs(self) -> dict[str, Any]:
        """The hyperparameters, by field name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return call_layer(self, inputs, kwargs)

    def invalid(self, problem: str, error: type = ConfigError) -> NoReturn:
        """Raises ``error`` (``ConfigError`` unless another fits better: a
        ``DTypeError`` for a dtype, a ``ShardingError`` for axes) for a bad
        hyperparameter, naming the layer and the user's line."""
        source = self.__dict__.get("_created_at") or capture_source()
        raise error(node_message(self.name or self.default_name, self.op_name, problem,
                                 source=source))


def _check_initializer(layer: Layer, name: str, value: Any) -> None:
    """An initializer field holds None or ``fn(key, shape, dtype)`` (a Keras name, or a
    function of the shape alone, failed at ``init`` naming no layer)."""
    if value is None:
        return
    if not callable(value):
        layer.invalid(f"{name} is an initializer, fn(key, shape, dtype) -> array, got {value!r}: "
                      f"jax.nn.initializers has them (jax.nn.initializers.he_normal() for "
                      f"Keras's 'he_normal')")
    problem = call_problem(value, 3)
    if problem is not None:
        layer.invalid(f"{name} is called as fn(key, shape, dtype), and {problem}")
