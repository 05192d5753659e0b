"""The weights of a quantized graph: ``mg.quantize_weights`` makes them from the float
model's (absmax, or GPTQ from calibration batches: ``gptq.py``) and, from calibration
batches, the ``Quantize`` nodes' static scales."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import compile
from ..compiler.program import get_in, has_in, leaf_paths, set_in
from ..core.donated import refuse_deleted
from ..core.errors import ConfigError, GraphError, MlaxGraphError, QuantizeWarning, node_message
from ..core.signatures import unknown_keywords
from ..core.specs import trains
from ..decode.inputs import check_vocabulary
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths
from ..ops.embedding import Embedding
from ..ops.quantize import Quantize, quantize_weight, range_scale
from ..ops.quantized import QuantizedConv
from ..ops.quantized_embedding import QuantizedEmbedding
from .gptq import gptq_params, hessians
from .quantize import QUANTIZED_OPS
from .quantized_checks import check, check_arrays, extra_keys, stored

__all__ = ["quantize_weights", "quantize_params"]


def quantize_weights(qgraph: Graph, params: Mapping, state: Mapping | None = None, *,
                     calibration: Iterable | None = None, method: str = "absmax",
                     static_scales: bool | None = None, **unknown: Any) -> tuple[dict, dict]:
    """The weights of quantized graph ``qgraph`` (what ``mg.quantize`` made) from the
    float model's ``(params, state)``: each quantized layer's float weight quantized
    by absmax (the largest magnitude of each output channel, row or group maps to the
    scheme's largest value), every other weight as it is. ``params`` are the float
    graph's, unscanned (``model.unstack_weights`` gives them from a scanned model's).
    Returns ``(qparams, qstate)``; ``mg.compile(qgraph).apply(qparams, qstate, ...)``
    runs the quantized model (``qstate`` holds each ``Quantize`` node's ``scale``).

    ``calibration``: None, or an iterable of a few input batches, each what ``apply``
    takes after ``(params, state)`` (an array, or a tuple of arrays for several
    inputs); the quantized model runs on them in inference mode.

    ``method``: ``"absmax"`` (each weight rounded to the nearest value) or ``"gptq"``
    (needs ``calibration``): the weights of each Linear, attention projection and tied
    head are rounded one input row at a time, each rounding's error on the layer's
    output moved onto the rows not rounded yet, as the Hessian ``X^T X`` of the inputs
    the layer reads over the calibration batches says (GPTQ, ``mlaxgraph/adapters/
    gptq.py``): the same format, bytes and scales as absmax, a smaller error on the
    layer's outputs for inputs like the calibration's. Conv layers and embedding
    lookups keep absmax rounding.

    ``static_scales``: whether each ``Quantize`` node (int8 and float8 schemes) gets a
    static scale from ``calibration`` (the largest ``|x|`` its input reaches over all
    the batches, over 127 (448 for float8), one per node; an asymmetric node: the
    range ``[low, high]`` its per-call scales cover over the batches, over 255, and its
    zero point) instead of computing one at each call (state ``scale`` 0). None: static
    when ``calibration`` is given with ``method="absmax"``, per call with ``"gptq"``. A
    static scale makes the quantization the same for every batch; values beyond the
    calibrated range clip.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.Graph(x, ops.Linear(16, name="fc")(x))
      >>> params, state = mg.compile(g).init(jax.random.key(0))
      >>> qg = mg.quantize(g, "int8")
      >>> qparams, qstate = mg.quantize_weights(qg, params, state)
      >>> jax.tree.map(lambda w: (w.dtype.name, w.shape), qparams)
      {'fc': {'bias': ('float32', (16,)), 'kernel': ('int8', (8, 16)), 'kernel_scale': ('float32', (16,))}}
    """
    if unknown:
        raise ConfigError(unknown_keywords(
            "quantize_weights", unknown, "quantize_weights(qgraph, params, state=None, "
            "calibration=None, method='absmax', static_scales=None)",
            {k: f"{k} is mg.quantize's" for k in ("group_size", "targets", "scheme")}))
    refuse_deleted("quantize_weights", params=params, state=state)
    if not isinstance(qgraph, Graph):
        raise GraphError(f"quantize_weights works on a Graph, got {type(qgraph).__name__}")
    if not isinstance(params, Mapping):
        raise GraphError(f"quantize_weights takes params (nested dicts), got "
                         f"{type(params).__name__}")
    state = {} if state is None else state
    if calibration is not None and (isinstance(calibration, (str, bytes, Mapping))
                                    or not isinstance(calibration, Iterable)):
        raise ConfigError(f"quantize_weights: calibration takes an iterable of input batches "
                          f"(as apply takes them), got {type(calibration).__name__}")
    shape = getattr(calibration, "shape", None)
    if shape is not None and hasattr(calibration, "dtype"):
        # iterating an array would give its rows, each one example without its batch axis
        raise ConfigError(f"quantize_weights: calibration takes an iterable of input batches "
                          f"(as apply takes them), got one array {list(shape)}: "
                          f"pass calibration=[batch] for one batch")
    if method not in ("absmax", "gptq"):
        raise ConfigError(f"quantize_weights: method must be 'absmax' or 'gptq', got {method!r}")
    if static_scales is not None and not isinstance(static_scales, bool):
        raise ConfigError(f"quantize_weights: static_scales must be a bool or None, got "
                          f"{static_scales!r}")
    if calibration is None and (method == "gptq" or static_scales):
        raise ConfigError(f"quantize_weights: {'method=' + repr(method) if method == 'gptq' else 'static_scales=True'} "
                          f"needs calibration=batches (a few input batches)")
    if calibration is not None and method == "absmax" and static_scales is False:
        raise ConfigError("quantize_weights: calibration= is read for static scales or GPTQ, and "
                          "static_scales=False with method='absmax' asks for neither, so the "
                          "batches would be ignored: drop calibration=, or pass "
                          "method='gptq' or static_scales=True")
    batches = None if calibration is None else list(calibration)
    if static_scales is None:
        static_scales = batches is not None and method == "absmax"
    qgraph = unfold_scans(qgraph)
    if not any(isinstance(node.op, (*QUANTIZED_OPS.values(), Quantize))
               for _, node in layer_paths(qgraph)):
        raise ConfigError(f"quantize_weights: graph {qgraph.name!r} has no quantized layer, so "
                          f"its weights would stay float: pass the graph mg.quantize made "
                          f"(qgraph = mg.quantize(graph, 'int8'); mg.quantize_weights(qgraph, "
                          f"params, state))")
    if batches is not None:
        _check_vocabulary(qgraph, batches)
    expected, expected_state = jax.eval_shape(compile(qgraph).init_fn, jax.random.key(0))
    out, state, casts = _weights(qgraph, params, state, expected, {})
    check(qgraph.name, None, state, expected_state, "state")
    _check_unread(qgraph, params, out)
    if method == "gptq":
        out, _, _ = _weights(qgraph, params, state, expected,
                             hessians(qgraph, out, state, batches or ()))
    if static_scales:
        state = _calibrated(qgraph, out, dict(state), batches or (), casts)
    return out, dict(state)



def _weights(qgraph: Graph, params: Mapping, state: Mapping, expected: Any,
             found: Mapping[str, Any]) -> tuple[dict, dict, list[str]]:
    """``(qparams, state, the Quantize nodes' paths)``: the float weights quantized
    (by GPTQ where ``found`` has the layer's Hessians), the state with per-call scales
    for the Quantize nodes it lacks."""
    out: dict = {}
    casts: list[str] = []
    for path, node in layer_paths(qgraph):
        keys = tuple(path.split("/"))
        if isinstance(node.op, Quantize):
            casts.append(path)
            try:
                get_in(state, keys)
            except (KeyError, TypeError):  # a float model's state: per-call scales
                fresh = {"scale": jnp.zeros((), jnp.float32)}
                if node.op.zero_point:
                    fresh["zero"] = jnp.zeros((), jnp.int32)
                state = set_in(state, keys, fresh)
        try:
            want = get_in(expected, keys)
        except (KeyError, TypeError):
            continue  # a layer without weights
        try:
            given = get_in(params, keys)
        except (KeyError, TypeError):
            swapped = has_in(state, keys)
            raise GraphError(node_message(
                path, node.op.op_name, "params have no weights for this layer " + (
                    "but state has them: params and state are swapped (it takes "
                    "quantize_weights(qgraph, params, state), as init gives them)" if swapped
                    else "(give the float model's params, unscanned: model.unstack_weights "
                    "gives them)"))) from None
        check_arrays(path, node, given)
        extra = extra_keys(given, want)
        if extra:
            raise GraphError(node_message(
                path, node.op.op_name, f"params hold {path}/{extra[0]}, a weight this layer "
                f"does not have (its weights: {', '.join(leaf_paths(want))}), which would be "
                f"dropped; give the float model's params"))
        if isinstance(node.op, tuple(QUANTIZED_OPS.values())) and not stored(given, want):
            given = _quantized(path, node, _to_float32(given), want, found.get(path))
        given = _as_expected(given, want)
        if isinstance(want, Mapping) and "kernel_sum" in want and "kernel_sum" not in given:
            # the column sums a zero point's correction reads, from the int8 kernel
            given = {**given, "kernel_sum": jnp.sum(jnp.asarray(given["kernel"]), axis=0,
                                                    dtype=jnp.int32)}
        check(path, node, given, want)
        out = set_in(out, keys, dict(given))
    return out, dict(state), casts


def _to_float32(tree: Any) -> Any:
    """A layer's float weights (bfloat16, float16 ...) in float32, which the scales are
    computed in: a bfloat16 checkpoint quantizes as its float32 values do."""
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32) if trains(a.dtype) else a, tree)


def _as_expected(given: Any, want: Any) -> Any:
    """The float weights kept float in the quantized graph's float dtype (a bfloat16
    model's LayerNorm and biases in float32, as the quantized graph's ``init`` makes
    them); other dtypes are left to ``_check``."""
    if isinstance(want, Mapping):
        if not isinstance(given, Mapping):
            return given
        return {k: _as_expected(v, want[k]) if k in want else v for k, v in given.items()}
    dtype = getattr(given, "dtype", None)
    if (dtype is not None and trains(dtype) and trains(want.dtype)
            and np.dtype(dtype) != np.dtype(want.dtype)):
        return jnp.asarray(given, want.dtype)
    return given


def _check_vocabulary(qgraph: Graph, batches: list) -> None:
    """Every calibration batch's token ids are in the vocabulary of the embedding that
    reads them (as ``generate`` checks a prompt's): an id past it would calibrate the
    scales on garbage (a lookup out of range gives NaN or another row)."""
    readers: dict[int, tuple[str, int]] = {}  # input number -> (layer, vocabulary)
    for node in qgraph.nodes:
        if isinstance(node.op, Embedding) and node.inputs and node.inputs[0].node in qgraph.inputs:
            readers.setdefault(qgraph.inputs.index(node.inputs[0].node),
                               (node.layer, node.op.num_embeddings))
    for number, batch in enumerate(batches):
        inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        for index, (layer, vocabulary) in readers.items():
            if index >= len(inputs) or not hasattr(inputs[index], "dtype"):
                continue
            ids = np.asarray(inputs[index])
            if np.issubdtype(ids.dtype, np.integer):  # the check prompts get (mg.generate)
                check_vocabulary(ids, vocabulary,
                               f"quantize_weights: calibration batch {number}, input "
                               f"{qgraph.inputs[index]!r} (read by layer {layer!r})")


def _check_unread(qgraph: Graph, params: Mapping, out: Mapping) -> None:
    """Every weight in ``params`` belongs to a layer of ``qgraph``: weights of layers
    the quantized graph lacks (a LoRA adapter's, another model's) would be dropped."""
    layers = {path.rsplit("/", 1)[0] for path in leaf_paths(out)}
    unread = [path for path in leaf_paths(params)
              if not any(path.startswith(layer + "/") for layer in layers)]
    if unread:
        shown = ", ".join(repr(p) for p in unread[:4]) + (f" and {len(unread) - 4} more"
                                                          if len(unread) > 4 else "")
        raise GraphError(f"quantize_weights: params hold weights that no layer of graph "
                         f"{qgraph.name!r} reads: {shown}. Quantize the graph those layers "
                         f"belong to (for LoRA adapters: mg.quantize the adapted graph, or "
                         f"fold them in first with mg.merge_lora)")


def _calibrated(qgraph: Graph, params: dict, state: dict, batches: Iterable,
                casts: list[str]) -> dict:
    """``state`` with each ``Quantize`` node's static scale from ``batches``: the
    largest per-call scale it makes over them (the largest ``|x|`` times ``1 / 127``,
    as the per-call scale is computed, so the same float32)."""
    if not casts:
        raise ConfigError(f"quantize_weights: calibration sets the scales of Quantize nodes "
                          f"and graph {qgraph.name!r} has none (the 'int8' and 'float8' "
                          f"schemes make them)")
    for path in casts:  # calibrate from per-call scales, whatever the state held
        keys = tuple(path.split("/"))
        state = set_in(state, keys, {**get_in(state, keys), "scale": jnp.zeros((), jnp.float32)})
    apply = compile(qgraph).apply
    axes = {path: node.op.axes for path, node in layer_paths(qgraph)
            if path in casts and isinstance(node.op, Quantize)}
    largest: dict[str, jax.Array] = {}
    lowest: dict[str, jax.Array] = {}
    for number, batch in enumerate(batches):
        inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        for array in inputs:
            if jnp.issubdtype(np.asarray(array).dtype, jnp.inexact) and not np.all(np.isfinite(array)):
                raise ConfigError(f"quantize_weights: calibration batch {number} holds NaN or "
                                  f"inf values; static scales from it would be meaningless")
        try:
            _, _, captured = apply(params, state, *inputs, inference_mode=True, capture=casts)
        except MlaxGraphError as e:  # which batch, not only which input
            raise type(e)(f"quantize_weights: calibration batch {number}: {e}") from None
        for path in casts:
            out = captured[path]
            scale = out[1].astype(jnp.float32)
            # the scales of values all zero (1, by convention) say nothing of the range
            zero = out[2] if len(out) == 3 else jnp.zeros((), out[0].dtype)
            seen = jnp.any(out[0] != zero.astype(out[0].dtype), axis=axes[path], keepdims=True)
            if len(out) == 3:  # asymmetric: the range [low, high] each scale covers
                zero = zero.astype(jnp.float32)
                top = jnp.max(jnp.where(seen, (127 - zero) * scale, -jnp.inf))
                bottom = jnp.min(jnp.where(seen, (-128 - zero) * scale, jnp.inf))
                lowest[path] = bottom if path not in lowest else jnp.minimum(lowest[path],
                                                                            bottom)
            else:
                top = jnp.max(jnp.where(seen, scale, -jnp.inf))
            top = jnp.where(jnp.all(jnp.isfinite(scale)), top, jnp.nan)
            largest[path] = top if path not in largest else jnp.maximum(largest[path], top)
    if not largest:
        raise ConfigError("quantize_weights: calibration gave no batch; pass a few input "
                          "batches (or calibration=None for per-call scales)")
    unseen = []
    for path in casts:
        keys = tuple(path.split("/"))
        if np.isnan(float(largest[path])):
            raise ConfigError(f"quantize_weights: the calibration batches make NaN or inf "
                              f"values at Quantize node {path!r}, so a static scale from them "
                              f"would be too (check the batches for NaN and inf)")
        if not np.isfinite(float(largest[path])):  # only zeros: no range to calibrate
            unseen.append(path)
            continue
        if path in lowest:
            scale, zero = range_scale(jnp.stack([lowest[path], largest[path]]), (0,))
            state = set_in(state, keys, {"scale": scale[0], "zero": zero[0]})
        else:
            state = set_in(state, keys, {"scale": largest[path]})
    if unseen:
        warnings.warn(f"quantize_weights: the calibration batches give only zeros at "
                      f"Quantize node(s) {', '.join(map(repr, unseen))}, so they keep per-call "
                      f"scales (state scale 0): calibrate with batches like the model's "
                      f"inputs", QuantizeWarning, stacklevel=3)
    return state


def _quantized(path: str, node: Node, given: Mapping, want: Mapping,
               found: Mapping[str, Any] | None) -> dict:
    op: Any = node.op
    weight = "embedding" if isinstance(op, QuantizedEmbedding) else "kernel"
    floats = [leaf for key, leaf in leaf_paths(given).items() if key.endswith(weight)]
    if not floats or not all(trains(leaf.dtype) for leaf in floats):
        held = ", ".join(sorted({np.dtype(leaf.dtype).name for leaf in floats}))
        raise GraphError(node_message(
            path, op.op_name, f"params have no float {weight!r} for this layer to quantize"
            + (f" (it is {held}: weights another quantization made? quantize_weights takes "
               f"the float model's params)" if floats else "")))
    try:
        rounded = None if found is None else gptq_params(op, dict(given), found)
        out = quantize_params(op, dict(given)) if rounded is None else rounded
    except (TypeError, ValueError) as e:
        raise GraphError(node_message(path, op.op_name,
                                      f"its float {weight!r} is not this layer's: {e}")) from None
    made, needed, floats_at = leaf_paths(out), leaf_paths(want), leaf_paths(given)
    for key, leaf in made.items():
        if key in needed and tuple(leaf.shape) != tuple(needed[key].shape):
            source = key if key in floats_at else next((k for k in floats_at if k.endswith(weight)), key)
            raise GraphError(node_message(
                f"{path}/{source}", op.op_name,
                f"the float weight is {np.dtype(floats_at[source].dtype).name}"
                f"{list(floats_at[source].shape)}, which quantizes to "
                f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}; the quantized graph needs "
                f"{np.dtype(needed[key].dtype).name}{list(needed[key].shape)} (params of a "
                f"model of other sizes?)"))
    return out


def quantize_params(op: Any, params: dict) -> dict:
    """The stored weights of quantized layer ``op`` from its float layer's ``params``
    (``kernel`` / ``embedding`` float, ``bias``): absmax scales, as ``op.scheme``
    says. The float weight must have the float layer's shape."""
    if hasattr(op, "quantized_params"):  # a layer of several kernels knows their layout
        return op.quantized_params(params)
    if isinstance(op, QuantizedEmbedding):
        w = params["embedding"]
        values, scale = quantize_weight(w, op.scheme, reduce=(1,), axis=1, group=op.group_size)
        return {"embedding": values, "embedding_scale": scale}
    w = params["kernel"]
    if isinstance(op, QuantizedConv):
        out_axis, in_axis = 0, op._in_axis() % w.ndim
    else:
        out_axis, in_axis = w.ndim - 1, 0
    reduce = tuple(i for i in range(w.ndim) if i != out_axis)
    values, scale = quantize_weight(w, op.scheme, reduce=reduce, axis=in_axis,
                                    group=op.group_size)
    out = {"kernel": values, "kernel_scale": scale}
    if "bias" in params:
        out["bias"] = params["bias"]
    return out
