"""Frozen weights of a scanned run given per block, read in place.

``lax.scan`` over a run's stacked weights slices each block's weights out of the stack
at the loop's index. On CPU, XLA writes that ``dynamic-slice`` into a buffer of its own
before a dot reads it (its dot kernels read dense operands; it neither fuses a dynamic
slice into a dot's operand nor aliases it), so a block's kernels are copied at every
iteration, the copies of one block live together: 28 MB for GPT-2 small's block, 5.7%
of its weights (benchmarks/RESULTS.md, section 7).

A layer of a scanned run may instead have its weights under each block's own name, as
the unscanned model keeps them (``params["h.3"]["mlp.c_fc"]``, beside the run's stacked
``params["h.0..h.11"]``): ``indexed_apply`` then computes it as a ``lax.switch`` over
the blocks, branch ``k`` applying the layer with block ``k``'s own arrays, so nothing
is sliced or copied. Under a ``custom_vjp`` whose residuals are the layer's inputs and
the (loop-invariant) per-block weights, the backward pass switches again for the
inputs' cotangents. Such weights do not train: differentiating them is an error naming
the layer. ``Trainer(trainable=...)`` keeps a scanned run's frozen layers this way
(``unstack_frozen``) on CPU, where the copies are (``PER_BLOCK_BACKENDS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..core.errors import GraphError
from ..core.specs import flatten_specs
from .program import Program, ScanStep, Step, get_in, has_in, set_in

__all__ = ["indexed_apply", "per_block_layers", "unstack_frozen", "MIN_PER_BLOCK_BYTES",
           "PER_BLOCK_OPS", "PER_BLOCK_BACKENDS"]

#: The backends where ``Trainer(trainable=...)`` keeps frozen layers per block. On GPU
#: the stacked layout's step has the same peak (XLA's GPU dots read the slice where it
#: lies) and the switch over the blocks is slower: GPT-2 small's LoRA step per block took
#: 1.26x the stacked step's time on an H100 (benchmarks/RESULTS.md, section 7).
PER_BLOCK_BACKENDS = frozenset({"cpu"})

#: ``unstack_frozen`` keeps a frozen layer of a scanned run per block when one block's
#: weights take at least this many bytes; a smaller layer's slice costs less than the
#: switch's branches.
MIN_PER_BLOCK_BYTES = 1 << 20

#: The ops ``unstack_frozen`` keeps per block: one product of the input with the
#: weights, which each branch of the switch compiles again. (An attention's whole
#: computation in every branch made GPT-2 small's LoRA step compile 3.5x longer.)
PER_BLOCK_OPS = frozenset({"linear", "quantized_linear"})


def _inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def indexed_apply(apply: Callable[[Any, list, Any], tuple], blocks: tuple, index: Any,
                  args: list, key: Any, where: str) -> tuple:
    """``apply(weights, args, key) -> outputs`` with ``weights = blocks[index]``
    (``blocks`` one weight tree per block, ``index`` a traced int), as a
    ``lax.switch`` over the blocks. ``where`` names the layer in the error raised when
    something differentiates the weights."""

    def branch(k: int) -> Callable:
        return lambda weights, xs, key: tuple(apply(weights[k], list(xs), key))

    branches = [branch(k) for k in range(len(blocks))]

    @jax.custom_vjp
    def run(weights, i, xs, key):
        return lax.switch(i, branches, weights, xs, key)

    def forward(weights, i, xs, key):
        if any(w.perturbed for w in jax.tree.leaves(weights)):
            raise GraphError(f"{where}: its weights are given one block at a time, which is for "
                             f"weights that do not train; differentiate them stacked under the "
                             f"run's name (model.stack_weights)")
        weights, i, xs, key = jax.tree.map(lambda p: p.value, (weights, i, xs, key))
        return run(weights, i, xs, key), (weights, i, xs, key)

    def backward(residuals, cotangents):
        weights, i, xs, key = residuals
        wanted = [n for n, x in enumerate(xs) if _inexact(x)]
        cotangents = tuple(jnp.zeros(c.aval.shape, c.aval.dtype)
                           if isinstance(c, jax.custom_derivatives.SymbolicZero) else c
                           for c in cotangents)

        def transposed(k: int) -> Callable:
            def inputs_cotangent(weights, xs, key, cotangents):
                def of(*chosen):
                    full = list(xs)
                    for n, x in zip(wanted, chosen):
                        full[n] = x
                    return branch(k)(weights, full, key)
                return jax.vjp(of, *[xs[n] for n in wanted])[1](cotangents)
            return inputs_cotangent

        found = lax.switch(i, [transposed(k) for k in range(len(blocks))], weights, xs, key,
                           cotangents) if wanted else ()
        out: list = [None] * len(xs)
        for n, value in zip(wanted, found):
            out[n] = value
        return None, None, tuple(out), None

    run.defvjp(forward, backward, symbolic_zeros=True)
    return run(tuple(blocks), index, tuple(args), key)


def per_block_layers(scan: ScanStep, params: Any) -> dict[tuple[str, ...], tuple]:
    """The layers of ``scan``'s body whose weights ``params`` (the tree holding the
    run, at the scan's level) gives per block instead of stacked: weights path in the
    body -> one weight tree per block. A layer absent from the stack and present under
    every block's name."""
    assert scan.body is not None
    parent = scan.weights[:-1]
    try:
        stacked = get_in(params, scan.weights)
    except (KeyError, TypeError, IndexError):
        stacked = {}
    found: dict[tuple[str, ...], tuple] = {}
    for step in scan.body.owners():
        if isinstance(step, ScanStep) or not step.param_specs or has_in(stacked, step.weights):
            continue
        blocks = []
        for name in scan.blocks:
            try:
                blocks.append(get_in(params, parent + (name,) + step.weights))
            except (KeyError, TypeError, IndexError):
                break
        else:
            found[step.weights] = tuple(blocks)
    return found



def _qualifies(scan: ScanStep, step: Step, frozen: frozenset[str]) -> bool:
    """A layer of the run to keep per block: one of ``PER_BLOCK_OPS``, no state, every
    weight frozen, one block's weights at least ``MIN_PER_BLOCK_BYTES``."""
    if (isinstance(step, ScanStep) or step.state_specs or not step.param_specs
            or step.op.op_name not in PER_BLOCK_OPS):
        return False
    prefix = "/".join(scan.weights + step.weights) + "/"
    specs = flatten_specs(step.param_specs)
    if not all(prefix + path in frozen for path, _ in specs):
        return False
    size = 0
    for _, spec in specs:
        count = 1
        for d in spec.shape:
            if not isinstance(d, int):
                return False
            count *= d
        size += count * (spec.dtype.itemsize if spec.dtype is not None else 4)
    return size >= MIN_PER_BLOCK_BYTES


def unstack_frozen(program: Program, params: Mapping, frozen: frozenset[str]) -> dict:
    """``params`` (the scanned layout) with each frozen layer of a top-level scanned run
    that qualifies (``PER_BLOCK_OPS``, no state, one block's weights at least
    ``MIN_PER_BLOCK_BYTES``) moved out of the
    stack to its blocks' own names, one array per block."""
    out = dict(params)
    for scan in program.steps:
        if not isinstance(scan, ScanStep) or not scan.owns_weights or scan.body is None:
            continue
        parent = scan.weights[:-1]
        for step in scan.body.owners():
            if not _qualifies(scan, step, frozen) or not has_in(out, scan.weights + step.weights):
                continue
            stacked = get_in(out, scan.weights + step.weights)
            out = _without(out, scan.weights + step.weights)
            for k, name in enumerate(scan.blocks):
                out = set_in(out, parent + (name,) + step.weights,
                             jax.tree.map(lambda x, k=k: x[k], stacked))
    return out


def _without(tree: Mapping, path: tuple[str, ...]) -> dict:
    """``tree`` without the entry at ``path`` (an emptied dict removed too)."""
    head, *rest = path
    out = dict(tree)
    if rest:
        inner = _without(tree[head], tuple(rest))
        if inner:
            out[head] = inner
        else:
            del out[head]
    else:
        del out[head]
    return out
