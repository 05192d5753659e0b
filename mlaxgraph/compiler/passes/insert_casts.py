"""insert_casts: make a dtype policy explicit as Cast nodes in the graph."""

from __future__ import annotations

import dataclasses

from ...core.specs import dtype_str
from ...ir.graph import Graph, InputLayer
from ...ir.node import Node, Value
from ...ir.rewrite import Rewrite, Rule, rewrite
from ...ops.cast import Cast
from ..policy import Policy

__all__ = ["insert_casts"]


@dataclasses.dataclass(frozen=True)
class _InsertCasts(Rule):
    policy: Policy
    nested_graph: bool = False

    def prepare(self, graph: Graph) -> dict:
        return {}  # (value, dtype) -> its cast: a value is cast at most once per dtype

    def _cast(self, value: Value, dtype, source, rewrite: Rewrite) -> Value:
        spec = rewrite.spec(value)
        # float8 values are quantized ones (a Quantize node's): their dtype is the point;
        # so is its scales' float32 (a half-precision scale of small values is zero).
        producer = rewrite.graph._index.get(value.node)
        if not spec.is_float or spec.dtype == dtype or spec.dtype.itemsize == 1 or (
                producer is not None and getattr(producer.op, "casts_activations", False)):
            return value
        casts = rewrite.data
        key = (value, str(dtype))
        if key not in casts:
            base = f"{value.node}_{dtype_str(dtype)}" if value.index == 0 else \
                f"{value.node}_{value.index}_{dtype_str(dtype)}"
            name = rewrite.fresh(base)
            node = rewrite.emit(Node(name, Cast(dtype, inserted=True), (value,),
                                     (spec.with_dtype(dtype),), name, source))
            casts[key] = node.value()
        return casts[key]

    def _dtype(self, node: Node):
        return self.policy.dtype_for(node.layer, node.op.precision_sensitive)

    def nested(self, node: Node) -> Rule:
        # The block computes in the dtype its inputs were cast to (an override of the
        # block's name makes that its layers' compute dtype).
        dtype = self._dtype(node)
        policy = self.policy if dtype == self.policy.compute_dtype else \
            dataclasses.replace(self.policy, compute_dtype=dtype)
        return _InsertCasts(policy, nested_graph=True)

    def visit(self, node: Node, rewrite: Rewrite):
        op = node.op
        if isinstance(op, InputLayer):
            spec = node.outputs[0]
            if not (self.nested_graph and spec.is_float):
                return None
            # A block's inputs arrive in the compute dtype of its caller.
            dtype = self.policy.compute_dtype
            return node.replace(op=InputLayer(op.shape, dtype, op.axes, name=op.name),
                                outputs=(spec.with_dtype(dtype),))
        if isinstance(op, Cast) and not op.inserted:
            return None
        dtype = self._dtype(node)
        inputs = tuple(self._cast(v, dtype, node.source, rewrite) for v in node.inputs)
        return None if inputs == node.inputs else node.replace(inputs=inputs)

    def results(self, outputs, rewrite: Rewrite):
        if self.nested_graph:
            return outputs
        return tuple(self._cast(v, self.policy.output_dtype, None, rewrite) for v in outputs)


def insert_casts(graph: Graph, policy: Policy) -> Graph:
    """Inserts a Cast node wherever a float tensor reaches a layer in another dtype
    than the one the policy says the layer computes in.

    Requires: a verified graph whose specs are inferred. Ensures: float graph inputs
    are cast to ``policy.compute_dtype``; every layer's float inputs have the dtype
    the policy gives it (float32 for precision-sensitive layers, the override for a
    named layer), so it computes in that dtype (float8 values, which a ``Quantize``
    node makes for the layer reading them, and its float32 scales stay as they are); float outputs have
    ``policy.output_dtype`` (not for a nested block, whose outputs stay as computed).
    A value is cast at most once per dtype. User-written Cast nodes are kept as they
    are; the casts inserted here are marked ``inserted=True``.
    """
    return rewrite(graph, _InsertCasts(policy))
