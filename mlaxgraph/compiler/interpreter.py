"""The interpreter: runs a Program's steps, in the manner of ``jax.core.eval_jaxpr``.

It reads each step's arguments from an environment of refs and writes its outputs
back, each layer under its named scope (its path, so HLO metadata names it), with its
rng derived from the apply key by the names of its path, and its weights read from
``params``/``state`` by their path and checked against what the layer declares. A
per-step hook (the sharding plan's constraints) sees the graph's inputs and every
step's outputs. It runs only while JAX traces: its Python cost is paid once per
compilation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, GraphError, MlaxGraphError, ShapeError, node_message
from ..core.scopes import scope_name
from ..core.specs import bind_dims, is_symbolic, match_shape
from ..ir.printer import context_lines
from .indexed import indexed_apply, per_block_layers
from .keys import block_keys, step_key
from .program import Checkpoint, Program, Ref, ScanStep, Scheduled, Step, set_in
from .taps import TapPlan, Taps, plan_taps
from .weights import check_weights, per_block_weights, read_weights, without_layers

__all__ = ["run", "walk", "check_weights", "step_key", "Hook", "Taps", "STEP_RULES", "StepRule", "Wrapper"]

#: ``hook(path, values) -> values``: sees a graph input (path: its name) or a step's
#: outputs, inside the step's named scope.
Hook = Callable[[str, tuple], tuple]

def _check_outputs(step: Step, outputs: tuple, bindings: Mapping[str, int] | None) -> None:
    """An op's apply must produce what its infer promised: the dtype guarantee holds."""
    node = step.node
    if len(outputs) != len(step.output_specs):
        raise GraphError(node_message(step.path, node.op.op_name,
                                      f"apply returned {len(outputs)} outputs, infer promised "
                                      f"{len(step.output_specs)}", source=node.source))
    for out, spec in zip(outputs, step.output_specs):
        if np.dtype(out.dtype) != spec.dtype:
            raise DTypeError(node_message(step.path, node.op.op_name,
                                          "apply produced another dtype than infer promised",
                                          got=str(out.dtype), expected=str(spec.dtype),
                                          source=node.source,
                                          context=context_lines(step.graph, node.name)))
        if bindings is None or any(is_symbolic(v) for v in bindings.values()):
            continue
        try:
            want = bind_dims(spec.shape, bindings)
        except ShapeError:
            continue
        if tuple(out.shape) != want:
            raise ShapeError(node_message(step.path, node.op.op_name,
                                          "apply produced another shape than infer promised",
                                          got=str(tuple(out.shape)), expected=str(want),
                                          source=node.source,
                                          context=context_lines(step.graph, node.name)))


def _check_window(step: Step, args: list, bindings: Mapping[str, int] | None) -> None:
    """A ``ShapeError`` when a windowed layer's input, its symbolic dims bound in this
    call, is smaller than its window: an output dim below 1, which JAX would compute as
    an empty array (a convolution) or fail on (pooling's slices)."""
    if bindings is None or any(is_symbolic(v) for v in bindings.values()):
        return
    for spec in step.output_specs:
        formulas = [i for i, d in enumerate(spec.shape) if is_symbolic(d) and not str(d).isidentifier()]
        if formulas and min((want := bind_dims(spec.shape, bindings))[i] for i in formulas) < 1:
            given = ", ".join(str(tuple(a.shape)) for a in args)
            raise ShapeError(node_message(
                step.path, step.node.op.op_name, f"its input {given} is too small for its window: "
                f"the output would be {want}", got=given, expected=f"an output of {spec}",
                source=step.node.source))


def _user_code_failed(step: Step, args: list, error: Exception) -> None:
    """A ``ShapeError`` naming the layer when a user's function (``ops.F``) fails on the
    call's arrays although its shapes were inferred: JAX checks symbolic dims only in
    part (``reshape((batch, 3))`` of ``(batch, 8)`` passes), so the values show it."""
    op = step.node.op
    if not op.user_code or isinstance(error, MlaxGraphError):
        return
    given = ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in args)
    raise ShapeError(node_message(
        step.path, op.op_name, f"its function failed on the call's inputs ({given}): {error} "
        f"(its output shapes were inferred with symbolic dims, which JAX checks only in "
        f"part)", source=step.node.source)) from error


def _run_scan(step: ScanStep, params: Any, state: Any, args: list, key: jax.Array | None,
              context: _Context, per_block: Mapping[tuple[str, ...], tuple]) -> tuple[tuple, Any]:
    """A run of equal blocks: ``lax.scan`` of one block's program over the blocks'
    stacked weights (and, in training, one key per block: the key the block would
    have had, ``key`` folded with its name). Captures inside the run come out as the
    scan's per-block outputs; interventions select their blocks by the block index."""
    body = step.body
    assert body is not None  # a ScanStep has one
    keys = None if key is None else block_keys(key, step.blocks)
    x, *shared = args  # further inputs: the same for every block
    bindings = _bindings(body, x)
    plan = context.plan.body(step) if context.plan is not None else None
    inner = dataclasses.replace(context, bindings=bindings, hook=None, plan=plan,
                                wrappers=_wrappers(context.checks, plan, None, context.extra),
                                per_block=per_block)

    def one_block(carry, xs):
        p, s, k, index = xs
        block = dataclasses.replace(inner, params=p, rng=k, index=index)
        env, new_state = _run(body, s, (carry, *shared), block)
        captured = {} if plan is None else {ref: env[ref] for ref in plan.wanted}
        return env[body.outputs[0]], (new_state, captured)

    if step.remat is not None:  # each block recomputed in the backward pass
        one_block = jax.checkpoint(one_block, policy=REMAT_POLICIES[step.remat], prevent_cse=False)

    # Every block's scope is the body's: jax.named_scope inside the scan names the
    # body's layers (``b0..b31/attention``) in the jaxpr and the HLO.
    indices = jnp.arange(len(step.blocks))
    out, (new_state, captured) = jax.lax.scan(one_block, x, (params, state, keys, indices))
    if plan is not None:
        context.scans[step.path] = captured
    return (out,), new_state


def _bindings(program: Program, x: Any) -> dict | None:
    bindings: dict = {}
    if not match_shape(program.input_specs[0].shape, x.shape, bindings):
        return None
    return bindings


def _runtime_checks(step: Step, args: Sequence[Any], outs: tuple) -> None:
    """``checkify`` checks of the step: the op's own (an id range), then NaN and inf in
    each float output, each message naming the layer's path and op."""
    from jax.experimental import checkify

    where = f"layer {step.path!r} (op {step.node.op.op_name})"
    for ok, what in step.op.runtime_checks(args):
        checkify.check(ok, f"{where}: {what}")
    for i, out in enumerate(outs):
        if jax.numpy.issubdtype(out.dtype, jax.numpy.inexact):
            checkify.check(~jax.numpy.any(jax.numpy.isnan(out)), f"{where}: output {i} has NaN")
            checkify.check(~jax.numpy.any(jax.numpy.isinf(out)), f"{where}: output {i} has inf")


def run(program: Program, params: Any, state: Any, inputs: Sequence[Any], *,
        rng: jax.Array | None, inference_mode: bool, bindings: Mapping[str, int] | None,
        hook: Hook | None = None, checks: bool = False, taps: Taps | None = None,
        wrappers: Sequence[Wrapper] = ()) -> tuple[tuple, dict] | tuple[tuple, dict, dict]:
    """Runs the program: ``(outputs, new_state)``, and ``captured`` third with ``taps``.

    Args:
      program: the flattened graph.
      params: the trainable weights, as ``init`` made them.
      state: the non-trainable weights, as ``init`` made them.
      inputs: one array per graph input.
      rng: the apply key (None: no step may need one).
      inference_mode: passed to every layer.
      bindings: the values of the symbolic dims by name, or None: ops whose
        hyperparameters hold symbolic dims are bound to them, and when they are ints,
        output shapes are checked against them.
      hook: sees the inputs and every step's outputs (see ``Hook``).
      checks: add ``checkify`` checks to every step (see ``_runtime_checks``); the
        caller functionalizes them with ``checkify.checkify``. Off, nothing is traced.
      taps: what to capture and where to intervene (``mlaxgraph.compiler.taps``);
        the captured outputs come back by concrete path.
      wrappers: the caller's own ``Wrapper``s of every step's outputs (after the
        checks and taps, before the sharding constraints).
    """
    plan = plan_taps(program, taps) if taps is not None else None
    context = _Context(params, rng, inference_mode, bindings, hook, checks, plan,
                       _wrappers(checks, plan, hook, tuple(wrappers)), tuple(wrappers))
    env, new_state = _run(program, state, inputs, context)
    outputs = tuple(env[ref] for ref in program.outputs)
    if plan is None:
        return outputs, dict(new_state)
    return outputs, dict(new_state), plan.collect(env, context.scans)


def walk(program: Program, inputs: Sequence[Any], rule: Callable[[Step, list], Sequence[Any]]) -> dict:
    """An abstract run of the program: the environment (ref -> value) after giving
    each step, in the schedule's order (a checkpoint region's steps in turn, a scan as
    one step), the values of its inputs and keeping what ``rule(step, args)`` returns
    for its outputs. The logical axes of activations are such a run
    (``mlaxgraph.distributed.activations``); ``run`` is the concrete one.

    Example:
      >>> from mlaxgraph.compiler.flatten import flatten
      >>> from mlaxgraph.examples import mlp
      >>> program = flatten(mlp(4, (8,), 3))
      >>> env = walk(program, ["x"], lambda step, args: [f"{step.path}({', '.join(args)})"])
      >>> env[program.outputs[0]]
      'logits(relu(dense(x)))'
    """
    env: dict = {(name, 0): x for name, x in zip(program.inputs, inputs)}
    for unit in program.schedule:
        for step in unit.steps if isinstance(unit, Checkpoint) else (unit,):
            outs = tuple(rule(step, [env[ref] for ref in step.inputs]))
            env.update(zip(step.outputs, outs))
    return env


def _run(program: Program, state: Any, inputs: Sequence[Any], context: _Context) -> tuple[dict, Any]:
    """The environment of every value the program made (ref -> array) and the new state:
    each unit of the program's schedule run by its rule in ``STEP_RULES``."""
    env: dict = {}
    hook = context.hook
    for name, x in zip(program.inputs, inputs):
        env[(name, 0)] = hook(name, (x,))[0] if hook is not None else x
    new_state = state
    for index, unit in enumerate(program.schedule):
        new_state = STEP_RULES[type(unit)](unit, env, new_state, context, program, index)
    return env, new_state


@dataclasses.dataclass(frozen=True)
class _Context:
    params: Any
    rng: jax.Array | None
    inference_mode: bool
    bindings: Mapping[str, int] | None
    hook: Hook | None
    checks: bool = False
    plan: TapPlan | None = None
    #: wrappers of every step's outputs, in order (``Wrapper``): checks, taps, sharding
    wrappers: tuple[Wrapper, ...] = ()
    #: the caller's own wrappers (``run(wrappers=...)``), kept for scan bodies
    extra: tuple[Wrapper, ...] = ()
    #: inside a scan's body, the index of the block being run (a traced int)
    index: Any = None
    #: a scan's path -> what its blocks captured (ref -> stacked arrays)
    scans: dict = dataclasses.field(default_factory=dict)
    #: inside a scan's body, the layers whose weights are given per block: weights path
    #: -> one weight tree per block (``mlaxgraph.compiler.indexed``)
    per_block: Mapping[tuple[str, ...], tuple] = dataclasses.field(default_factory=dict)


#: ``wrapper(step, args, outs, context) -> outs``: sees (and may replace) each step's
#: outputs, inside its named scope; the override point for what surrounds every layer.
Wrapper = Callable[[Step, list, tuple, "_Context"], tuple]

#: ``rule(unit, env, state, context, program, index) -> new state``: runs one unit of a
#: program's schedule, reading its arguments from ``env`` and writing its outputs there.
StepRule = Callable[[Any, dict, Any, "_Context", Program, int], Any]


def _check_wrapper(step: Step, args: list, outs: tuple, context: _Context) -> tuple:
    _runtime_checks(step, args, outs)
    return outs


def _tap_wrapper(step: Step, args: list, outs: tuple, context: _Context) -> tuple:
    assert context.plan is not None
    return context.plan.intervene(step, outs, context.index)


def _hook_wrapper(step: Step, args: list, outs: tuple, context: _Context) -> tuple:
    assert context.hook is not None
    return context.hook(step.path, outs)


def _wrappers(checks: bool, plan: TapPlan | None, hook: Hook | None,
              extra: tuple[Wrapper, ...] = ()) -> tuple[Wrapper, ...]:
    """The wrappers of a run: run-time checks, then taps, then the caller's, then the
    sharding constraints (last: they place what the others made)."""
    wrappers: list[Wrapper] = []
    if checks:
        wrappers.append(_check_wrapper)
    if plan is not None and plan.interventions:
        wrappers.append(_tap_wrapper)
    wrappers.extend(extra)
    if hook is not None:
        wrappers.append(_hook_wrapper)
    return tuple(wrappers)


def _run_step(step: Step, env: dict, state: Any, context: _Context,
              program: Program | None = None, index: int = 0) -> Any:
    """The rule of a layer step and of a scan step: weights read and checked, the key
    derived, the op (or the scan) run in the step's named scope, its outputs checked
    against its specs and passed through the wrappers."""
    args = [env[ref] for ref in step.inputs]
    blocks = context.per_block.get(step.weights)
    per_block: Mapping[tuple[str, ...], tuple] = {}
    p: Any
    if blocks is not None:
        p = per_block_weights(step, blocks)
    elif isinstance(step, ScanStep) and (per_block := per_block_layers(step, context.params)):
        p = read_weights(without_layers(step, per_block), context.params, "params")
    else:
        p = read_weights(step, context.params, "params", state)
    s = read_weights(step, state, "state", context.params)
    rng = context.rng
    with jax.named_scope(scope_name(step.path)):
        key = step_key(rng, step.rng_path) if step.random and rng is not None else None
        if isinstance(step, ScanStep):
            outs, s2 = _run_scan(step, p, s, args, key, context, per_block)
        else:
            op = step.op
            if op.symbolic_fields and context.bindings is not None:
                try:
                    op = op.bind(step.dims).bind(context.bindings)
                except MlaxGraphError as e:  # a bound dim the layer refuses (Arange's limit)
                    raise type(e)(node_message(step.path, op.op_name, e.problem, expected=e.expected,
                                               source=step.node.source)) from None
            if op.windowed:
                _check_window(step, args, context.bindings)
            if blocks is None:
                try:
                    outs, s2 = op.apply(p, s, args, rng=key, inference_mode=context.inference_mode)
                except (TypeError, ValueError) as e:
                    _user_code_failed(step, args, e)
                    raise
            else:  # a scanned run's layer given per block: nothing sliced or copied
                mode = context.inference_mode
                outs, s2 = indexed_apply(
                    lambda w, xs, k: op.apply(w, {}, xs, rng=k, inference_mode=mode)[0],
                    p, context.index, args, key, f"layer {step.path!r}"), {}
        outs = tuple(outs)
        _check_outputs(step, outs, context.bindings)
        for wrap in context.wrappers:
            outs = wrap(step, args, outs, context)
    if s2:
        state = set_in(state, step.weights, s2)
    for i, out in enumerate(outs):
        env[(step.path, i)] = out
    return state


#: ``remat`` policy name -> what ``jax.checkpoint`` may save (None: nothing).
REMAT_POLICIES: dict[str, Any] = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _run_checkpoint(region: Checkpoint, env: dict, state: Any, context: _Context,
                    program: Program, index: int) -> Any:
    """A checkpoint region's steps as one function under ``jax.checkpoint``: the
    backward pass recomputes what they made inside instead of keeping it, saving only
    what the policy allows. What is captured inside comes out with its results."""
    steps = region.steps
    made = {ref for step in steps for ref in step.outputs}
    reads = [ref for step in steps for ref in step.inputs if ref not in made]
    arguments = list(dict.fromkeys(reads))
    later: set[Ref] = {ref for unit in program.schedule[index + 1:] for ref in _reads(unit)}
    later |= set(program.outputs)
    if context.plan is not None:
        later |= set(context.plan.wanted)
    results = [ref for step in steps for ref in step.outputs if ref in later]

    def group(values, params, state, rng):
        local = dict(zip(arguments, values))
        inner = dataclasses.replace(context, params=params, rng=rng)
        for step in steps:
            state = _run_step(step, local, state, inner)
        return [local[ref] for ref in results], state

    checkpointed = jax.checkpoint(group, policy=REMAT_POLICIES[region.policy])
    outs, state = checkpointed([env[ref] for ref in arguments], context.params, state, context.rng)
    env.update(zip(results, outs))
    return state


def _reads(unit: Scheduled) -> tuple[Ref, ...]:
    if isinstance(unit, Checkpoint):
        return tuple(ref for step in unit.steps for ref in step.inputs)
    return unit.inputs


#: The rule that runs each kind of unit of a schedule. A caller may run a program with
#: other rules (``run(rules=...)``), as torch.fx's Interpreter is subclassed.
STEP_RULES: dict[type, StepRule] = {Step: _run_step, ScanStep: _run_step, Checkpoint: _run_checkpoint}
