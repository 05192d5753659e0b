"""An ``onnx.backend.base.Backend`` running models through ``mg.from_onnx`` and
``mg.compile``, for ONNX's conformance suite (``onnx.backend.test``).

Inputs that set shapes (a ``Reshape``'s shape given as a graph input) are taken as
constants from the first call's values, and the inputs' shapes from the arrays
given, as an ahead-of-time compiler specializes: the graph is typed and compiled
once for those. It runs with ``jax_enable_x64`` on, so 64-bit types are computed as
ONNX specifies them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..compiler.compile import compile as compile_graph
from ..core.errors import GraphError
from .protos import require_onnx
from .reader import from_onnx, static_inputs

__all__ = ["MlaxGraphBackend", "MlaxGraphRep"]

onnx = require_onnx()
from onnx.backend.base import Backend, BackendRep  # noqa: E402


class MlaxGraphRep(BackendRep):
    """A prepared model: typed and compiled on its first run."""

    def __init__(self, model: Any):
        self.model = model
        self.compiled: Any = None

    def _specialize(self, inputs: list[np.ndarray]) -> Any:
        from onnx import numpy_helper

        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        initialized = {t.name for t in graph.initializer}
        feeds = [v for v in graph.input if v.name not in initialized]
        needed = static_inputs(model)
        keep = []
        for value, array in zip(feeds, inputs):
            if value.name in needed:
                graph.initializer.append(numpy_helper.from_array(np.asarray(array), value.name))
                continue
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for d in np.shape(array):
                shape.dim.add().dim_value = int(d)
            keep.append(value)
        self.fed = [i for i, v in enumerate(feeds) if v.name not in needed]
        kept = [v.name for v in keep]
        remaining = [v for v in graph.input if v.name in kept or v.name in initialized]
        del graph.input[:]
        graph.input.extend(remaining)
        graph_, params, state = from_onnx(model)
        return compile_graph(graph_), params, state

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            inputs = list(inputs.values())
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        for i, x in enumerate(inputs):
            if isinstance(x, (list, tuple)) or x is None:
                raise GraphError(f"input {i} is a {'sequence' if x is not None else 'None'}; "
                                 f"mlaxgraph runs tensors (ONNX sequences and optionals are "
                                 f"not supported)")
        inputs = [np.asarray(x) for x in inputs]
        with jax.enable_x64(True):
            if self.compiled is None:
                self.compiled = self._specialize(inputs)
            model, params, state = self.compiled
            out, _ = model.apply(params, state, *[inputs[i] for i in self.fed],
                                 inference_mode=True)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o) for o in outs)


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
