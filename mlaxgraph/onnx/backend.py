"""An ``onnx.backend.base.Backend`` running models through ``mg.from_onnx`` and
``mg.compile``, for ONNX's conformance suite (``onnx.backend.test``).

Inputs that set shapes (a ``Reshape``'s shape given as a graph input) are taken as
constants from the first call's values, and the inputs' shapes from the arrays
given, as an ahead-of-time compiler specializes: the graph is typed and compiled
once for those. A sequence input is its tensors, as many inputs as the first call
gives it; a sequence output is given back as a list of arrays, an empty optional
as None. It runs with ``jax_enable_x64`` on, so 64-bit types are computed as
ONNX specifies them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..compiler.compile import compile as compile_graph
from ..core.errors import GraphError
from .protos import require_onnx
from .reader import read_model, static_inputs
from .sequences import regroup

__all__ = ["MlaxGraphBackend", "MlaxGraphRep"]

onnx = require_onnx()
from onnx.backend.base import Backend, BackendRep  # noqa: E402


class MlaxGraphRep(BackendRep):
    """A prepared model: typed and compiled on its first run."""

    def __init__(self, model: Any):
        self.model = model
        initialized = {t.name for t in model.graph.initializer}
        #: the graph inputs a call gives, in order (those without an initializer)
        self.feeds = [v for v in model.graph.input if v.name not in initialized]
        self.compiled: Any = None
        self.fed: list[str] = []
        self.names: set[str] = set()

    def _specialize(self, inputs: list) -> Any:
        from onnx import numpy_helper

        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        initialized = {t.name for t in graph.initializer}
        tensors: list = []  # (value info, array): sequences and optionals as their tensors
        nodes: list = []
        for i, (value, x) in enumerate(zip(self.feeds, inputs)):
            _expand(value, x, tensors, nodes, i)
        nodes.reverse()  # an optional's node after its value's
        needed = static_inputs(_with(model, [v for v, _ in tensors], nodes))
        keep, self.fed = [], []
        for value, array in tensors:
            if value.name in needed:
                graph.initializer.append(numpy_helper.from_array(np.asarray(array), value.name))
                continue
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for d in np.shape(array):
                shape.dim.add().dim_value = int(d)
            keep.append(value)
            self.fed.append(value.name)
        self.names = {v.name for v, _ in tensors}
        inits = [v for v in graph.input if v.name in initialized]
        model = _with(model, inits + keep, nodes)
        graph_, params, state, layout = read_model(model)
        return compile_graph(graph_), params, state, layout

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            inputs = list(inputs.values())
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        with jax.enable_x64(True):
            if self.compiled is None:
                self.compiled = self._specialize(inputs)
            model, params, state, layout = self.compiled
            flat: dict = {}
            for i, (value, x) in enumerate(zip(self.feeds, inputs)):
                for info, array in _expand(value, x, [], [], i):
                    flat[info.name] = array
            if set(flat) != self.names:
                raise GraphError("a sequence input has another length than at the first "
                                 "call, which the model was compiled for")
            values = [np.asarray(flat[name]) for name in self.fed]
            out, _ = model.apply(params, state, *values, inference_mode=True)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(regroup([np.asarray(o) for o in outs], layout))


def _with(model: Any, inputs: list, nodes: list) -> Any:
    """A copy of the model with these graph inputs and these nodes first."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    body = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes + body)
    return out


def _expand(value: Any, x: Any, tensors: list, nodes: list, index: int) -> list:
    """A graph input given ``x`` as tensor inputs: a sequence of ``n`` tensors as ``n``
    inputs gathered by a ``SequenceConstruct`` node, an optional by an ``Optional``
    node (``nodes``, in reverse order)."""
    helper = onnx.helper
    kind = value.type.WhichOneof("value")
    if kind == "sequence_type" and isinstance(x, (list, tuple)):
        element = value.type.sequence_type.elem_type
        if element.WhichOneof("value") != "tensor_type":
            raise GraphError(f"input {index} ({value.name!r}) is a sequence of "
                             f"{element.WhichOneof('value')}; mlaxgraph reads sequences of "
                             f"tensors")
        code = element.tensor_type.elem_type
        names = [f"{value.name}__{k}" for k in range(len(x))]
        nodes.append(helper.make_node("SequenceConstruct", names, [value.name]) if names else
                     helper.make_node("SequenceEmpty", [], [value.name], dtype=code))
        for name, array in zip(names, x):
            tensors.append((helper.make_tensor_value_info(name, code, None), np.asarray(array)))
        return tensors
    if kind == "optional_type":
        if x is None:
            nodes.append(helper.make_node("Optional", [], [value.name]))
            return tensors
        inner = onnx.ValueInfoProto(name=f"{value.name}__value")
        inner.type.CopyFrom(value.type.optional_type.elem_type)
        nodes.append(helper.make_node("Optional", [inner.name], [value.name]))
        return _expand(inner, x, tensors, nodes, index)
    if kind != "tensor_type" or isinstance(x, (list, tuple)) or x is None:
        given = "a sequence" if isinstance(x, (list, tuple)) else ("None" if x is None
                                                                   else "a tensor")
        raise GraphError(f"input {index} ({value.name!r}) is given {given} for an input of "
                         f"type {kind}")
    info = onnx.ValueInfoProto()
    info.CopyFrom(value)
    tensors.append((info, np.asarray(x)))
    return tensors


class MlaxGraphBackend(Backend):
    """ONNX's backend interface over mlaxgraph."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> MlaxGraphRep:
        super().prepare(model, device, **kwargs)
        return MlaxGraphRep(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple:
        raise NotImplementedError("the suite's node cases run as models")
