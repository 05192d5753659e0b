"""The ``onnx`` family's control flow: ``If``, ``Loop`` and ``Scan``, whose bodies are
ONNX graphs (attributes held as ``("graph", hex of its bytes)``). A body is read with
``from_onnx`` for the shapes and dtypes its inputs have when the operator runs and
computed by ``jax.lax.cond``, ``jax.lax.while_loop`` or ``jax.lax.scan``. The values
a body reads from the graph around it are the node's extra inputs (the importer adds
them after the node's own, their names in the attribute ``__outer__``).

``Loop``'s trip count and condition are static inputs: with scan outputs the number
of iterations sets their length, so a body that may stop early (its condition output
other than its condition input passed through) is refused when it has scan outputs.

``FlexAttention`` (ONNX's ``ai.onnx.preview`` domain) is attention whose scores and
probabilities pass through bodies of the same kind (``score_mod``, ``prob_mod``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import GraphError, MlaxGraphError, SerializationError
from .dtypes import int64, to_dtype
from .layer import DOMAINS, define

__all__ = ["free_names"]


def free_names(graph: Any) -> set[str]:
    """The names a body (an ``onnx.GraphProto``) reads from the graphs around it."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = {v.name for v in graph.output}
    for node in graph.node:
        defined.update(node.output)
        used.update(node.input)
        for attr in node.attribute:
            if attr.HasField("g"):
                used |= free_names(attr.g)
            for g in attr.graphs:
                used |= free_names(g)
    return {name for name in used - defined if name}


@functools.lru_cache(maxsize=64)
def _parse(data: str) -> Any:
    from .protos import require_onnx

    graph = require_onnx().GraphProto()
    try:
        graph.ParseFromString(bytes.fromhex(data))
    except Exception as e:  # a damaged body in a saved graph: protobuf's DecodeError, bad hex
        raise SerializationError(f"an If/Loop/Scan body is damaged: {type(e).__name__}") from None
    return graph


@functools.lru_cache(maxsize=256)
def _read(data: str, opset: int, outer: tuple, specs: tuple) -> tuple:
    """The body as a compiled model taking its formal inputs, then the outer values
    (``specs``: each one's shape and dtype, and its bytes when it is known: then it
    is a constant of the body, so it may set shapes and indices), then an unused
    scalar (a graph has at least one input)."""
    from ..compiler.compile import compile as compile_graph
    from .protos import require_onnx
    from .reader import from_onnx

    onnx = require_onnx()
    helper = onnx.helper
    body = onnx.GraphProto()
    body.CopyFrom(_parse(data))
    if any(v.type.WhichOneof("value") not in ("tensor_type", None) for v in body.output):
        raise GraphError("an If/Loop/Scan body giving a sequence or an optional is read only "
                         "where it is picked when the graph is built (an If's condition "
                         "known then)")
    names = [v.name for v in body.input] + list(outer) + ["__unused__"]
    del body.input[:]
    for name, (shape, dtype, known) in zip(names, specs + (((), "float32", None),)):
        if known is not None:
            array = np.frombuffer(known, np.dtype(dtype)).reshape(shape)
            body.initializer.append(onnx.numpy_helper.from_array(array, name))
            continue
        code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        body.input.append(helper.make_tensor_value_info(name, code, list(shape)))
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", opset)])
    # read as outside the trace the operator runs in: its constants fold to values
    with jax.ensure_compile_time_eval():
        graph, params, state = from_onnx(model, blocks=False)
    return compile_graph(graph), params, state


def _run(attrs: Any, key: str, formals: list, outers: list) -> list:
    data = attrs[key][1]
    values = list(formals) + list(outers)
    known = [isinstance(v, (np.ndarray, np.generic)) for v in values]
    specs = tuple((tuple(np.shape(v)), jnp.asarray(v).dtype.name,
                   np.ascontiguousarray(np.asarray(v)).tobytes() if k else None)
                  for v, k in zip(values, known))
    model, params, state = _read(data, attrs.opset, tuple(attrs.get("__outer__", ())), specs)
    arrays = [jnp.asarray(v) for v, k in zip(values, known) if not k]
    out, _ = model.apply_fn(params, state, *arrays, jnp.zeros((), jnp.float32), inference_mode=True)
    return list(out) if isinstance(out, tuple) else [out]


def _split(attrs: Any, inputs: tuple) -> tuple[list, list]:
    n = len(attrs.get("__outer__", ()))
    return list(inputs[:len(inputs) - n]), list(inputs[len(inputs) - n:])


@define("If", flops="none")
def _if(a, cond, *rest):
    _, outers = _split(a, (cond,) + rest)
    if not isinstance(cond, jax.core.Tracer):
        return tuple(_run(a, "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch",
                          [], outers))
    return tuple(jax.lax.cond(cond.reshape(-1)[0].astype(bool),
                              lambda xs: tuple(_run(a, "then_branch", [], xs)),
                              lambda xs: tuple(_run(a, "else_branch", [], xs)), outers))


def _keeps_going(body: Any) -> bool:
    """Whether a Loop body's condition output is its condition input, passed through."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_in == cond_out:
        return True
    return any(n.op_type == "Identity" and list(n.output) == [cond_out] and list(n.input) == [cond_in]
               for n in body.node)


@define("Loop", static=(0, 1), flops="none")
def _loop(a, trip=None, cond=None, *rest):
    values, outers = _split(a, tuple(rest))
    body = _parse(a["body"][1])
    n_scan = len(body.output) - 1 - len(values)
    limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    index = int64()

    def step(i, c, vs):
        # numbers known here stay NumPy values: the body reads them as constants
        i = np.asarray(i, index) if isinstance(i, (int, np.integer, np.ndarray)) else i.astype(index)
        c = np.asarray(c, bool) if isinstance(c, (bool, np.bool_, np.ndarray)) else c.astype(bool)
        out = _run(a, "body", [i, c] + list(vs), outers)
        return out[0].reshape(()).astype(bool), out[1:1 + len(vs)], out[1 + len(vs):]

    if n_scan:
        if limit is None or not _keeps_going(body):
            raise GraphError("Loop with scan outputs needs a trip count and a body that does "
                             "not stop early: the outputs' length would depend on the data")
        count = limit if go else 0
        if count == 0:
            shapes = jax.eval_shape(lambda vs: step(0, True, vs)[2], values)
            return tuple(values) + tuple(jnp.zeros((0,) + s.shape, s.dtype) for s in shapes)

        def scan_step(vs, i):
            _, new, scans = step(i, True, vs)
            return [v.astype(o.dtype) for v, o in zip(new, vs)], scans
        try:
            final, stacked = jax.lax.scan(scan_step, list(values), jnp.arange(count, dtype=index))
        except MlaxGraphError:
            # the body needs the iteration number when it is built (a Slice's start):
            # the loop unrolled, each iteration's body read with its number
            final, rows = list(values), []
            for i in range(count):
                final, scans = scan_step(final, np.asarray(i, index))
                rows.append(scans)
            stacked = [jnp.stack(parts) for parts in zip(*rows)]
        return tuple(final) + tuple(stacked)

    def while_cond(carry):
        i, c, _ = carry
        more = c if limit is None else jnp.logical_and(c, i < limit)
        return more

    def while_body(carry):
        i, c, vs = carry
        c2, new, _ = step(i, c, vs)
        return i + 1, c2, [v.astype(o.dtype) for v, o in zip(new, vs)]

    _, _, final = jax.lax.while_loop(while_cond, while_body,
                                     (jnp.asarray(0, index), jnp.asarray(go), list(values)))
    return tuple(final)


@define("Scan", flops="none")
def _scan(a, *inputs):
    if a.opset < 9:
        raise GraphError("Scan before opset 9 (a batch axis and sequence lengths) is not supported")
    own, outers = _split(a, inputs)
    m = int(a["num_scan_inputs"])
    states, xs = own[:len(own) - m], own[len(own) - m:]
    axes = a.get("scan_input_axes") or (0,) * m
    directions = a.get("scan_input_directions") or (0,) * m
    xs = [jnp.moveaxis(x, ax % x.ndim, 0) for x, ax in zip(xs, axes)]
    xs = [x[::-1] if d else x for x, d in zip(xs, directions)]

    def step(carry, slices):
        out = _run(a, "body", list(carry) + list(slices), outers)
        return [o.astype(c.dtype) for o, c in zip(out[:len(carry)], carry)], out[len(carry):]

    final, ys = jax.lax.scan(step, list(states), xs)
    n = len(ys)
    out_axes = a.get("scan_output_axes") or (0,) * n
    out_dirs = a.get("scan_output_directions") or (0,) * n
    ys = [y[::-1] if d else y for y, d in zip(ys, out_dirs)]
    ys = [jnp.moveaxis(y, 0, ax % y.ndim) for y, ax in zip(ys, out_axes)]
    return tuple(final) + tuple(ys)


@define("FlexAttention", dtypes="float", flops="input")
def _flex_attention(a, q, k, v, *outers):
    """``softmax(score_mod(q k^T scale)) -> prob_mod -> @ v`` on ``(batch, heads, seq,
    head)`` tensors, each key/value head shared by a contiguous group of query heads;
    the scores in ``softmax_precision`` (float32 for narrower inputs), q and k each
    scaled by the square root of ``scale`` (default ``1 / sqrt(head)``) first."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise GraphError(f"FlexAttention takes rank-4 query, key and value; got ranks "
                         f"{q.ndim}, {k.ndim}, {v.ndim}")
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scale = a.get("scale")
    root = jnp.asarray(np.sqrt(np.float32(1 / np.sqrt(q.shape[-1]) if scale is None else scale)),
                       q.dtype)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q * root, k * root,
                        precision=jax.lax.Precision.HIGHEST)
    precision = a.get("softmax_precision")
    wide = (to_dtype(precision) if precision is not None else
            jnp.promote_types(q.dtype, jnp.float32))
    scores = scores.astype(wide)
    if "score_mod" in a:
        scores = _run(a, "score_mod", [scores], list(outers))[0].astype(wide)
    probs = jax.nn.softmax(scores, axis=-1)
    if "prob_mod" in a:
        probs = _run(a, "prob_mod", [probs], list(outers))[0].astype(wide)
    out = jnp.einsum("bhqk,bhkd->bhqd", probs, v.astype(wide), precision=jax.lax.Precision.HIGHEST)
    return out.astype(v.dtype)


DOMAINS["FlexAttention"] = "ai.onnx.preview"
