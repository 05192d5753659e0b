"""The builder: symbolic tensors, recorded layer calls, and turning them into nodes.

It is the only mutable part of the IR. Names are allocated when a ``Graph`` is made,
per graph and in call order, so building the same code twice gives equal graphs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import GraphError, MlaxGraphError, ShapeError, SourceInfo, capture_source, node_message
from ..core.registry import lookup
from ..core.specs import TensorSpec, flatten_specs
from .node import Node, Value

__all__ = ["SymbolicTensor", "Call", "call_layer", "trace_graph"]

_ORDER = itertools.count()


def label(layer) -> str:
    """How errors name a layer before the graph gives it its final name."""
    return layer.name or layer.default_name


class Call:
    """One recorded call of a layer object on symbolic tensors."""

    __slots__ = ("layer", "inputs", "outputs", "source", "order")

    def __init__(self, layer, inputs, outputs, source):
        self.layer = layer
        self.inputs: tuple[SymbolicTensor, ...] = inputs
        self.outputs: tuple[TensorSpec, ...] = outputs
        self.source: SourceInfo | None = source
        self.order = next(_ORDER)

    @property
    def label(self) -> str:
        return label(self.layer)


class SymbolicTensor:
    """A tensor in a graph under construction: its spec and the call that made it.

    Example:
      >>> import mlaxgraph as mg
      >>> x = mg.Input(("batch", 28, 28, 1), "float32", name="image")
      >>> x.shape, x.dtype
      ((batch, 28, 28, 1), dtype('float32'))
      >>> x
      SymbolicTensor(f32[batch,28,28,1], from 'image')
    """

    __slots__ = ("spec", "call", "index")

    def __init__(self, spec: TensorSpec, call: Call, index: int):
        self.spec = spec
        self.call = call
        self.index = index

    @property
    def shape(self):
        return self.spec.shape

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def ndim(self) -> int:
        return self.spec.rank

    def __repr__(self) -> str:
        index = f"#{self.index}" if self.index else ""
        return f"SymbolicTensor({self.spec}, from {self.call.label!r}{index})"

    def __bool__(self):
        raise GraphError("a symbolic tensor has no truth value: it holds no data until "
                         "the compiled model runs")

    def __array__(self, *args, **kwargs):
        raise GraphError("a symbolic tensor has no data; wrap array code in ops.F(fn) to "
                         "make it a layer")

    def __iter__(self):
        # without it Python iterates through __getitem__: x[0], x[1], ... forever on a
        # symbolic batch (ops.concat(x) for ops.concat([x, y]) hung)
        raise GraphError(f"a symbolic tensor ({self.spec}) cannot be iterated: index it "
                         f"(x[0]), split it (ops.split), or pass tensors in a list "
                         f"(ops.concat([x, y]))")

    # Operators: each records an ordinary op node (``add``, ``getitem``, ...). A Python
    # scalar operand becomes the op's ``constant``, weakly typed: it never changes the
    # tensor's dtype. ``==`` and ``!=`` keep their Python meaning (identity), so that
    # tensors can be compared and hashed; ``ops.equal`` and ``ops.not_equal`` make nodes.

    __array_priority__ = 100  # NumPy scalars on the left defer to our reflected operators

    def __add__(self, other):
        return _binary("add", self, other)

    def __radd__(self, other):
        return _binary("add", self, other, reverse=True)

    def __sub__(self, other):
        return _binary("sub", self, other)

    def __rsub__(self, other):
        return _binary("sub", self, other, reverse=True)

    def __mul__(self, other):
        return _binary("mul", self, other)

    def __rmul__(self, other):
        return _binary("mul", self, other, reverse=True)

    def __truediv__(self, other):
        return _binary("div", self, other)

    def __rtruediv__(self, other):
        return _binary("div", self, other, reverse=True)

    def __pow__(self, other):
        return _binary("pow", self, other)

    def __rpow__(self, other):
        return _binary("pow", self, other, reverse=True)

    def __matmul__(self, other):
        return _binary("matmul", self, other, scalars=False)

    def __rmatmul__(self, other):
        return _binary("matmul", self, other, reverse=True, scalars=False)

    def __lt__(self, other):
        return _binary("less", self, other)

    def __le__(self, other):
        return _binary("less_equal", self, other)

    def __gt__(self, other):
        return _binary("greater", self, other)

    def __ge__(self, other):
        return _binary("greater_equal", self, other)

    def __neg__(self):
        return lookup("neg")()(self)

    def __pos__(self):
        return self

    def __getitem__(self, index):
        return lookup("getitem")(index if isinstance(index, tuple) else (index,))(self)

    __hash__ = object.__hash__


_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _binary(op_name: str, tensor: SymbolicTensor, other: Any, *, reverse: bool = False,
            scalars: bool = True):
    """``tensor <op> other`` (``other <op> tensor`` when ``reverse``) as a node."""
    cls: Any = lookup(op_name)  # a binary op class, with its constant and reverse fields
    if isinstance(other, SymbolicTensor):
        return cls()(other, tensor) if reverse else cls()(tensor, other)
    if scalars and isinstance(other, _SCALARS) and np.ndim(other) == 0:
        value = other.item() if isinstance(other, np.generic) else other
        return cls(constant=value, reverse=reverse)(tensor)
    if hasattr(other, "shape") and hasattr(other, "dtype"):  # a NumPy or JAX array (JAX's
        # own operator raised a TypeError naming neither)
        raise GraphError(f"{op_name} of a symbolic tensor ({tensor.spec}) and a "
                         f"{type(other).__name__} of shape {tuple(other.shape)}: a symbolic "
                         f"tensor has no data; make the array a weight (ops.Param) or wrap "
                         f"array code in ops.F(fn) to make it a layer")
    return NotImplemented


def call_layer(layer, args: Sequence[Any], kwargs: dict[str, Any]):
    """Records ``layer(*args, **kwargs)``; returns one symbolic tensor or a tuple."""
    source = capture_source()
    try:
        args = layer.call_inputs(*args, **kwargs)
    except MlaxGraphError as e:
        got = ", ".join(str(a.spec) for a in args if isinstance(a, SymbolicTensor)) or None
        raise type(e)(node_message(label(layer), layer.op_name, e.problem, got=got,
                                   expected=e.expected, source=source)) from None
    except TypeError as e:
        raise TypeError(node_message(label(layer), layer.op_name, str(e), source=source)) from None
    for arg in args:
        if not isinstance(arg, SymbolicTensor):
            raise GraphError(node_message(
                label(layer), layer.op_name,
                f"layers are called on symbolic tensors (from mg.Input or other layers), "
                f"got {type(arg).__name__}; to run a model on arrays, use "
                f"mg.compile(graph).apply", source=source))
    inputs = tuple(args)
    specs = tuple(t.spec for t in inputs)
    outputs = infer_outputs(layer, specs, label(layer), source, lambda: call_context(layer, inputs))
    check_shared_weights(layer, specs, source)
    call = Call(layer, inputs, outputs, source)
    tensors = tuple(SymbolicTensor(spec, call, i) for i, spec in enumerate(outputs))
    return tensors[0] if len(tensors) == 1 else tensors


def call_context(layer, inputs: Sequence[SymbolicTensor]) -> list[str]:
    """Printed lines for a call that failed: the calls that made its inputs, then it."""
    from .printer import format_call  # lazy: the printer imports graph.py, which imports this module

    lines = []
    for t in dict.fromkeys(t.call for t in inputs):
        args = ", ".join(f"%{label(i.call.layer)}" for i in t.inputs)
        outs = ", ".join(str(s) for s in t.outputs)
        lines.append(f"  %{t.label}: {outs} = {format_call(t.layer, args)}")
    args = ", ".join(f"%{t.call.label}" + (f"#{t.index}" if t.index else "") for t in inputs)
    lines.append(f"> %{label(layer)}: ? = {format_call(layer, args)}")
    return lines


def infer_outputs(layer, specs: tuple[TensorSpec, ...], name: str,
                  source: SourceInfo | None, context: Any = ()) -> tuple[TensorSpec, ...]:
    """``layer.infer(specs)``, with any failure turned into an error naming the layer.

    ``context``: printed lines around the node, or a function making them (called
    only on failure)."""
    # The message parts are built only on failure: this runs once per node per pass.
    got = lambda: ", ".join(str(s) for s in specs) or "no inputs"  # noqa: E731
    lines = lambda: context() if callable(context) else context  # noqa: E731
    try:
        outputs = tuple(layer.infer(specs))
    except MlaxGraphError as e:
        # The op's own short error becomes the full one; its chain would only repeat it.
        raise type(e)(node_message(name, layer.op_name, e.problem, got=got(),
                                   expected=e.expected, source=source, context=lines())) from None
    except Exception as e:  # shape inference of user functions (ops.F) may raise anything
        raise ShapeError(node_message(name, layer.op_name, f"shape inference failed: {e}",
                                      got=got(), source=source, context=lines())) from e
    if not outputs or not all(isinstance(s, TensorSpec) for s in outputs):
        raise GraphError(node_message(name, layer.op_name,
                                      f"infer() must return a tuple of TensorSpec, got {outputs!r}",
                                      got=got(), source=source, context=lines()))
    return outputs


def weight_shapes(layer, specs: tuple[TensorSpec, ...]) -> dict:
    """Path -> shape of every weight (``state/`` paths for non-trainables) the layer
    needs for inputs of these specs."""
    shapes = {k: v.shape for k, v in flatten_specs(layer.param_specs(specs))}
    shapes.update({"state/" + k: v.shape for k, v in flatten_specs(layer.state_specs(specs))})
    return shapes


def check_shared_weights(layer, specs: tuple[TensorSpec, ...], source: SourceInfo | None) -> None:
    """A layer object called again must get inputs that fit the weights of its first call.

    The first call only records its input specs; weight shapes are compared when (and
    if) the layer is called again, so unshared layers pay nothing for the check.
    """
    first = layer.__dict__.get("_first_call")
    if first is None:
        object.__setattr__(layer, "_first_call", specs)
        return
    if first == specs:
        return
    want, shapes = weight_shapes(layer, first), weight_shapes(layer, specs)
    if want != shapes:
        raise ShapeError(node_message(
            label(layer), layer.op_name,
            "this layer object is called again (sharing its weights), but its inputs need "
            "weights of other shapes; use a new layer object for unshared weights",
            got=", ".join(str(s) for s in specs) + f" (weights {shapes})",
            expected=", ".join(str(s) for s in first) + f" (weights {want})",
            source=source))


def _as_tensors(value: Any, what: str, empty: bool = False) -> tuple[SymbolicTensor, ...]:
    items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not items and not empty:
        raise GraphError(f"a graph needs at least one {what[:-1]}")
    for item in items:
        if not isinstance(item, SymbolicTensor):
            raise GraphError(f"graph {what} must be symbolic tensors, got {type(item).__name__}")
    return items


def trace_graph(inputs: Any, outputs: Any):
    """Walks back from ``outputs`` to ``inputs``; returns (nodes, input names, output values)."""
    from .graph import InputLayer  # lazy: graph.py, where the Input op lives, imports this module

    in_tensors = _as_tensors(inputs, "inputs", empty=True)
    out_tensors = _as_tensors(outputs, "outputs")
    input_calls: list[Call] = []
    for t in in_tensors:
        if not isinstance(t.call.layer, InputLayer):
            raise GraphError(f"graph inputs must come from mg.Input, got {t!r}")
        if t.call in input_calls:
            raise GraphError(f"input {t.call.label!r} is listed twice in the graph inputs")
        input_calls.append(t.call)

    reached: dict[int, Call] = {}
    stack = [t.call for t in out_tensors]
    while stack:
        call = stack.pop()
        if id(call) in reached:
            continue
        reached[id(call)] = call
        if isinstance(call.layer, InputLayer) and call not in input_calls:
            where = f" (created at {call.source})" if call.source else ""
            raise GraphError(f"the outputs depend on input {call.label!r}{where}, which is not "
                             f"in the graph's inputs; add it to inputs=[...]")
        stack.extend(t.call for t in call.inputs)
    for call in input_calls:
        reached.setdefault(id(call), call)
    calls = sorted(reached.values(), key=lambda c: c.order)

    layer_names = _allocate_names(calls)
    node_names: dict[int, str] = {}
    used = set(layer_names.values())
    seen_layers: dict[int, int] = {}
    nodes: list[Node] = []
    for call in calls:
        layer_name = layer_names[id(call.layer)]
        count = seen_layers.get(id(call.layer), 0)
        seen_layers[id(call.layer)] = count + 1
        name = layer_name
        if count:
            name = f"{layer_name}@{count}"
            while name in used:
                count += 1
                name = f"{layer_name}@{count}"
            used.add(name)
        node_names[id(call)] = name
        nodes.append(Node(
            name=name, op=call.layer,
            inputs=tuple(Value(node_names[id(t.call)], t.index) for t in call.inputs),
            outputs=call.outputs, layer=layer_name, source=call.source))
    input_names = tuple(node_names[id(c)] for c in input_calls)
    output_values = tuple(Value(node_names[id(t.call)], t.index) for t in out_tensors)
    return tuple(nodes), input_names, output_values


def _allocate_names(calls: Sequence[Call]) -> dict[int, str]:
    """Layer object id -> unique name: user names first, then ``op``, ``op_1``, ..."""
    names: dict[int, str] = {}
    owners: dict[str, Call] = {}
    for call in calls:
        explicit = call.layer.name
        if explicit is None or id(call.layer) in names:
            continue
        if explicit in owners:
            other = owners[explicit]
            raise GraphError(
                f"two different layers are named {explicit!r}: op {other.layer.op_name} created "
                f"at {other.source} and op {call.layer.op_name} created at {call.source}; "
                f"give one another name, or call the same layer object twice to share weights")
        owners[explicit] = call
        names[id(call.layer)] = explicit
    used = set(owners)
    counters: dict[str, int] = {}
    for call in calls:
        if id(call.layer) in names:
            continue
        # A default name comes from an op or a graph's name, which may hold what layer
        # names cannot ('/' joins a path's names, '#' numbers outputs).
        base = call.layer.default_name.replace("/", "_").replace("#", "_")
        n = counters.get(base, 0)
        candidate = base if n == 0 else f"{base}_{n}"
        while candidate in used:
            n += 1
            candidate = f"{base}_{n}"
        counters[base] = n + 1
        used.add(candidate)
        names[id(call.layer)] = candidate
    return names
