"""Reading a step's weights from ``params`` and ``state``, checked against its specs
(missing, another shape, a dtype the layer does not take), for ``apply`` and the
interpreter; a scanned run's layers given per block (``mlaxgraph.compiler.indexed``)
are read block by block.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..core.errors import DTypeError, GraphError, ShapeError, node_message
from ..core.specs import flatten_specs, is_symbolic
from ..ir.paths import is_adapter
from .program import Program, ScanStep, Step, get_in, has_in, set_in

__all__ = ["read_weights", "check_weights", "per_block_weights", "without_layers",
           "adapter_paths", "refuse_unread_adapters", "refusing_unread_adapters"]

_EMPTY: Mapping[str, Any] = {}


def _holds(tree: Any, step: Step, specs: Any) -> bool:
    """Whether ``tree`` (the other of params and state) holds this layer's weights by
    these names: a swap of the two (a layer with both, BatchNorm, has an entry in each)."""
    return tree is not None and has_in(tree, step.weights) and all(
        has_in(get_in(tree, step.weights), tuple(path.split("/"))) for path, _ in flatten_specs(specs))


def read_weights(step: Step, tree: Any, which: str, other: Any = None) -> Mapping[str, Any]:
    """The step's weights from ``params`` or ``state``, checked against its specs;
    ``other``, the other of the two, names a swap of them."""
    specs = step.param_specs if which == "params" else step.state_specs
    if not specs:
        return _EMPTY
    node = step.node
    try:
        found = get_in(tree, step.weights)
    except (KeyError, TypeError, IndexError):
        hint = (f"; {'state' if which == 'params' else 'params'} has it: params and state are "
                f"swapped (they go in the order init returns them, params first)"
                if _holds(other, step, specs) else _quantized_hint(node)
                or _adapter_hint(step.weights_path))
        raise GraphError(node_message(
            step.path, node.op.op_name,
            f"{which} has no entry {step.weights_path!r}; pass the {which} made by this "
            f"model's init{hint}", source=node.source)) from None
    if which == "params" and isinstance(found, Mapping):  # a misspelt weight is not read
        extra = sorted(set(found) - set(specs))
        if extra and _holds(other, step, specs):
            raise GraphError(node_message(
                step.path, node.op.op_name,
                f"params holds {step.weights_path}/{extra[0]}, a weight of this layer's state, "
                f"and state holds its params: params and state are swapped (they go in the "
                f"order init returns them, params first)", source=node.source))
        if extra:
            near = difflib.get_close_matches(str(extra[0]), list(specs), n=1)
            raise GraphError(node_message(
                step.path, node.op.op_name,
                f"params has a weight {step.weights_path}/{extra[0]} this layer does not have "
                f"(its weights: {', '.join(specs)})" + (f"; did you mean {near[0]!r}?" if near
                                                        else ""), source=node.source))
    for path, spec in flatten_specs(specs):
        try:
            leaf = get_in(found, tuple(path.split("/")))
        except (KeyError, TypeError, IndexError):
            raise GraphError(node_message(
                step.path, node.op.op_name,
                f"{which} has no weight {step.weights_path}/{path}; pass the {which} made by "
                f"this model's init{_quantized_hint(node) or _adapter_hint(path)}",
                source=node.source)) from None
        shape = getattr(leaf, "shape", None)
        if shape is None or (not any(is_symbolic(d) for d in spec.shape)
                             and tuple(shape) != tuple(spec.shape)):
            raise ShapeError(node_message(
                step.path, node.op.op_name,
                f"weight {step.weights_path}/{path} has another shape than the layer needs",
                got=str(tuple(shape)) if shape is not None else type(leaf).__name__,
                expected=str(tuple(spec.shape)), source=node.source))
        if spec.dtype is not None:
            if np.dtype(leaf.dtype) != spec.dtype:
                raise DTypeError(node_message(
                    step.path, node.op.op_name,
                    f"weight {step.weights_path}/{path} is stored in {spec.dtype} by this "
                    f"layer{_quantized_hint(node)}",
                    got=str(leaf.dtype), expected=str(spec.dtype), source=node.source))
        elif not jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
            raise DTypeError(node_message(
                step.path, node.op.op_name,
                f"weight {step.weights_path}/{path} is not floating-point",
                got=str(leaf.dtype), expected="a float dtype (the policy's param_dtype)",
                source=node.source))
    return found


def _quantized_hint(node: Any) -> str:
    """What a quantized layer's missing or float weights call for."""
    if getattr(node.op, "scheme", None) is None and node.op.op_name != "quantize":
        return ""
    return ("; a quantized graph's weights and state come from the float model's: "
            "mg.quantize_weights(qgraph, params, state)")


def _adapter_hint(path: str) -> str:
    """What a LoRA adapter's missing weights call for: the base model's params lack them."""
    if not any(is_adapter(part) for part in path.split("/")):
        return ""
    return ("; an adapted graph's init makes the adapters and keeps the base weights given: "
            "params, state = model.init(key, reuse=(base_params, base_state))")


def adapter_paths(program: Program, prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """Where ``params`` may hold the program's adapters' weights: each adapter layer's
    weight path, and inside a scanned run both under the run's stacked name and under
    each block's (the layouts ``apply`` takes)."""
    out: list[str] = []
    for step in program.owners():
        if isinstance(step, ScanStep):
            runs = (step.weights_path, *step.blocks)
            out += adapter_paths(step.block, tuple(p + r + "/" for p in prefixes for r in runs))
        elif any(is_adapter(part) for part in step.weights):
            out += [p + step.weights_path for p in prefixes]
    return out


def refusing_unread_adapters(program: Program, fn: Any) -> Any:
    """``apply`` refusing params that hold LoRA adapters' weights the graph has no layer
    for (``refuse_unread_adapters``): checked when traced, so a jitted call pays
    nothing."""

    @functools.wraps(fn)  # its name and signature: the HLO module stays jit_apply
    def apply(params, state, *inputs, **keywords):
        refuse_unread_adapters(program, params)
        return fn(params, state, *inputs, **keywords)

    return apply


def refuse_unread_adapters(program: Program, params: Any) -> None:
    """A ``GraphError`` when ``params`` hold LoRA adapters' weights the program has no
    layer for: an adapted model's params given to its base model (or its decoder),
    which would compute without them."""
    needed = set(adapter_paths(program))

    def unread(tree: Any, prefix: str = "") -> list[str]:
        found: list[str] = []
        for key, value in tree.items() if isinstance(tree, Mapping) else ():
            path = prefix + str(key)
            # a block named as an adapter that holds adapter layers (a graph read back
            # from ONNX: the block conv.lora_A holding its param layer) is looked into
            if is_adapter(str(key)) and path not in needed and \
                    not any(n.startswith(path + "/") for n in needed):
                found.append(path)
            elif isinstance(value, Mapping):
                found += unread(value, path + "/")
        return found

    extra = unread(params)
    if extra:
        raise GraphError(
            f"graph {program.graph.name!r}: params hold LoRA adapters' weights "
            f"({', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}) that it has no "
            f"layer for, so it would compute without them: apply them with the adapted "
            f"graph's model (mg.compile(mg.lora(...))), or fold them into the base "
            f"weights: graph, params = mg.merge_lora(adapted, params)")


def per_block_weights(step: Step, blocks: tuple) -> tuple:
    """Each block's weights of a layer given per block, checked against its specs."""
    if step.state_specs:
        raise GraphError(node_message(
            step.path, step.node.op.op_name,
            "params give this layer's weights one block at a time, which is for layers "
            "without state: give them stacked under the run's name (model.stack_weights)",
            source=step.node.source))
    return tuple(read_weights(step, set_in({}, step.weights, tree), "params") for tree in blocks)


def without_layers(scan: ScanStep, per_block: Mapping[tuple[str, ...], tuple]) -> ScanStep:
    """``scan`` with the specs of the layers given per block left out of its stack's."""
    specs: Any = scan.param_specs
    for weights in per_block:
        parent = get_in(specs, weights[:-1]) if weights[:-1] else specs
        parent = {k: v for k, v in parent.items() if k != weights[-1]}
        specs = set_in(specs, weights[:-1], parent) if weights[:-1] else parent
    return dataclasses.replace(scan, param_specs=specs)


def check_weights(program: Program, params: Any, state: Any) -> None:
    """``apply``'s check of each layer's weights (missing, another shape, a dtype the
    layer does not take), made for every layer at once without running anything."""
    for step in program.owners():
        if not isinstance(step, ScanStep):
            read_weights(step, params, "params", state)
            read_weights(step, state, "state", params)
