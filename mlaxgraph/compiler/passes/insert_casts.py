"""insert_casts: make a dtype policy explicit as Cast nodes in the graph."""

from __future__ import annotations

import dataclasses

from ...core.specs import TensorSpec, dtype_str
from ...ir.builder import infer_outputs
from ...ir.graph import Graph, InputLayer
from ...ir.node import Node, Value
from ...ops.cast import Cast
from ..policy import Policy

__all__ = ["insert_casts"]


def insert_casts(graph: Graph, policy: Policy, *, nested: bool = False) -> Graph:
    """Inserts a Cast node wherever a float tensor reaches a layer in another dtype
    than the one the policy says the layer computes in.

    Requires: a verified graph whose specs are inferred. Ensures: float graph inputs
    are cast to ``policy.compute_dtype``; every layer's float inputs have the dtype
    the policy gives it (float32 for precision-sensitive layers, the override for a
    named layer), so it computes in that dtype; float outputs have
    ``policy.output_dtype`` (not for a nested block, whose outputs stay as computed).
    A value is cast at most once per dtype. User-written Cast nodes are kept as they
    are; the casts inserted here are marked ``inserted=True``.
    """
    names = {n.name for n in graph.nodes}
    recorded = {n.value(i): spec for n in graph.nodes for i, spec in enumerate(n.outputs)}
    specs: dict[Value, TensorSpec] = {}
    casts: dict[tuple[Value, str], Value] = {}
    nodes: list[Node] = []

    def cast(value: Value, dtype, source) -> Value:
        spec = specs[value]
        if not spec.is_float or spec.dtype == dtype:
            return value
        key = (value, str(dtype))
        if key not in casts:
            base = f"{value.node}_{dtype_str(dtype)}" if value.index == 0 else \
                f"{value.node}_{value.index}_{dtype_str(dtype)}"
            name, n = base, 0
            while name in names:
                n += 1
                name = f"{base}_{n}"
            names.add(name)
            op = Cast(dtype, inserted=True)
            node = Node(name, op, (value,), (spec.with_dtype(dtype),), name, source)
            nodes.append(node)
            specs[node.value()] = node.outputs[0]
            casts[key] = node.value()
        return casts[key]

    for node in graph.nodes:
        if node.name in graph.inputs:
            spec = node.outputs[0]
            if nested and spec.is_float:
                # A block's inputs arrive in the compute dtype of its caller.
                input_op = node.op
                assert isinstance(input_op, InputLayer)  # verify: graph inputs are input ops
                node = node.replace(op=type(input_op)(input_op.shape, policy.compute_dtype,
                                                      input_op.axes, name=input_op.name),
                                    outputs=(spec.with_dtype(policy.compute_dtype),))
            nodes.append(node)
            specs[node.value()] = node.outputs[0]
            continue
        op = node.op
        dtype = policy.dtype_for(node.layer, op.precision_sensitive)
        if isinstance(op, Cast) and not op.inserted:
            inputs = node.inputs
        else:
            inputs = tuple(cast(v, dtype, node.source) for v in node.inputs)
        subgraph = op.subgraph()
        if subgraph is not None:
            # The block computes in the dtype its inputs were cast to (an override of
            # the block's name makes that its layers' compute dtype).
            inner = policy if dtype == policy.compute_dtype else dataclasses.replace(policy, compute_dtype=dtype)
            op = op.with_subgraph(insert_casts(subgraph, inner, nested=True))
        unchanged = (op is node.op and inputs == node.inputs
                     and all(specs[v] is recorded[v] for v in inputs))
        if not unchanged:  # a node whose inputs kept their specs keeps its outputs
            in_specs = tuple(specs[v] for v in inputs)
            outputs = infer_outputs(op, in_specs, node.name, node.source)
            node = node.replace(op=op, inputs=inputs, outputs=outputs)
        nodes.append(node)
        for i, spec in enumerate(node.outputs):
            specs[node.value(i)] = spec
    results = graph.outputs
    if not nested:
        results = tuple(cast(v, policy.output_dtype, None) for v in graph.outputs)
    return graph.replace(nodes=tuple(nodes), outputs=results)
