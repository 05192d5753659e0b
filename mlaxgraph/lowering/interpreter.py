"""Lowering: a Graph becomes a pure ``init(key)`` and a pure ``apply(params, state,
*inputs, rng=None, inference_mode=False)``.

``apply`` is an interpreter in the manner of ``jax.core.eval_jaxpr``: it walks the
nodes in order, reads its arguments from an environment and writes its outputs back.
It runs only while JAX traces, so its Python cost is paid once per compilation.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from ..errors import DTypeError, GraphError, ShapeError, node_message
from ..ir.graph import Block, Graph
from ..ir.node import Node
from ..ir.printer import context_lines
from ..specs import TensorSpec, bind_dims, init_specs, match_shape

__all__ = ["make_init", "make_apply", "random_layers", "salt", "scope_name"]

_EMPTY: Mapping[str, Any] = {}


def scope_name(name: str) -> str:
    """The named scope of a node's operations: its name, with the ``@`` of a shared
    layer's later calls (``dense@1``) written ``#``, since XLA cuts an optimized
    instruction's ``op_name`` at ``@``."""
    return name.replace("@", "#")


def salt(name: str) -> int:
    """A stable 31-bit number for a name, to derive an independent key by ``fold_in``."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def random_layers(graph: Graph, prefix: str = "") -> list[str]:
    """Paths of the nodes that need an rng in training, nested blocks included."""
    found = []
    for node in graph.nodes:
        if isinstance(node.op, Block):
            found += random_layers(node.op.graph, f"{prefix}{node.name}/")
        elif node.op.uses_rng():
            found.append(prefix + node.name)
    return found


@dataclasses.dataclass(frozen=True)
class _Step:
    node: Node
    random: bool
    has_params: bool
    has_state: bool
    inner: "_Program | None"


@dataclasses.dataclass(frozen=True)
class _Program:
    graph: Graph
    steps: tuple[_Step, ...]


def _plan(graph: Graph) -> _Program:
    steps = []
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        specs = graph.input_specs_of(node)
        if isinstance(node.op, Block):
            inner = _plan(node.op.graph)
            steps.append(_Step(node, bool(random_layers(node.op.graph)), True, True, inner))
        else:
            steps.append(_Step(node, node.op.uses_rng(), bool(node.op.param_specs(specs)),
                               bool(node.op.state_specs(specs)), None))
    return _Program(graph, tuple(steps))


def _check_outputs(program: _Program, step: _Step, outputs, bindings) -> None:
    """An op's apply must produce what its infer promised: the dtype guarantee holds."""
    node = step.node
    if len(outputs) != len(node.outputs):
        raise GraphError(node_message(node.name, node.op.op_name,
                                      f"apply returned {len(outputs)} outputs, infer promised "
                                      f"{len(node.outputs)}", source=node.source))
    for out, spec in zip(outputs, node.outputs):
        if np.dtype(out.dtype) != spec.dtype:
            raise DTypeError(node_message(node.name, node.op.op_name,
                                          "apply produced another dtype than infer promised",
                                          got=str(out.dtype), expected=str(spec.dtype),
                                          source=node.source,
                                          context=context_lines(program.graph, node.name)))
        if bindings is not None:
            try:
                want = bind_dims(spec.shape, bindings)
            except ShapeError:
                continue
            if tuple(out.shape) != want:
                raise ShapeError(node_message(node.name, node.op.op_name,
                                              "apply produced another shape than infer promised",
                                              got=str(tuple(out.shape)), expected=str(want),
                                              source=node.source,
                                              context=context_lines(program.graph, node.name)))


def _run(program: _Program, params, state, inputs, rng, inference_mode, bindings,
         constrain=None, prefix: str = ""):
    graph = program.graph
    env: dict[str, tuple] = {name: (x,) for name, x in zip(graph.inputs, inputs)}
    if constrain is not None:
        env = {name: constrain(prefix + name, xs) for name, xs in env.items()}
    new_state = dict(state)
    for step in program.steps:
        node = step.node
        args = [env[v.node][v.index] for v in node.inputs]
        if step.has_params and node.layer not in params and step.inner is None:
            raise GraphError(node_message(node.name, node.op.op_name,
                                          f"params has no entry {node.layer!r}; pass the params "
                                          f"made by this model's init", source=node.source))
        p = params.get(node.layer, _EMPTY)
        s = new_state.get(node.layer, _EMPTY)
        with jax.named_scope(scope_name(node.name)):
            key = jax.random.fold_in(rng, salt(node.name)) if step.random and rng is not None else None
            if step.inner is not None:
                inner = _bind_inputs(step.inner.graph, args) if bindings is not None else None
                outs, s2 = _run(step.inner, p, s, args, key, inference_mode, inner,
                                constrain, f"{prefix}{node.name}/")
            else:
                outs, s2 = node.op.apply(p, s, args, rng=key, inference_mode=inference_mode)
                outs = tuple(outs)
                _check_outputs(program, step, outs, bindings)
            if constrain is not None:
                outs = constrain(prefix + node.name, outs)
        if s2:
            new_state[node.layer] = s2
        env[node.name] = outs
    return tuple(env[v.node][v.index] for v in graph.outputs), new_state


def _bind_inputs(graph: Graph, args) -> dict | None:
    bindings: dict = {}
    for spec, x in zip(graph.input_specs, args):
        if not match_shape(spec.shape, x.shape, bindings):
            return None
    return bindings


def make_init(graph: Graph, param_dtype) -> Callable[[jax.Array], tuple[dict, dict]]:
    """A pure ``init(key) -> (params, state)``: each weight from its own key, derived
    from ``key`` by the layer's and the weight's names (so adding a layer does not
    change the others' initial values)."""

    def init_graph(g: Graph, key):
        params, state = {}, {}
        for node in g.nodes:
            if node.name in g.inputs or node.layer in params or node.layer in state:
                continue
            layer_key = jax.random.fold_in(key, salt(node.layer))
            if isinstance(node.op, Block):
                p, s = init_graph(node.op.graph, layer_key)
            else:
                specs = g.input_specs_of(node)
                p = init_specs(node.op.param_specs(specs), layer_key, param_dtype, salt)
                s = init_specs(node.op.state_specs(specs), layer_key, param_dtype,
                               lambda path: salt("state/" + path))
            if p:
                params[node.layer] = p
            if s:
                state[node.layer] = s
        return params, state

    def init(key: jax.Array) -> tuple[dict, dict]:
        return init_graph(graph, key)

    return init


def make_apply(graph: Graph, constrain: Callable | None = None) -> Callable:
    """A pure ``apply(params, state, *inputs, rng=None, inference_mode=False)``
    returning ``(outputs, new_state)``: one array for one graph output, else a tuple.

    ``constrain(path, values) -> values``, when given, sees the inputs and the outputs
    of every node (``path`` is ``layer`` or ``block/layer``) inside the layer's named
    scope: the sharding plan puts its activation constraints there."""
    program = _plan(graph)
    randoms = random_layers(graph)
    specs = graph.input_specs
    single = len(graph.outputs) == 1

    def apply(params, state, *inputs, rng=None, inference_mode: bool = False):
        bindings = check_inputs(graph, specs, inputs)
        if randoms and not inference_mode and rng is None:
            raise GraphError(f"graph {graph.name!r} has random layers ({', '.join(randoms)}): "
                             f"pass rng=jax.random.key(...) to apply, or inference_mode=True")
        outputs, new_state = _run(program, params, state, inputs, rng, inference_mode, bindings,
                                  constrain)
        return (outputs[0] if single else outputs), new_state

    return apply


def check_inputs(graph: Graph, specs: Sequence[TensorSpec], inputs: Sequence[Any]) -> dict | None:
    """Checks the arrays given to ``apply`` against the graph's inputs; returns the
    values of the symbolic dims (None when the arrays themselves are symbolic)."""
    if len(inputs) != len(specs):
        names = ", ".join(f"{n}: {s}" for n, s in zip(graph.inputs, specs))
        raise ShapeError(f"graph {graph.name!r} takes {len(specs)} inputs ({names}), "
                         f"got {len(inputs)}")
    bindings: dict[str, Any] = {}
    for name, spec, x in zip(graph.inputs, specs, inputs):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        got = f"{dtype}{list(shape) if shape is not None else '?'}"
        node = graph.node(name)
        if shape is None or not match_shape(spec.shape, shape, bindings):
            raise ShapeError(node_message(name, "input", "apply got an array of another shape",
                                          got=got, expected=str(spec), source=node.source))
        if np.dtype(dtype) != spec.dtype:
            raise DTypeError(node_message(name, "input", "apply got an array of another dtype "
                                          "(cast it, or build the Input with this dtype)",
                                          got=got, expected=str(spec), source=node.source))
    if any(not isinstance(v, (int, np.integer)) for v in bindings.values()):
        return None
    return bindings
