"""Quantization as one rewrite: ``mg.quantize`` turns the layers a selection names
into their quantized forms (``mlaxgraph/ops/quantized.py``), with a ``Quantize`` node
before each layer that reads its input quantized, so every change of precision is a
node of the graph; ``mg.quantize_weights`` makes their weights from float ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import compile
from ..compiler.program import get_in, leaf_paths, set_in
from ..core.errors import ConfigError, GraphError, ShapeError, SourceInfo, capture_source, node_message
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths, resolve_selection
from ..ir.verify import verify
from ..ops.conv import Conv
from ..ops.dequantize import Dequantize
from ..ops.quantize import SCHEMES, Quantize, quantize_weight, range_scale
from ..ops.quantized import QuantizedConv, QuantizedLinear
from ..ops.quantized_attention import QuantizedMultiHeadAttention
from ..ops.quantized_embedding import QuantizedEmbedding
from .gptq import gptq_params, hessians

__all__ = ["quantize", "quantize_weights", "QUANTIZABLE", "QUANTIZED_OPS", "ONE_SIGNED"]

#: The quantized op classes by the float op's name.
QUANTIZED_OPS: dict[str, type] = {"linear": QuantizedLinear, "conv": QuantizedConv,
                                  "embedding": QuantizedEmbedding,
                                  "multi_head_attention": QuantizedMultiHeadAttention}
#: The float ops each scheme quantizes.
QUANTIZABLE = {"int8": ("linear", "conv", "embedding", "multi_head_attention"),
               "int8_weight_only": ("linear", "conv", "embedding", "multi_head_attention"),
               "int4_weight_only": ("linear", "conv", "embedding", "multi_head_attention"),
               "float8": ("linear", "multi_head_attention")}
#: int4's group size when none is given.
DEFAULT_GROUP = 128


def quantize(graph: Graph, scheme: str, *, targets: Any = None,
             group_size: int | None = None) -> Graph:
    """``graph`` with the layers ``targets`` selects quantized by ``scheme``.

    ``scheme`` is ``"int8"`` (int8 weights, one scale per output channel; the input
    quantized to int8 per token, one scale per example for a Conv; an int8 x int8 ->
    int32 product), ``"int8_weight_only"`` (the same weights, float input),
    ``"int4_weight_only"`` (weights in ``[-8, 7]``, one scale per group of
    ``group_size`` inputs, 128 unless given, two values a byte) or ``"float8"`` (e4m3
    weights and input, one scale per output channel and per token; Linear layers and
    attention only). Each targeted layer becomes its quantized op (``quantized_linear``,
    ``quantized_conv``, ``quantized_embedding``, ``quantized_multi_head_attention``)
    under the same name, so its weights keep their path; with int8 and float8 a
    ``Quantize`` node ``<name>.quantize`` before a Linear, Conv or tied head casts its
    input, with the scale as its second output, and a ``Dequantize`` node
    ``<name>.dequantize`` after it turns the layer's int32 (float8: float32) product
    back into floats (the scales, the bias and the activation); with int8, one before a Linear whose
    input is the output of a one-signed activation (``ONE_SIGNED``: ReLU, GELU, SiLU
    ...) is asymmetric (``zero_point=True``: the token's range ``[min, max]`` over the
    256 levels, a zero point as third output). An attention quantizes its projections'
    inputs inside it with int8 (per token), and dequantizes its kernels with the other
    schemes. A tied head (``embedding.attend``) is the same layer, quantized with it.

    ``targets``: a path, glob pattern or list of paths (what ``graph.select``
    returns); None takes every layer the scheme quantizes (LoRA adapters aside).
    A targeted layer the scheme cannot quantize, or whose input size ``group_size``
    does not divide, is an ``mg.ConfigError`` naming it; a selection of nothing an
    ``mg.GraphError``. The new graph's weights come from float ones through
    ``mg.quantize_weights``.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.Graph(x, ops.Linear(4, name="head")(ops.Linear(16, name="fc")(x)))
      >>> qg = mg.quantize(g, "int8")
      >>> [n.name for n in qg.nodes], qg.node("fc").op.op_name
      (['x', 'fc.quantize', 'fc', 'fc.dequantize', 'head.quantize', 'head', 'head.dequantize'], 'quantized_linear')
    """
    source = capture_source()
    if not isinstance(graph, Graph):
        raise GraphError(f"quantize works on a Graph, got {type(graph).__name__}")
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ConfigError(f"quantize: scheme must be one of {', '.join(map(repr, SCHEMES))}, "
                          f"got {scheme!r}")
    if scheme == "int4_weight_only":
        group_size = DEFAULT_GROUP if group_size is None else group_size
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2 \
                or group_size % 2:
            raise ConfigError(f"quantize: group_size must be an even int >= 2 (32 or 128), "
                              f"got {group_size!r}")
    elif group_size is not None:
        raise ConfigError(f"quantize: group_size is for 'int4_weight_only', not {scheme!r}")
    graph = unfold_scans(graph)
    nodes = dict(layer_paths(graph))
    if targets is None:
        paths = [path for path, node in nodes.items() if node.op.op_name in QUANTIZABLE[scheme]
                 and not path.endswith((".lora_A", ".lora_B"))]
        if not paths:
            raise ConfigError(f"quantize: graph {graph.name!r} has no layer {scheme!r} "
                              f"quantizes ({', '.join(QUANTIZABLE[scheme])})")
    else:
        paths = resolve_selection(graph, targets, "quantize")
    for path in paths:
        _check_target(path, nodes[path], graph, scheme, group_size, source)
    rule = _Quantize(frozenset(tuple(path.split("/")) for path in paths), scheme, group_size,
                     source)
    result = rewrite(graph, rule, memo={})
    verify(result)
    return result


def _check_target(path: str, node: Node, graph: Graph, scheme: str, group: int | None,
                  source: SourceInfo | None) -> None:
    op = node.op
    if isinstance(op, tuple(QUANTIZED_OPS.values())):
        raise ConfigError(node_message(path, op.op_name, "this layer is quantized already",
                                       source=source))
    if op.op_name not in QUANTIZABLE[scheme]:
        raise ConfigError(node_message(
            path, op.op_name,
            f"scheme {scheme!r} does not quantize op {op.op_name!r} (it quantizes "
            f"{', '.join(QUANTIZABLE[scheme])}); select those layers instead", source=source))
    if group is None:
        return
    inner = _inner_graph(graph, path)
    specs = inner.input_specs_of(inner.node(path.split("/")[-1]))
    try:
        _quantized_op(op, specs, scheme, group).param_specs(specs)
    except ShapeError as e:
        raise ConfigError(node_message(
            path, op.op_name,
            f"{e.problem}; pass group_size=32 (or another even divisor) or leave this layer "
            f"out of targets", source=source)) from None


def _quantized_op(op: Any, specs: Any, scheme: str, group: int | None) -> Any:
    """The quantized form of float layer ``op`` (its input specs resolve a Conv's
    kernel size)."""
    if isinstance(op, Conv):
        op = op.resolved(specs)
    cls = QUANTIZED_OPS[op.op_name]
    # A Dequantize node rescales the product of a layer reading a quantized input.
    attrs = op.attrs()
    if scheme in ("int8", "float8") and cls is not QuantizedMultiHeadAttention:
        attrs["dequantize"] = False
        if attrs.get("activation") is not None:  # the Dequantize node applies it
            attrs["activation"] = None
    return cls(**attrs, scheme=scheme, group_size=group, name=op.name)


def _inner_graph(graph: Graph, path: str) -> Graph:
    """The graph holding the layer at ``path`` (a block's for a nested path)."""
    for name in path.split("/")[:-1]:
        for node in graph.nodes:
            inner = node.op.subgraph()
            if name in (getattr(node.op, "names", None) or (node.name,)) and inner is not None:
                graph = inner
                break
    return graph


@dataclasses.dataclass(frozen=True)
class _Quantize(Rule):
    targets: frozenset[tuple[str, ...]]
    scheme: str
    group_size: int | None
    source: SourceInfo | None = dataclasses.field(compare=False, hash=False)

    def nested(self, node: Node) -> Rule | None:
        inner = frozenset(t[1:] for t in self.targets
                          if len(t) > 1 and t[0] in (node.name, node.layer))
        return dataclasses.replace(self, targets=inner) if inner else None

    def visit(self, node: Node, rewrite: Rewrite):
        if (node.layer,) not in self.targets:
            return None
        quantized = _quantized_op(node.op, [rewrite.spec(v) for v in node.inputs], self.scheme,
                                  self.group_size)
        x = node.inputs[0]
        attends = isinstance(quantized, QuantizedEmbedding) and rewrite.spec(x).is_float
        if not quantized.quantizes_inputs or (isinstance(quantized, QuantizedEmbedding)
                                              and not attends):
            return node.replace(op=quantized)
        rank = rewrite.spec(x).rank
        axes = tuple(range(1, rank)) if isinstance(quantized, Conv) else (-1,)
        name = rewrite.fresh(node.name + ".quantize")
        zero = (self.scheme == "int8" and isinstance(quantized, QuantizedLinear)
                and _one_signed(rewrite, x))
        cast = Quantize(quantized.input_dtype, axes, zero_point=zero, name=name)
        q = rewrite.emit(Node(name, cast, (x,), (), name, self.source), infer=True)
        # The layer's product, then a Dequantize node: scales, bias, activation.
        activation = getattr(node.op, "activation", None)
        layer = quantized
        kept = rewrite.keep(node.replace(op=layer, inputs=tuple(q.value(i)
                                                                for i in range(2 + zero))))
        axis = 1 if isinstance(layer, Conv) and not layer.channels_last else -1
        name = rewrite.fresh(node.name + ".dequantize")
        back = Dequantize(activation, axis, name=name)
        inputs = (kept.value(0), q.value(1)) + tuple(kept.value(i)
                                                     for i in range(1, len(kept.outputs)))
        d = rewrite.emit(Node(name, back, inputs, (), name, self.source), infer=True)
        return (d.value(0),)


#: Activations whose outputs are of one sign but for a small bound (ReLU's >= 0,
#: GELU's >= -0.17, SiLU's >= -0.28): a symmetric int8 range wastes half its levels on
#: them.
ONE_SIGNED = ("relu", "relu6", "gelu", "silu", "sigmoid", "softplus", "softmax", "elu")


def _one_signed(rewrite: Rewrite, x: Any) -> bool:
    """Whether value ``x`` is the output of an activation of ``ONE_SIGNED`` (as its own
    layer, or the ``activation`` of a Linear or Conv)."""
    producer = next((n for n in reversed(rewrite.nodes) if n.name == x.node), None)
    if producer is None:
        return False
    op = producer.op
    return op.op_name in ONE_SIGNED or getattr(op, "activation", None) in ONE_SIGNED


# --- weights ----------------------------------------------------------------------------


def quantize_weights(qgraph: Graph, params: Mapping, state: Mapping | None = None, *,
                     calibration: Iterable | None = None, method: str = "absmax",
                     static_scales: bool | None = None) -> tuple[dict, dict]:
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
    if method not in ("absmax", "gptq"):
        raise ConfigError(f"quantize_weights: method must be 'absmax' or 'gptq', got {method!r}")
    if static_scales not in (None, True, False):
        raise ConfigError(f"quantize_weights: static_scales must be a bool or None, got "
                          f"{static_scales!r}")
    if calibration is None and (method == "gptq" or static_scales):
        raise ConfigError(f"quantize_weights: {'method=' + repr(method) if method == 'gptq' else 'static_scales=True'} "
                          f"needs calibration=batches (a few input batches)")
    batches = None if calibration is None else list(calibration)
    if static_scales is None:
        static_scales = batches is not None and method == "absmax"
    qgraph = unfold_scans(qgraph)
    expected, expected_state = jax.eval_shape(compile(qgraph).init_fn, jax.random.key(0))
    out, state, casts = _weights(qgraph, params, state, expected, {})
    _check(qgraph.name, None, state, expected_state, "state")
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
            raise GraphError(node_message(
                path, node.op.op_name, "params have no weights for this layer (give the float "
                "model's params, unscanned: model.unstack_weights gives them)")) from None
        if isinstance(node.op, tuple(QUANTIZED_OPS.values())) and not _stored(given, want):
            given = _quantized(path, node, given, want, found.get(path))
        if isinstance(want, Mapping) and "kernel_sum" in want and "kernel_sum" not in given:
            # the column sums a zero point's correction reads, from the int8 kernel
            given = {**given, "kernel_sum": jnp.sum(jnp.asarray(given["kernel"]), axis=0,
                                                    dtype=jnp.int32)}
        _check(path, node, given, want)
        out = set_in(out, keys, dict(given))
    return out, dict(state), casts


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
    largest: dict[str, jax.Array] = {}
    lowest: dict[str, jax.Array] = {}
    for batch in batches:
        inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        _, _, captured = apply(params, state, *inputs, inference_mode=True, capture=casts)
        for path in casts:
            out = captured[path]
            scale = out[1].astype(jnp.float32)
            if len(out) == 3:  # asymmetric: the range [low, high] each scale covers
                zero = out[2].astype(jnp.float32)
                top, bottom = jnp.max((127 - zero) * scale), jnp.min((-128 - zero) * scale)
                lowest[path] = bottom if path not in lowest else jnp.minimum(lowest[path],
                                                                            bottom)
            else:
                top = jnp.max(scale)
            largest[path] = top if path not in largest else jnp.maximum(largest[path], top)
    if not largest:
        raise ConfigError("quantize_weights: calibration gave no batch; pass a few input "
                          "batches (or calibration=None for per-call scales)")
    for path in casts:
        keys = tuple(path.split("/"))
        if path in lowest:
            scale, zero = range_scale(jnp.stack([lowest[path], largest[path]]), (0,))
            state = set_in(state, keys, {"scale": scale[0], "zero": zero[0]})
        else:
            state = set_in(state, keys, {"scale": largest[path]})
    return state


def _stored(given: Mapping, want: Mapping) -> bool:
    """Whether ``given`` holds stored (already quantized) weights: its values and
    scales have the quantized layer's dtypes."""
    have = leaf_paths(given)
    return all(k in have and np.dtype(have[k].dtype) == np.dtype(w.dtype)
               for k, w in leaf_paths(want).items()
               if np.dtype(w.dtype).itemsize == 1 or k.endswith("_scale"))


def _quantized(path: str, node: Node, given: Mapping, want: Mapping,
               found: Mapping[str, Any] | None) -> dict:
    op: Any = node.op
    weight = "embedding" if isinstance(op, QuantizedEmbedding) else "kernel"
    floats = [leaf for key, leaf in leaf_paths(given).items() if key.endswith(weight)]
    if not floats or not all(np.issubdtype(np.dtype(leaf.dtype), np.floating) for leaf in floats):
        raise GraphError(node_message(path, op.op_name,
                                      f"params have no float {weight!r} for this layer to "
                                      f"quantize"))
    try:
        rounded = None if found is None else gptq_params(op, dict(given), found)
        return quantize_params(op, dict(given)) if rounded is None else rounded
    except (TypeError, ValueError) as e:
        raise GraphError(node_message(path, op.op_name,
                                      f"its float {weight!r} is not this layer's: {e}")) from None


def _check(path: str, node: Node | None, given: Any, want: Any, what: str = "params") -> None:
    """``given`` has the keys, shapes and dtypes of ``want`` (eval_shape's structs)."""
    op_name = node.op.op_name if node is not None else "graph"
    if isinstance(want, Mapping):
        if not isinstance(given, Mapping) or set(given) != set(want):
            have = sorted(given) if isinstance(given, Mapping) else type(given).__name__
            raise GraphError(node_message(path, op_name, f"{what} hold {have}, the quantized "
                                                         f"layer needs {sorted(want)}"))
        for key in want:
            _check(f"{path}/{key}", node, given[key], want[key], what)
        return
    if tuple(given.shape) != tuple(want.shape) or np.dtype(given.dtype) != np.dtype(want.dtype):
        raise GraphError(node_message(
            path, op_name, f"weight is {np.dtype(given.dtype).name}{list(given.shape)}, the "
                           f"quantized graph needs {np.dtype(want.dtype).name}{list(want.shape)}"))


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
