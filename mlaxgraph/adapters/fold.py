"""Folding BatchNorm into the layer before it, for inference: ``fold_batch_norm`` gives
the graph back without the BatchNorms that follow a Conv, ConvTranspose or Linear,
their running statistics, scale and bias folded into that layer's kernel and bias.

At inference a BatchNorm is the per-channel affine map ``y * s + (bias - mean * s)``,
``s = scale / sqrt(var + epsilon)``; after a layer ``y = x @ W + b`` (or a convolution)
it is the same layer with ``W * s`` (each output channel scaled) and ``(b - mean) * s +
bias``. The graph is changed by one rule on the rewriter (blocks rewritten once per
distinct block, as everywhere), the weights at each block call's path.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from ..core.errors import FoldWarning, GraphError
from ..core.specs import ParamSpec
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.verify import verify
from ..ops.conv import Conv
from ..ops.conv_transpose import ConvTranspose
from ..ops.linear import Linear
from ..ops.normalization import BatchNorm

__all__ = ["fold_batch_norm"]

#: The layers a following BatchNorm folds into (exactly these: a quantized Conv or
#: Linear keeps its BatchNorm, its weights being integers).
FOLDS_INTO = (Conv, ConvTranspose, Linear)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What folds in one graph (its own nodes, not its blocks')."""

    folds: dict[str, str]  # BatchNorm node -> the node it folds into
    kept: dict[str, str]   # BatchNorm node -> why it stays


def _channel_axis(op: Any, rank: int) -> int:
    """The output's channel axis of a layer of ``FOLDS_INTO``, in ``[0, rank)``."""
    if isinstance(op, Linear):
        return rank - 1
    return rank - 1 if op.channels_last else 1


def _kernel_axis(op: Any) -> int:
    """The output-channel axis of the layer's kernel: 0 for convolutions (OHWI, OIHW;
    ConvTranspose's O is its output features too), -1 for Linear's ``(in, out)``."""
    return -1 if isinstance(op, Linear) else 0


def _why_not(graph: Graph, node: Node, shared: set[str]) -> str | None:
    """Why BatchNorm ``node`` of ``graph`` cannot fold into the layer before it (None
    when it can)."""
    if node.shares_weights or node.name in shared:
        return "its weights are used by another call too"
    source = node.inputs[0]
    producer = graph.node(source.node)
    if producer.name in graph.inputs:
        return f"it reads the graph's input {producer.name!r}, not a layer's output"
    op: Any = producer.op
    name = f"{producer.op.op_name} {producer.name!r}"
    if getattr(op, "scheme", None) is not None or op.op_name == "dequantize":
        return (f"it reads {name}, a quantized layer's: fold the float graph, then quantize "
                f"(mg.quantize(mg.fold_batch_norm(graph, params, state)[0], ...))")
    if type(op) not in FOLDS_INTO:
        return f"it reads {name}, not a Conv, ConvTranspose or Linear"
    if getattr(op, "activation", None) is not None:
        return f"{name} applies {op.activation!r} before it"
    if producer.shares_weights or producer.name in shared:
        return f"the weights of {name} are used by another call too"
    others = [n.name for n in graph.consumers()[producer.name] if n.name != node.name]
    if others:
        return f"the output of {name} is read by {others[0]!r} too"
    if any(v.node == producer.name for v in graph.outputs):
        return f"the output of {name} is an output of the graph too"
    rank = graph.spec(source).rank
    if node.op.axis % rank != _channel_axis(op, rank):  # type: ignore[attr-defined]
        return (f"it normalizes axis {node.op.axis}, and the channels of {name} are "  # type: ignore[attr-defined]
                f"axis {_channel_axis(op, rank)}")
    return None


def _plan(graph: Graph) -> _Plan:
    memo = graph.memo("fold_batch_norm")
    plan = memo.get("plan")
    if plan is None:
        shared = {n.layer for n in graph.nodes if n.shares_weights}
        folds, kept = {}, {}
        for node in graph.nodes:
            if isinstance(node.op, BatchNorm):
                why = _why_not(graph, node, shared)
                if why is None:
                    folds[node.name] = node.inputs[0].node
                else:
                    kept[node.name] = why
        plan = memo["plan"] = _Plan(folds, kept)
    return plan


def _blocks(graph: Graph):
    """Each block call that owns its weights: (name its weights are under, its graph)."""
    for node in graph.nodes:
        inner = node.op.subgraph()
        if inner is not None and not node.shares_weights:
            for name in getattr(node.op, "names", None) or (node.name,):
                yield name, inner


def _any_fold(graph: Graph) -> bool:
    memo = graph.memo("fold_batch_norm")
    found = memo.get("any")
    if found is None:
        found = memo["any"] = bool(_plan(graph).folds) or any(
            _any_fold(inner) for _, inner in _blocks(graph))
    return found


def _kept(graph: Graph, prefix: str = "") -> list[str]:
    """``path (reason)`` of each BatchNorm that stays, through the blocks."""
    lines = [f"{prefix}{name} ({why})" for name, why in _plan(graph).kept.items()]
    for name, inner in _blocks(graph):
        lines += _kept(inner, f"{prefix}{name}/")
    return lines


@dataclasses.dataclass(frozen=True)
class _Fold(Rule):
    """Drops each foldable BatchNorm (its readers read the layer before it) and gives
    that layer a bias."""

    def prepare(self, graph: Graph) -> Any:
        folds = _plan(graph).folds
        return folds, set(folds.values())

    def visit(self, node: Node, rewrite: Rewrite):
        folds, into = rewrite.data
        if node.name in folds:
            return (node.inputs[0],)
        op: Any = node.op
        if node.name in into and not op.use_bias:
            return node.replace(op=dataclasses.replace(op, use_bias=True))
        return None


# --- the weights ----------------------------------------------------------------------


def _hint(level: Mapping, graph: Graph) -> str:
    """What to give instead, naming a scanned model's stacked entry if ``level`` has one."""
    stacked = next((k for k in level if ".." in k and k not in graph), None)
    if stacked is not None:
        return (f"these are a scanned model's, stacked under {stacked!r}: give "
                f"model.unstack_weights(params, state), and stack the folded ones with "
                f"mg.compile(folded_graph, scan_blocks=...).stack_weights")
    return "give the graph's own params and state, as init or mg.load give them"


def _weights(level: Mapping, graph: Graph, name: str, specs: Mapping[str, ParamSpec], path: str,
             what: str) -> dict:
    """The entries ``specs`` names of layer ``name`` in ``level`` (a dict of params or
    state), each checked against its spec's shape."""
    if not specs:
        return {}
    entry = level.get(name)
    have = "have" if what == "params" else "has"
    if not isinstance(entry, Mapping):
        raise GraphError(f"fold_batch_norm: {what} {have} no entry for layer {path!r}; "
                         f"{_hint(level, graph)}")
    out = {}
    for key, spec in specs.items():
        value = entry.get(key)
        if value is None:
            raise GraphError(f"fold_batch_norm: {what} of layer {path!r} {have} no {key!r}; "
                             f"{_hint(level, graph)}")
        if tuple(getattr(value, "shape", ())) != tuple(spec.shape):
            raise GraphError(f"fold_batch_norm: {what} {path}/{key} has shape "
                             f"{tuple(getattr(value, 'shape', ()))}, and the graph makes "
                             f"{tuple(spec.shape)}: these weights are another graph's")
        out[key] = value
    return out


def _host(value: Any) -> np.ndarray:
    return np.asarray(value, np.float64)


def _placed(value: np.ndarray, dtype: Any, like: Any, axis: int | None = None) -> Any:
    """``value`` as a jax array of ``dtype``, placed as ``like`` is (the same sharding; with
    ``axis``, ``value`` is a bias and takes the sharding of ``like``'s axis ``axis``)."""
    value = value.astype(dtype)
    sharding = getattr(like, "sharding", None)
    if axis is not None and isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (like.ndim - len(sharding.spec))
        sharding = NamedSharding(sharding.mesh, PartitionSpec(spec[axis]))
    elif axis is not None and not isinstance(sharding, SingleDeviceSharding):
        sharding = None
    return jnp.asarray(value) if sharding is None else jax.device_put(value, sharding)


def _fold_one(layer: dict, norm: dict, stats: dict, producer: Any, bn: Any) -> dict:
    """The layer's kernel and bias with the BatchNorm folded in, computed in float64 on
    the host and cast back to each weight's dtype (a new bias takes the kernel's), each
    placed as the weight it replaces."""
    kernel = layer["kernel"]
    axis = _kernel_axis(producer) % kernel.ndim
    s = 1.0 / np.sqrt(_host(stats["var"]) + float(bn.epsilon))
    if "scale" in norm:
        s = s * _host(norm["scale"])
    shape = [1] * kernel.ndim
    shape[axis] = s.shape[0]
    new = _host(kernel) * s.reshape(shape)
    bias = layer.get("bias")
    b = (-_host(stats["mean"]) if bias is None else _host(bias) - _host(stats["mean"])) * s
    if "bias" in norm:
        b = b + _host(norm["bias"])
    return {"kernel": _placed(new, kernel.dtype, kernel),
            "bias": (_placed(b, kernel.dtype, kernel, axis) if bias is None
                     else _placed(b, bias.dtype, bias))}


def _fold_weights(graph: Graph, params: Mapping, state: Mapping, prefix: str) -> tuple[dict, dict]:
    """``params`` and ``state`` of ``graph`` (at ``prefix``) with its folds made, and its
    blocks'. A dict left empty is dropped, as ``init`` leaves none."""
    p, s = dict(params), dict(state)
    for bn_name, name in _plan(graph).folds.items():
        producer, bn = graph.node(name), graph.node(bn_name)
        specs = graph.input_specs_of(producer)
        layer = _weights(params, graph, name, producer.op.param_specs(specs), prefix + name,
                         "params")
        bn_specs = graph.input_specs_of(bn)
        norm = _weights(params, graph, bn_name, bn.op.param_specs(bn_specs), prefix + bn_name,
                        "params")
        stats = _weights(state, graph, bn_name, bn.op.state_specs(bn_specs), prefix + bn_name,
                         "state")
        p[name] = {**params[name], **_fold_one(layer, norm, stats, producer.op, bn.op)}
        p.pop(bn_name, None)
        s.pop(bn_name, None)
    for name, inner in _blocks(graph):
        if not _any_fold(inner):
            continue
        if not isinstance(params.get(name), Mapping):
            raise GraphError(f"fold_batch_norm: params have no entry for block "
                             f"{prefix + name!r}; {_hint(params, graph)}")
        inner_state = state.get(name, {})
        if not isinstance(inner_state, Mapping):
            raise GraphError(f"fold_batch_norm: state of block {prefix + name!r} is a "
                             f"{type(inner_state).__name__}, not a dict")
        p[name], new_state = _fold_weights(inner, params[name], inner_state, f"{prefix}{name}/")
        if new_state:
            s[name] = new_state
        else:
            s.pop(name, None)
    return p, s


def fold_batch_norm(graph: Graph, params: Mapping, state: Mapping) -> tuple[Graph, dict, dict]:
    """For inference: ``(graph, params, state)`` with every BatchNorm that follows a
    Conv, ConvTranspose or Linear folded into that layer.

    The layer's kernel is scaled per output channel by ``s = scale / sqrt(var +
    epsilon)`` and its bias becomes ``(b - mean) * s + bias`` (a layer without a bias
    gets one: ``use_bias=True``), computed in float64 on the host and cast back to the
    weights' dtype, each placed (sharded) as the weight it replaces; the BatchNorm's node, params and state are gone.
    The layer keeps its name, so its weights keep their path. Blocks are folded inside
    (each block call's weights at its own path); a graph with scanned runs is given
    back unscanned (``mg.compile(..., scan_blocks=...)`` folds its equal blocks again),
    and ``params`` and ``state`` are the graph's own layout: a scanned model's
    ``model.unstack_weights`` gives them.

    A BatchNorm stays where folding would change what the model computes or is not
    the affine map above: it reads something else than a Conv, ConvTranspose or
    Linear (a block's input, a sum, a quantized layer), that layer applies an
    activation, its output is read by another node too, its weights or the BatchNorm's
    are shared with another call, or the BatchNorm's axis is not the layer's channel
    axis. Those are listed, each with its reason, in one ``mg.FoldWarning``; a graph
    without any BatchNorm comes back as it is, without warning. The result is for
    inference only: training it would train the folded layer, without BatchNorm.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8, 8, 3), name="x")
      >>> h = ops.BatchNorm(name="bn")(ops.Conv(4, 3, use_bias=False, name="conv")(x))
      >>> g = mg.Graph(x, ops.relu(h))
      >>> params, state = mg.compile(g).init(jax.random.key(0))
      >>> folded, fparams, fstate = mg.fold_batch_norm(g, params, state)
      >>> [n.name for n in folded.nodes], sorted(fparams["conv"]), fstate
      (['x', 'conv', 'relu'], ['bias', 'kernel'], {})
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"fold_batch_norm works on a Graph, got {type(graph).__name__}")
    for what, tree in (("params", params), ("state", state)):
        if not isinstance(tree, Mapping):
            raise GraphError(f"fold_batch_norm takes {what} (nested dicts, as init gives "
                             f"them), got {type(tree).__name__}")
    flat = unfold_scans(graph)
    kept = _kept(flat)
    if kept:
        warnings.warn(f"fold_batch_norm kept {len(kept)} BatchNorm{'s' * (len(kept) > 1)} it "
                      f"cannot fold: " + "; ".join(kept), FoldWarning, stacklevel=2)
    if not _any_fold(flat):
        return graph, dict(params), dict(state)
    new_params, new_state = _fold_weights(flat, params, state, "")
    folded = rewrite(flat, _Fold())
    verify(folded)
    return folded, new_params, new_state
