"""Merging LoRA adapters into the base weights: ``merge_lora`` gives the base graph back
with ``W + scale * A @ B`` folded into each adapted layer's weight."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import compile
from ..compiler.program import get_in, has_in, leaf_paths, set_in
from ..core.donated import refuse_deleted
from ..core.errors import ConfigError, GraphError, ShapeError
from ..core.signatures import unknown_keywords
from ..ir.graph import Graph
from ..ir.node import Node, Value
from ..ir.paths import is_adapter
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths
from ..ops.attention import MultiHeadAttention
from ..ops.conv import Conv
from ..ops.embedding import Embedding
from .lora import _PARTS, _SUM

__all__ = ["merge_lora"]


@dataclasses.dataclass(frozen=True)
class _Unlora(Rule):
    """Takes out the adapters' nodes; readers of ``<name>.lora`` read ``<name>`` again,
    and attention layers lose their adapters' inputs and second output."""

    def prepare(self, graph: Graph) -> Any:
        names = {node.name for node in graph.nodes}
        bases = {name[: -len(".lora_A")] for name in names if name.endswith(".lora_A")}
        bases = {base for base in bases if base + ".lora_B" in names and base + ".lora_scale" in names}
        dropped = {base + suffix for base in bases for suffix in _PARTS}
        sums = {}
        for base in bases:
            if base + _SUM in names:
                owner = base if base in names else base.rpartition(".")[0]
                sums[base + _SUM] = owner
        return dropped, sums

    def visit(self, node: Node, rewrite: Rewrite):
        dropped, sums = rewrite.data
        if node.name in dropped:
            return ()
        if node.name in sums:
            return (rewrite.read(Value(sums[node.name], 0)),)
        op: Any = node.op
        if isinstance(op, MultiHeadAttention) and op.adapters:
            inputs = node.inputs[: len(node.inputs) - len(op.delta_inputs)]
            return node.replace(op=dataclasses.replace(op, adapters=()), inputs=inputs)
        return None


def _without(tree: Mapping, drop: set[str], prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        path = prefix + key
        if path in drop:
            continue
        out[key] = _without(value, drop, path + "/") if isinstance(value, Mapping) else value
    return out


def _shared(graph: Graph, prefix: str = "") -> set[str]:
    """The paths of the layers whose weights another call uses too (a tied head)."""
    found = set()
    for node in graph.nodes:
        if node.shares_weights:
            found.add(prefix + node.layer)
        inner = node.op.subgraph()
        if inner is not None and not node.shares_weights:
            for name in getattr(node.op, "names", None) or (node.name,):
                found |= _shared(inner, f"{prefix}{name}/")
    return found


def _merge_conv(w: Any, a: Any, b: Any, scale: float) -> Any:
    """``W + scale * (B o A)`` for a Conv: ``B``'s 1x1 kernel ``(out, 1.., rank)`` (OHWI)
    or ``(out, rank, 1..)`` (OIHW) contracted with ``A``'s ``(rank, *k, in)`` or ``(rank,
    in, *k)`` over the rank axis gives ``(out, *k, in)`` or ``(out, in, *k)``."""
    rank = a.shape[0]
    b2 = jnp.reshape(b, (b.shape[0], rank)).astype(jnp.float32)   # every other axis is 1
    delta = jnp.tensordot(b2, a.astype(jnp.float32), axes=((1,), (0,)),
                          precision=jax.lax.Precision.HIGHEST)
    return (w.astype(jnp.float32) + scale * jnp.reshape(delta, w.shape)).astype(w.dtype)


def _merge_attention(params: dict, nodes: Mapping[str, Node], owner: str, projection: str,
                     shared: set[str]) -> dict:
    """``params`` with the adapter of ``owner``'s ``projection`` folded into its kernels:
    ``(d, heads, head_dim)`` for query, key, value (``qkv`` split into the three, in
    that order), ``(heads, head_dim, out)`` for out."""
    if owner in shared:
        raise GraphError(f"merge_lora: the weights of {owner!r} are used by another call too, "
                         f"which does not have the adapter; keep the adapter unmerged")
    scheme = getattr(nodes[owner].op, "scheme", None)
    if scheme is not None:
        raise GraphError(f"merge_lora: {owner!r} is quantized ({scheme}): folding the adapter "
                         f"in needs its float weights; merge into the float model's weights, "
                         f"then quantize")
    base = f"{owner}.{projection}"
    scale = nodes[base + ".lora_scale"].op.constant  # type: ignore[attr-defined]
    kernels = {p: _read(params, f"{owner}/{p}/kernel", owner) for p in ("query", "key", "value", "out")}
    a = _read(params, f"{base}.lora_A/kernel", owner)
    b = _read(params, f"{base}.lora_B/kernel", owner)
    delta = scale * jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                               precision=jax.lax.Precision.HIGHEST)
    if projection == "qkv":
        widths = [math.prod(kernels[p].shape[1:]) for p in ("query", "key")]
        parts = dict(zip(("query", "key", "value"),
                         jnp.split(delta, [widths[0], widths[0] + widths[1]], axis=1)))
    else:
        parts = {projection: delta}
    for p, d in parts.items():
        w = kernels[p]
        new = (w.astype(jnp.float32) + jnp.reshape(d, w.shape)).astype(w.dtype)
        params = set_in(params, (*owner.split("/"), p, "kernel"), new)
    return params


def _read(params: Mapping, path: str, layer: str) -> Any:
    """The weight at ``path`` (``/``-separated) in ``params``; a ``GraphError`` naming
    what is missing: the adapter of base params, or the layer in another layout."""
    try:
        return get_in(params, tuple(path.split("/")))
    except (KeyError, TypeError):
        pass
    if any(is_adapter(part) for part in path.split("/")):
        raise GraphError(f"merge_lora: params have no adapter weight {path!r} of {layer!r}: "
                         f"pass the adapted model's params (model.init(key, reuse=(base_params, "
                         f"base_state)) makes the adapters beside the base weights), unscanned: "
                         f"model.unstack_weights gives them from a scanned model's")
    raise GraphError(f"merge_lora: params have no weight {path!r} of {layer!r} (give the adapted "
                     f"graph's params, unscanned: model.unstack_weights gives them)")


def _check_adapter_shapes(graph: Graph, params: Mapping) -> None:
    """A ``ShapeError`` when the adapters' weights in ``params`` are not the shapes the
    graph's adapters take (another rank's, another graph's): folded in with this graph's
    scale they would give another model, as ``apply`` refuses them."""
    shapes = jax.eval_shape(compile(graph).init_fn, jax.random.key(0))[0]
    for path, spec in leaf_paths(shapes).items():
        if not any(is_adapter(part) for part in path.split("/")) or not has_in(params, tuple(path.split("/"))):
            continue
        given = tuple(np.shape(get_in(params, tuple(path.split("/")))))
        if given != tuple(spec.shape):
            raise ShapeError(f"merge_lora: params' adapter weight {path} has the shape {given}, "
                             f"and graph {graph.name!r} takes {tuple(spec.shape)} there (another "
                             f"rank, or another graph's params): pass the params of this adapted "
                             f"graph", expected=str(tuple(spec.shape)))


def merge_lora(graph: Graph, params: Mapping | None = None, *extra: Any,
               **unknown: Any) -> tuple[Graph, dict]:
    """The base graph back, with the adapters folded into its weights: ``(graph,
    params)`` where each adapted layer's weight is ``W + scale * A @ B`` (``A (in,
    rank)``, ``B (rank, out)`` as our Linear kernels are laid out: ``B @ A`` in PyTorch's
    ``(out, in)``; for a Conv, ``A``'s kernel contracted with ``B``'s 1x1 kernel over
    the rank axis) and the adapters' nodes and weights are gone. ``params`` are the
    adapted graph's, unscanned (``model.unstack_weights`` gives them from a scanned
    model's). The outputs equal the adapted model's (up to rounding).

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.Graph(x, ops.Linear(16, name="fc")(x))
      >>> g2 = mg.lora(g, "fc", rank=2)
      >>> params, state = mg.compile(g2).init(jax.random.key(0))
      >>> merged, merged_params = mg.merge_lora(g2, params)
      >>> merged == g, sorted(merged_params)
      (True, ['fc'])
    """
    if extra or unknown or params is None:
        state = "merging changes no state: keep the one you have"
        what = (f"{len(extra)} more positional argument(s) ({state})" if extra else
                unknown_keywords("merge_lora", unknown, "merge_lora(graph, params)",
                                 {"state": state}).split("; it takes")[0].removeprefix(
                                     "merge_lora got ") if unknown else "no params")
        raise ConfigError(f"merge_lora(graph, params) takes the adapted graph and its params "
                          f"and returns (graph, params); got {what}")
    refuse_deleted("merge_lora", params=params)
    if not isinstance(graph, Graph):
        raise GraphError(f"merge_lora works on a Graph, got {type(graph).__name__}")
    if not isinstance(params, Mapping):
        raise GraphError(f"merge_lora takes params (nested dicts), got {type(params).__name__}")
    graph = unfold_scans(graph)
    nodes = dict(layer_paths(graph))
    if not any(path.endswith(".lora_A") for path in nodes):
        raise GraphError(f"merge_lora: graph {graph.name!r} has no LoRA adapters, so there is "
                         f"nothing to fold in: pass the graph mg.lora (or mg.lora_from_peft) made")
    _check_adapter_shapes(graph, params)
    shared = _shared(graph)
    drop: set[str] = set()
    merged: dict = dict(params)
    for path in nodes:
        if not path.endswith(".lora_A"):
            continue
        base = path[: -len(".lora_A")]
        if base + ".lora_B" not in nodes or base + ".lora_scale" not in nodes:
            continue
        owner, _, projection = base.rpartition(".")
        if base not in nodes and isinstance(getattr(nodes.get(owner), "op", None), MultiHeadAttention):
            merged = _merge_attention(merged, nodes, owner, projection, shared)
            drop.update((base + ".lora_A", base + ".lora_B"))
            continue
        if base not in nodes:
            continue
        scheme = getattr(nodes[base].op, "scheme", None)
        if scheme is not None:
            raise GraphError(f"merge_lora: {base!r} is quantized ({scheme}): "
                             f"folding the adapter in needs its float weights; merge into the "
                             f"float model's weights, then quantize")
        if base in shared:
            raise GraphError(f"merge_lora: the weights of {base!r} are used by another call too "
                             f"(a tied output head), which does not have the adapter: folding "
                             f"it in would change that call's output; keep the adapter unmerged")
        scale_op: Any = nodes[base + ".lora_scale"].op
        scale = scale_op.constant
        weight = "embedding" if isinstance(nodes[base].op, Embedding) else "kernel"
        w = _read(params, f"{base}/{weight}", base)
        a = _read(params, f"{path}/{weight}", base)
        b = _read(params, f"{base}.lora_B/kernel", base)
        conv = nodes[base].op
        if isinstance(conv, Conv):
            if conv.groups != 1:
                raise GraphError(f"merge_lora: {base!r} is a grouped Conv (groups="
                                 f"{conv.groups}): its adapter's A reads every input "
                                 f"channel, which the grouped kernel cannot hold (PEFT does not "
                                 f"merge it either); keep the adapter unmerged")
            new = _merge_conv(w, a, b, scale)
            merged = set_in(merged, (*base.split("/"), weight), new)
            drop.update((base + ".lora_A", base + ".lora_B"))
            continue
        rank = a.shape[-1]
        delta = jnp.matmul(jnp.reshape(a, (-1, rank)).astype(jnp.float32),
                           jnp.reshape(b, (rank, -1)).astype(jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
        new = (w.astype(jnp.float32) + scale * jnp.reshape(delta, w.shape)).astype(w.dtype)
        merged = set_in(merged, (*base.split("/"), weight), new)
        drop.update((base + ".lora_A", base + ".lora_B"))
    return rewrite(graph, _Unlora(), memo={}), _without(merged, drop)
