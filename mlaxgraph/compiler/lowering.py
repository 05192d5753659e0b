"""Lowering: a Program becomes a pure ``init(key)`` and a pure ``apply(params, state,
*inputs, rng=None, inference_mode=False)``, both through the one interpreter's
conventions (weights by path, keys by name). A sharding plan, when given, is data for
the same functions: the weights, inputs, activations and new state are constrained to
its shardings where they are made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import CheckError, DTypeError, GraphError, ShapeError, node_message
from ..core.specs import TensorSpec, flatten_specs, match_shape
from .interpreter import run
from .keys import block_keys, chain_keys, step_key
from .program import Program, ScanStep, set_in
from .taps import Taps

if TYPE_CHECKING:
    from ..distributed.plan import ShardingPlan

__all__ = ["make_init", "make_apply", "checked", "check_inputs"]


def make_init(program: Program, param_dtype: Any, sharding: ShardingPlan | None = None,
              only: frozenset[str] | None = None) -> Callable[[jax.Array], tuple[dict, dict]]:
    """A pure ``init(key) -> (params, state)``: each weight from its own key, derived
    from ``key`` by the names of its layer's path and its own (so adding a layer does
    not change the others' initial values). With ``only`` (weight paths, state
    entries under ``state/``), those weights alone, the values ``init`` gives them.

    Weights of one shape and initializer are drawn together, in one loop over their
    keys (the same values as one call each), and a scan's blocks in one call vmapped
    over the blocks: what XLA compiles grows with the kinds of weights, not
    with their number."""

    def init(key: jax.Array) -> tuple[dict, dict]:
        params, state = _init_program(program, key, np.dtype(param_dtype), only)
        if sharding is not None:
            params, state = sharding.constrain_weights(params, state)
        return params, state

    return init


def _within(only: frozenset[str] | None, weights: tuple[str, ...]) -> frozenset[str] | None:
    """The paths of ``only`` under layer (or scan) ``weights``, relative to it."""
    if only is None:
        return None
    inside: set[str] = set()
    for prefix, mark in (("/".join(weights) + "/", ""), ("state/" + "/".join(weights) + "/", "state/")):
        inside.update(mark + path[len(prefix):] for path in only if path.startswith(prefix))
    return frozenset(inside)


def _init_program(program: Program, key: jax.Array, param_dtype: np.dtype,
                  only: frozenset[str] | None = None) -> tuple[dict, dict]:
    # (tree, step weights, weight path, the name its key folds in, spec) of every weight, then
    # drawn by groups of one initializer and shape.
    leaves = []
    trees: dict[str, dict] = {"params": {}, "state": {}}
    for step in program.owners():
        if isinstance(step, ScanStep):
            inside = _within(only, step.weights)
            if inside is not None and not inside:
                continue
            base = step_key(key, step.weights[:-1])
            p, s = jax.vmap(lambda one, body=step.body, inside=inside:
                            _init_program(body, one, param_dtype, inside))(
                block_keys(base, step.blocks))
            if p:
                trees["params"] = set_in(trees["params"], step.weights, p)
            if s:
                trees["state"] = set_in(trees["state"], step.weights, s)
            continue
        for which, specs, prefix in (("params", step.param_specs, ""),
                                     ("state", step.state_specs, "state/")):
            for path, spec in flatten_specs(specs):
                if only is not None and prefix + "/".join(step.weights + (path,)) not in only:
                    continue
                leaves.append((which, step.weights, path, prefix + path, spec))
                # The tree's order is the layers' (the values come by groups).
                trees[which] = set_in(trees[which], step.weights + tuple(path.split("/")), None)
    # Every weight's key: ``key`` folded with its layer path's names and its own; the
    # chains of one length folded in one vmapped call.
    chains: dict[int, list[tuple[str, ...]]] = {}
    where: list[tuple[int, int]] = []  # per leaf: (chain length, its row)
    for _, weights, _, salted, _ in leaves:
        rows = chains.setdefault(len(weights) + 1, [])
        where.append((len(weights) + 1, len(rows)))
        rows.append(weights + (salted,))
    keys = {length: chain_keys(key, rows) for length, rows in chains.items()}
    groups: dict = {}
    for index, leaf in enumerate(leaves):
        spec = leaf[4]
        groups.setdefault((spec.init, tuple(spec.shape), spec.stored_dtype(param_dtype)),
                          []).append(index)
    for (initializer, shape, dtype), members in groups.items():
        if getattr(initializer, "keyless", False):  # a constant: nothing to draw
            for index in members:
                which, weights, path, _, _ = leaves[index]
                trees[which] = set_in(trees[which], weights + tuple(path.split("/")),
                                      initializer(None, shape, dtype))
            continue
        lengths = {where[i][0] for i in members}
        member_keys = (keys[lengths.pop()][jnp.asarray([where[i][1] for i in members])]
                       if len(lengths) == 1 else
                       jnp.stack([keys[length][row] for length, row in (where[i] for i in members)]))
        if len(members) == 1:
            values = initializer(member_keys[0], shape, dtype)[None]
        else:
            # A loop over the keys, not vmap: XLA would fuse a vmapped draw into each
            # member's slice, compiling one copy of the initializer per weight.
            values = jax.lax.map(lambda k, init=initializer, shape=shape, dtype=dtype:
                                 init(k, shape, dtype),
                                 member_keys)
        for i, index in enumerate(members):
            which, weights, path, _, _ = leaves[index]
            trees[which] = set_in(trees[which], weights + tuple(path.split("/")), values[i])
    return trees["params"], trees["state"]


def make_apply(program: Program, sharding: ShardingPlan | None = None,
               checks: bool = False, taps: Taps | None = None) -> Callable:
    """A pure ``apply(params, state, *inputs, rng=None, inference_mode=False)``
    returning ``(outputs, new_state)``: one array for one graph output, else a tuple.
    With ``checks``, each step adds ``jax.experimental.checkify`` checks (ids in range,
    no NaN or inf), to be functionalized by ``checkify.checkify`` (``checked``). With
    ``taps``, it captures and intervenes (``mlaxgraph.compiler.taps``) and returns
    ``(outputs, new_state, captured)``."""
    graph = program.graph
    randoms = program.random_paths()
    specs = graph.input_specs
    single = len(graph.outputs) == 1
    hook = None if sharding is None else sharding.constrain

    def apply(params, state, *inputs, rng=None, inference_mode: bool = False):
        if not isinstance(state, dict) and hasattr(state, "shape") and len(inputs) == len(specs) - 1:
            raise GraphError(
                f"graph {graph.name!r}: apply takes (params, state, *inputs) and state is "
                f"missing: pass the state that init returned ({{}} for a graph without "
                f"state), e.g. out, state = model.apply(params, state, x)")
        if not isinstance(inference_mode, bool):  # "False" is true; 1 compiles again
            raise GraphError(f"graph {graph.name!r}: apply's inference_mode is True or False, "
                             f"got {inference_mode!r}")
        bindings = check_inputs(graph, specs, inputs)
        if randoms and not inference_mode and rng is None:
            raise GraphError(f"graph {graph.name!r} has random layers ({', '.join(randoms)}): "
                             f"pass rng=jax.random.key(...) to apply, or inference_mode=True")
        if sharding is not None:
            params, state = sharding.constrain_weights(params, state)
        result: Any = run(program, params, state, inputs, rng=rng, inference_mode=inference_mode,
                          bindings=bindings, hook=hook, checks=checks, taps=taps)
        outputs, new_state = result[0], result[1]
        if sharding is not None:
            new_state = sharding.constrain_weights(None, new_state)[1]
        if taps is not None:
            return (outputs[0] if single else outputs), new_state, result[2]
        return (outputs[0] if single else outputs), new_state

    return apply


def checked(apply: Callable) -> Callable:
    """``apply`` (made with ``checks=True``) functionalized by ``checkify``, jitted, and
    raising ``CheckError`` naming the first failed check's layer."""
    from jax.experimental import checkify

    run_checked = jax.jit(checkify.checkify(apply, errors=checkify.user_checks),
                          static_argnames=("inference_mode",))

    def apply_checked(params, state, *inputs, rng=None, inference_mode: bool = False, **more):
        error, result = run_checked(params, state, *inputs, rng=rng, inference_mode=inference_mode,
                                    **more)
        message = error.get()
        if message is not None:
            # checkify appends where the check was traced; the message names the layer.
            raise CheckError(re.sub(r" \(`?check`? failed.*$", "", message.split("\n")[0]))
        return result

    return apply_checked


def _fixed_batch_hint(dims: tuple, shape: tuple, graph) -> str:
    """When the array looks like a batch of what the input describes, or like it with
    another first dim, the input was built with its first dim fixed (``mg.Input((28,
    28, 1))`` in Keras's habit): say so, with the symbolic form to write instead (for
    a graph ``mg.from_torch`` made, marked by its ``aten.mode`` node, the
    ``dynamic_shapes`` to export with)."""
    if dims and shape[1:] == tuple(dims) and len(shape) == len(dims) + 1:
        symbolic = ("batch", *dims)
    elif (dims and isinstance(dims[0], int) and len(shape) == len(dims)
          and shape[1:] == tuple(dims[1:]) and shape[0] != dims[0]):
        symbolic = ("batch", *dims[1:])
    else:
        return ""
    if any(node.op.op_name == "aten.mode" for node in graph.nodes):
        return (f". The graph's first dim is fixed: mg.from_torch gives an input the example's "
                f"shape {tuple(dims)} unless dynamic_shapes says otherwise. For any batch size "
                f"export it with a batched example and a symbolic batch dim: mg.from_torch("
                f"module, example_args, dynamic_shapes=({{0: torch.export.Dim(\"batch\")}},)) "
                f"(one dict per input, as torch.export's)")
    form = "(" + ", ".join(f'"{d}"' if isinstance(d, str) else str(d) for d in symbolic) + ")"
    return (f". The graph's first dim is fixed: mg.Input({tuple(dims)}) makes an input of "
            f"exactly that shape, whose first dim {dims[0]} is the batch size (unlike "
            f"Keras, the shape includes the batch dim). For any batch size write the "
            f"batch dim symbolically: mg.Input({form})")


def _layout_hint(dims: Sequence[Any], shape: tuple) -> str:
    """A hint when ``shape`` is the input's shape with its channels on the other side
    (an NCHW image given to an NHWC input, or the reverse)."""
    inner = list(dims[1:])
    if len(dims) < 3 or len(shape) != len(dims) or not all(isinstance(d, int) for d in inner):
        return ""
    rank, got = len(dims), list(shape[1:])
    if got == inner == inner[::-1]:
        return ""
    if rank == 3 and got == inner[::-1]:  # NCW and NWC: one swap either way
        return (". It is the input's shape with the channels on the other side (first "
                "against last): jnp.transpose(x, (0, 2, 1))")
    if got == inner[-1:] + inner[:-1]:
        return (f". It is the input's shape with the channels first: the graph takes them "
                f"last; jnp.transpose(x, {(0, *range(2, rank), 1)})")
    if got == inner[1:] + inner[:1]:
        return (f". It is the input's shape with the channels last: the graph takes them "
                f"first; jnp.transpose(x, {(0, rank - 1, *range(1, rank - 1))})")
    return ""


def check_inputs(graph, specs: Sequence[TensorSpec], inputs: Sequence[Any]) -> dict | None:
    """Checks the arrays given to ``apply`` against the graph's inputs; returns the
    values of the symbolic dims by name (ints, or symbolic dims when the arrays
    themselves are symbolic, as under ``jax.export``)."""
    if len(inputs) != len(specs):
        names = ", ".join(f"{n}: {s}" for n, s in zip(graph.inputs, specs))
        raise ShapeError(f"graph {graph.name!r} takes {len(specs)} inputs ({names}), "
                         f"got {len(inputs)}")
    bindings: dict[str, Any] = {}
    for name, spec, x in zip(graph.inputs, specs, inputs):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        got = f"{dtype}{list(shape) if shape is not None else ''}"
        node = graph.node(name)
        if shape is None or dtype is None:  # a list, a scalar: as jax.numpy, no conversion
            raise ShapeError(node_message(name, "input", f"apply takes arrays (JAX's or NumPy's), "
                                          f"got a {type(x).__name__}: pass jnp.asarray(x)",
                                          got=type(x).__name__, expected=str(spec),
                                          source=node.source))
        if not match_shape(spec.shape, shape, bindings):
            raise ShapeError(node_message(name, "input", "apply got an array of another shape"
                                          + _fixed_batch_hint(spec.shape, tuple(shape), graph)
                                          + _layout_hint(spec.shape, tuple(shape)),
                                          got=got, expected=str(spec), source=node.source))
        if np.dtype(dtype) != spec.dtype:
            raise DTypeError(node_message(name, "input", "apply got an array of another dtype "
                                          "(cast it, or build the Input with this dtype)",
                                          got=got, expected=str(spec), source=node.source))
    return bindings
