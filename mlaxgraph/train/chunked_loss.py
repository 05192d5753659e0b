"""The loss computed together with the model's output layer, a chunk of positions at
a time (``Trainer(loss_chunk=...)``).

A language model's logits are ``(batch, tokens, vocabulary)``: GPT-2's 50,257 classes
make them, and their gradient, the largest arrays of a fine-tuning step. Here the
program runs up to the output layer's input (the *cut*); then ``lax.scan`` over chunks
of ``loss_chunk`` positions runs the output layers (the *tail*: a Linear or an
Embedding's ``attend``, with the casts, quantization and dequantization around it) and
the loss on each chunk, so no array of the vocabulary's width is ever whole. The tail
runs through the interpreter, as every layer does: the same ops, weights and named
scopes, and the same numbers up to the summation order.

The chunks have a derivative of their own (``_chunked``): each position's loss reads
its own row of the cut alone, so when the tail's weights are frozen (LoRA, QLoRA) the
forward pass computes each chunk's gradient of the rows with its loss and keeps it (the
size of the cut), and the backward pass scales it by each position's cotangent: the
logits are computed once. Where the tail's weights train, the backward pass runs the
chunks again for their gradient (as under ``jax.checkpoint``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero, custom_vjp_primal_tree_values

from ..compiler.interpreter import run
from ..compiler.program import Program, Ref, ScanStep, Step, get_in, set_in
from ..core.errors import GraphError
from ..ir.paths import path_matcher
from ..ops.embedding import Embedding
from .objectives import check_targets

__all__ = ["ChunkedHead", "TAIL_OPS"]

#: The ops an output layer is made of that compute each position from that position
#: alone (an ``embedding`` only as ``attend``: a lookup of ids is where the tail ends).
TAIL_OPS = frozenset({"linear", "embedding", "quantized_linear", "quantized_embedding",
                      "quantize", "dequantize", "cast"})


def _tail(program: Program) -> tuple[list[Step], set[Ref]]:
    """The steps from the graph's output back to the first step that is not one of
    ``TAIL_OPS``, and the refs they read from outside."""
    producer = {ref: step for step in program.steps for ref in step.outputs}
    tail: dict[str, Step] = {}
    external: set[Ref] = set()
    stack = [program.outputs[0]]
    while stack:
        ref = stack.pop()
        step = producer.get(ref)
        positionwise = (step is not None and not isinstance(step, ScanStep)
                        and step.op.op_name in TAIL_OPS
                        and (not isinstance(step.op, Embedding)
                             or step.op._attends(step.input_specs)))
        if not positionwise:
            external.add(ref)
        elif step is not None and step.path not in tail:
            tail[step.path] = step
            stack.extend(step.inputs)
    order = {step.path: i for i, step in enumerate(program.steps)}
    return sorted(tail.values(), key=lambda step: order[step.path]), external


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkedHead:
    """The program split at the output layer's input.

    Attributes:
      chunk: positions per chunk.
      body: the program up to the cut, whose one output is the output layer's input.
      tail: the output layers, a program whose one input is the cut.
      classes: the output's last dim (the vocabulary).
      loss_name: the named loss (``"softmax_cross_entropy"``).
      objectives: name -> function ``(logits, labels) -> per-position values``: the loss
        (``"loss"``) and the named metrics.
      output_name: the graph's output, for error messages.
    """

    chunk: int
    body: Program
    tail: Program
    classes: int
    loss_name: str
    objectives: Mapping[str, Callable]
    output_name: str

    @staticmethod
    def of(program: Program, chunk: Any, loss: Any, loss_fn: Callable,
           metrics: Mapping[str, Callable], metric_names: Any, intervene: tuple) -> ChunkedHead:
        """Checks ``Trainer(loss_chunk=...)`` against the model and the loss.

        Raises:
          GraphError: ``chunk`` not a positive int, a loss other than
            ``"softmax_cross_entropy"``, a metric given as a function, an output that
            does not come from a Linear or an Embedding's ``attend``, or an
            intervention on the output layers.
        """
        where = "Trainer(loss_chunk=...)"
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise GraphError(f"{where} takes a positive number of positions per chunk, "
                             f"got {chunk!r}")
        if loss != "softmax_cross_entropy":
            raise GraphError(f"{where} computes the loss 'softmax_cross_entropy' with the "
                             f"output layer, a chunk of positions at a time; got the loss "
                             f"{loss!r}: leave loss_chunk out for another loss")
        if metric_names is not None and isinstance(metric_names, Mapping):
            raise GraphError(f"{where}: the logits are never whole, so metrics are named ones "
                             f"computed per chunk ({sorted(metrics)} given as functions); "
                             f"metrics=('accuracy',) or leave loss_chunk out")
        if len(program.outputs) != 1:
            raise GraphError(f"{where}: the loss takes one model output, and graph "
                             f"{program.graph.name!r} has {len(program.outputs)}")
        steps, external = _tail(program)
        output_path = program.outputs[0][0]
        if not steps:
            op = program.nodes[output_path].op.op_name if output_path in program.nodes else "input"
            raise GraphError(f"{where}: the graph's output comes from layer {output_path!r} "
                             f"(op {op}); the chunked loss runs the output layer a chunk of "
                             f"positions at a time, and takes a Linear or an Embedding's "
                             f"attend there")
        if len(external) != 1 or next(iter(external))[1] != 0:
            reads = ", ".join(sorted(f"{p}[{i}]" for p, i in external))
            raise GraphError(f"{where}: the output layers "
                             f"({', '.join(s.path for s in steps)}) read {reads}; the chunked "
                             f"loss splits the program at one value, the output layer's input")
        for step in steps:
            # a Quantize node's state (its calibrated scale) is read, never changed
            if (step.state_specs and step.op.op_name != "quantize") or step.random:
                raise GraphError(f"{where}: output layer {step.path!r} (op "
                                 f"{step.op.op_name}) has state or draws random numbers")
            for pattern, _ in intervene:
                if path_matcher(pattern)(step.path):
                    raise GraphError(f"{where}: intervene at {pattern!r} names the output "
                                     f"layer {step.path!r}, which the chunked loss runs apart; "
                                     f"leave loss_chunk out to intervene there")
        (cut,) = external
        body = dataclasses.replace(
            program, outputs=(cut,),
            schedule=tuple(unit for unit in program.schedule if unit not in steps))
        tail = dataclasses.replace(program, inputs=(cut[0],), steps=tuple(steps),
                                   schedule=tuple(steps))
        classes = program.node_specs(output_path)[1][program.outputs[0][1]].shape[-1]
        return ChunkedHead(chunk, body, tail, classes, loss, {"loss": loss_fn, **metrics},
                           output_path)

    def values(self, params: Any, state: Any, h: jax.Array, targets: Any,
               inference_mode: bool) -> dict[str, jax.Array]:
        """The loss and metrics per position (shaped like ``targets``) from the output
        layer's input ``h``, one chunk of positions at a time."""
        targets = jnp.asarray(targets)
        logits = jax.ShapeDtypeStruct(h.shape[:-1] + (self.classes,), h.dtype)
        check_targets(self.loss_name, logits, targets, self.output_name)
        n = math.prod(h.shape[:-1])
        count = -(-n // self.chunk)
        rows = h.reshape(n, h.shape[-1])
        labels = targets.reshape(n)
        if count * self.chunk != n:  # the last chunk padded with zeros, its values dropped
            rows = jnp.pad(rows, ((0, count * self.chunk - n), (0, 0)))
            labels = jnp.pad(labels, (0, count * self.chunk - n))
        values = _chunked(self, inference_mode, self._weights(params), self._weights(state),
                          rows.reshape(count, self.chunk, -1), labels.reshape(count, self.chunk))
        return {name: v.reshape(-1)[:n].reshape(targets.shape) for name, v in values.items()}

    def _weights(self, tree: Any) -> dict:
        """The part of ``params`` or ``state`` the output layers read."""
        out: dict = {}
        for step in self.tail.steps:
            try:
                out = set_in(out, step.weights, get_in(tree, step.weights))
            except (KeyError, TypeError):
                continue  # a layer without weights of this kind
        return out

    def _one(self, params, state, x, y, inference_mode) -> dict[str, jax.Array]:
        """The objectives of one chunk's rows ``x`` and labels ``y``, per row."""
        out = run(self.tail, params, state, [x], rng=None, inference_mode=inference_mode,
                  bindings=None)[0][0]
        return {name: fn(out, y).astype(jnp.float32) for name, fn in self.objectives.items()}

    def scan(self, params, state, rows, labels, inference_mode) -> dict[str, jax.Array]:
        """The objectives of every chunk, ``(chunks, chunk)`` each."""
        def body(carry, xs):
            return carry, self._one(params, state, *xs, inference_mode)
        return jax.lax.scan(body, None, (rows, labels))[1]


# The chunks with their own derivative. Each position's loss depends on its own row of
# ``h`` alone, so the gradient of a chunk's summed loss is, row by row, each position's
# own: the forward pass computes it with the loss, one chunk at a time, and keeps it
# (the size of ``h``), so the backward pass only scales it by each position's cotangent
# and no logits are computed again. Where the output layers' weights train, their
# gradient is the sum over positions weighted by the cotangents: the backward pass then
# runs the chunks again (as under jax.checkpoint). Metrics have no gradient.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _chunked(head: ChunkedHead, inference_mode: bool, params, state, rows, labels):
    return head.scan(params, state, rows, labels, inference_mode)


def _chunked_fwd(head, inference_mode, params, state, rows, labels):
    perturbed = any(leaf.perturbed for leaf in jax.tree.leaves(params))
    params, state, rows, labels = (custom_vjp_primal_tree_values(v)
                                   for v in (params, state, rows, labels))
    if perturbed:
        return head.scan(params, state, rows, labels, inference_mode), (params, state, rows, labels)

    def body(carry, xs):
        x, y = xs

        def loss(x):
            values = head._one(params, state, x, y, inference_mode)
            return jnp.sum(values["loss"]), values

        grad, values = jax.grad(loss, has_aux=True)(x)
        return carry, (values, grad)

    _, (values, grads) = jax.lax.scan(body, None, (rows, labels))
    return values, (None, None, grads, None)


def _chunked_bwd(head, inference_mode, residuals, cotangents):
    params, state, rows_or_grads, labels = residuals
    g = cotangents["loss"]
    if isinstance(g, SymbolicZero):
        g = jnp.zeros(g.shape, g.dtype)
    if params is None:  # the rows' gradients, kept by the forward pass
        return None, None, (g[..., None] * rows_or_grads).astype(rows_or_grads.dtype), None

    def body(acc, xs):
        x, y, gy = xs

        def weighted(p, x):
            return jnp.sum(gy * head._one(p, state, x, y, inference_mode)["loss"])

        dp, dx = jax.grad(weighted, argnums=(0, 1))(params, x)
        return jax.tree.map(jnp.add, acc, dp), dx

    zero = jax.tree.map(jnp.zeros_like, params)
    dparams, drows = jax.lax.scan(body, zero, (rows_or_grads, labels, g))
    return dparams, None, drows, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd, symbolic_zeros=True)
