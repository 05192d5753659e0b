"""LoRA: low-rank adapters beside the layers a selection names, as one rewrite.

Each targeted layer ``<name>`` gets the nodes ``<name>.lora_dropout`` (with dropout),
``<name>.lora_A``, ``<name>.lora_B`` (the two low-rank factors, layers of their own
with their own weights), ``<name>.lora_scale`` (times ``alpha / rank``) and
``<name>.lora`` (the sum), which the layer's readers read instead of it. The layer
itself keeps its name, so its weights keep their paths. The rewrite goes through
nested blocks once per distinct block: equal blocks stay equal, and still fold into
one scan, the adapters stacked along the run like every block weight.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ..compiler.program import get_in, set_in
from ..core.errors import ConfigError, GraphError, SourceInfo, capture_source, node_message
from ..ir.graph import Graph
from ..ir.node import Node, Value
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths, resolve_selection
from ..ir.verify import verify
from ..ops import initializers
from ..ops.conv import Conv
from ..ops.dropout import Dropout
from ..ops.elementwise import Add, Mul
from ..ops.embedding import Embedding
from ..ops.linear import Linear

__all__ = ["lora", "lora_params", "merge_lora", "lora_a_uniform", "lora_a_uniform_conv"]

#: The adapter's nodes beside layer ``<name>``: ``<name><suffix>``.
_PARTS = (".lora_dropout", ".lora_A", ".lora_B", ".lora_scale")
#: The node summing the layer's output and the adapter's: ``<name>.lora``.
_SUM = ".lora"
#: The op names ``lora`` adapts (a quantized layer's adapter is float: QLoRA).
ADAPTED_OPS = ("linear", "embedding", "conv", "quantized_linear", "quantized_embedding",
               "quantized_conv")


def lora_a_uniform(key, shape, dtype):
    """PEFT's default for ``lora_A``: PyTorch's ``kaiming_uniform_(a=sqrt(5))``, that is
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, fan_in the kernel's input size
    (all axes but the last of a ``(in, rank)`` kernel)."""
    fan_in = math.prod(shape[:-1])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def lora_a_uniform_conv(key, shape, dtype):
    """PEFT's default for a Conv's ``lora_A``: uniform in ``[-1/sqrt(fan_in),
    1/sqrt(fan_in)]``, fan_in = in_channels * prod(kernel_size): all axes but the first
    of our ``(rank, *kernel_size, in)`` (OHWI) or ``(rank, in, *kernel_size)`` (OIHW)
    kernel."""
    fan_in = math.prod(shape[1:])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"lora: {name} must be a number, got {value!r}")
    return float(value)


def _scale(rank: Any, alpha: Any, dropout: Any, use_rslora: Any) -> float:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"lora: rank must be a positive int, got {rank!r}")
    alpha = float(rank) if alpha is None else _number("alpha", alpha)
    if alpha <= 0:
        raise ConfigError(f"lora: alpha must be > 0 (the adapter's output is scaled by "
                          f"alpha / rank), got {alpha!r}")
    dropout = _number("dropout", dropout)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"lora: dropout must be in [0, 1), got {dropout!r}")
    if not isinstance(use_rslora, bool):
        raise ConfigError(f"lora: use_rslora must be a bool, got {use_rslora!r}")
    return alpha / (math.sqrt(rank) if use_rslora else rank)


def lora(graph: Graph, targets: Any, *, rank: int, alpha: float | None = None,
         dropout: float = 0.0, use_rslora: bool = False) -> Graph:
    """``graph`` with a low-rank adapter beside each layer ``targets`` selects.

    Each target's output ``y`` becomes ``y + scale * B(A(dropout(x)))``, ``scale`` being
    ``alpha / rank`` (``alpha / sqrt(rank)`` with ``use_rslora``; ``alpha`` defaults to
    ``rank``, as in PEFT). ``A`` and ``B`` are layers of their own, ``<name>.lora_A``
    and ``<name>.lora_B`` beside the target ``<name>``, so their weights sit at their
    own paths and the base weights keep theirs: ``init(key, reuse=(params, state))``
    keeps every base weight. ``B`` starts at zero, so the adapted model starts equal to
    the base model. ``A`` is drawn as PEFT draws it (``lora_a_uniform``).

    Targets are a path, a glob pattern or a list of paths (what ``graph.select``
    returns). Linear layers (without a fused activation) and Embeddings are adapted;
    for an Embedding, as PEFT, ``A`` is a table of ``rank`` columns that starts at zero
    and ``B`` a Linear drawn normal, and dropout does not apply (its input is ids). For
    a Conv (without a fused activation, ungrouped), as PEFT, ``A`` is a Conv of ``rank``
    outputs with the target's kernel size, strides, padding and dilation, ``B`` a 1x1
    Conv (zeros), both without bias (``lora_a_uniform_conv`` draws ``A``). Another op,
    or a grouped Conv, is an ``mg.ConfigError`` naming the layer.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.Graph(x, ops.Linear(4, name="head")(ops.Linear(16, name="fc")(x)))
      >>> g2 = mg.lora(g, "fc", rank=2)
      >>> [node.name for node in g2.nodes]
      ['x', 'fc', 'fc.lora_A', 'fc.lora_B', 'fc.lora_scale', 'fc.lora', 'head']
    """
    source = capture_source()
    scale = _scale(rank, alpha, dropout, use_rslora)
    if not isinstance(graph, Graph):
        raise GraphError(f"lora works on a Graph, got {type(graph).__name__}")
    graph = unfold_scans(graph)
    paths = resolve_selection(graph, targets, "lora")
    nodes = dict(layer_paths(graph))
    for path in paths:
        _check_target(path, nodes[path], source)
    rule = _Lora(frozenset(tuple(path.split("/")) for path in paths), rank, scale,
                 float(dropout), source)
    result = rewrite(graph, rule, memo={})
    verify(result)
    return result


def _check_target(path: str, node: Node, source: SourceInfo | None) -> None:
    op = node.op
    if op.op_name not in ADAPTED_OPS:
        raise ConfigError(node_message(
            path, op.op_name,
            f"LoRA does not adapt op {op.op_name!r} yet (it adapts {', '.join(ADAPTED_OPS)}); "
            f"select those layers instead", source=source))
    if isinstance(op, (Linear, Conv)) and op.activation is not None:
        kind = type(op).__name__
        raise ConfigError(node_message(
            path, op.op_name,
            f"LoRA adds beside a {kind}'s output before any activation, and this one applies "
            f"{op.activation!r} itself; build it as a {kind} followed by the activation",
            source=source))
    if isinstance(op, Conv) and op.groups != 1:
        raise ConfigError(node_message(
            path, op.op_name,
            f"LoRA does not adapt a grouped Conv (groups={op.groups}), as PEFT does not; "
            f"select ungrouped convolutions", source=source))


@dataclasses.dataclass(frozen=True)
class _Lora(Rule):
    targets: frozenset[tuple[str, ...]]
    rank: int
    scale: float
    dropout: float
    source: SourceInfo | None = dataclasses.field(compare=False, hash=False)

    def nested(self, node: Node) -> Rule | None:
        inner = frozenset(t[1:] for t in self.targets
                          if len(t) > 1 and t[0] in (node.name, node.layer))
        return dataclasses.replace(self, targets=inner) if inner else None

    def visit(self, node: Node, rewrite: Rewrite):
        if (node.name,) not in self.targets:
            return None
        name = node.name
        taken = [name + suffix for suffix in (*_PARTS, _SUM) if name + suffix in rewrite.names]
        if taken:
            raise ConfigError(node_message(
                name, node.op.op_name,
                f"the graph already has {taken[0]!r}: this layer has an adapter already "
                f"(merge_lora folds it in first)", source=self.source))
        kept = rewrite.keep(node)

        def emit(suffix: str, op: Any, inputs: tuple[Value, ...]) -> Value:
            new = name + suffix
            return rewrite.emit(Node(new, op, inputs, (), new, self.source), infer=True).value()

        x = kept.inputs[0]
        if getattr(node.op, "quantizes_inputs", False):
            # The adapter reads the float input, not the Quantize node's int8 cast of it.
            x = next(n for n in reversed(rewrite.nodes) if n.name == x.node).inputs[0]
        if isinstance(node.op, Embedding):
            a = emit(".lora_A", Embedding(node.op.num_embeddings, self.rank, dtype=node.op.dtype,
                                          embedding_init=initializers.zeros,
                                          name=name + ".lora_A"), (x,))
            b_init = jax.nn.initializers.normal(1.0)
            b = emit(".lora_B", Linear(node.op.features, use_bias=False, kernel_init=b_init,
                                       name=name + ".lora_B"), (a,))
        elif isinstance(node.op, Conv):
            if self.dropout > 0:
                x = emit(".lora_dropout", Dropout(self.dropout, name=name + ".lora_dropout"), (x,))
            conv = node.op
            a = emit(".lora_A", Conv(self.rank, conv.kernel_size, strides=conv.strides,
                                     padding=conv.padding, dilation=conv.dilation,
                                     use_bias=False, data_format=conv.data_format,
                                     kernel_init=lora_a_uniform_conv, precision=conv.precision,
                                     name=name + ".lora_A"), (x,))
            ones = 1 if isinstance(conv.kernel_size, int) else (1,) * len(conv.kernel_size)
            b = emit(".lora_B", Conv(conv.features, ones, use_bias=False,
                                     data_format=conv.data_format,
                                     kernel_init=initializers.zeros, precision=conv.precision,
                                     name=name + ".lora_B"), (a,))
        else:
            if self.dropout > 0:
                x = emit(".lora_dropout", Dropout(self.dropout, name=name + ".lora_dropout"), (x,))
            linear: Any = node.op
            a = emit(".lora_A", Linear(self.rank, use_bias=False, kernel_init=lora_a_uniform,
                                       precision=linear.precision, name=name + ".lora_A"), (x,))
            b = emit(".lora_B", Linear(linear.features, use_bias=False,
                                       kernel_init=initializers.zeros,
                                       precision=linear.precision, name=name + ".lora_B"), (a,))
        scaled = emit(".lora_scale", Mul(constant=self.scale, name=name + ".lora_scale"), (b,))
        return (emit(_SUM, Add(name=name + _SUM), (kept.value(), scaled)),)


# --- the adapter's weights ------------------------------------------------------------


def _is_adapter(key: str) -> bool:
    return key.endswith(".lora_A") or key.endswith(".lora_B")


def lora_params(params: Mapping) -> dict:
    """The adapters' weights in ``params``: the ``*.lora_A`` and ``*.lora_B`` entries,
    in the same nested dicts (blocks, scans) as in ``params``.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.lora(mg.Graph(x, ops.Linear(16, name="fc")(x)), "fc", rank=2)
      >>> params, state = mg.compile(g).init(jax.random.key(0))
      >>> jax.tree.map(lambda w: w.shape, mg.lora_params(params))
      {'fc.lora_A': {'kernel': (8, 2)}, 'fc.lora_B': {'kernel': (2, 16)}}
    """
    if not isinstance(params, Mapping):
        raise GraphError(f"lora_params takes params (nested dicts), got {type(params).__name__}")
    out: dict = {}
    for key, value in params.items():
        if _is_adapter(key):
            out[key] = value
        elif isinstance(value, Mapping):
            inner = lora_params(value)
            if inner:
                out[key] = inner
    return out


# --- merging ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Unlora(Rule):
    """Takes out the adapters' nodes; readers of ``<name>.lora`` read ``<name>`` again."""

    def prepare(self, graph: Graph) -> Any:
        names = {node.name for node in graph.nodes}
        bases = {name for name in names
                 if name + ".lora_A" in names and name + ".lora_B" in names and name + _SUM in names}
        dropped = {base + suffix for base in bases for suffix in _PARTS}
        return dropped, {base + _SUM: base for base in bases}

    def visit(self, node: Node, rewrite: Rewrite):
        dropped, sums = rewrite.data
        if node.name in dropped:
            return ()
        if node.name in sums:
            return (rewrite.read(Value(sums[node.name], 0)),)
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


def merge_lora(graph: Graph, params: Mapping) -> tuple[Graph, dict]:
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
    if not isinstance(graph, Graph):
        raise GraphError(f"merge_lora works on a Graph, got {type(graph).__name__}")
    if not isinstance(params, Mapping):
        raise GraphError(f"merge_lora takes params (nested dicts), got {type(params).__name__}")
    graph = unfold_scans(graph)
    nodes = dict(layer_paths(graph))
    shared = _shared(graph)
    drop: set[str] = set()
    merged: dict = dict(params)
    for path in nodes:
        if not path.endswith(".lora_A"):
            continue
        base = path[: -len(".lora_A")]
        if base not in nodes or base + ".lora_B" not in nodes or base + ".lora_scale" not in nodes:
            continue
        if getattr(nodes[base].op, "scheme", None) is not None:
            raise GraphError(f"merge_lora: {base!r} is quantized ({nodes[base].op.scheme}): "
                             f"folding the adapter in would need its float weights; merge "
                             f"into the float model's weights (quantize afterwards)")
        if base in shared:
            raise GraphError(f"merge_lora: the weights of {base!r} are used by another call too "
                             f"(a tied output head), which does not have the adapter: folding "
                             f"it in would change that call's output; keep the adapter unmerged")
        scale_op: Any = nodes[base + ".lora_scale"].op
        scale = scale_op.constant
        weight = "embedding" if isinstance(nodes[base].op, Embedding) else "kernel"
        try:
            w = get_in(params, (*base.split("/"), weight))
            a = get_in(params, (*path.split("/"), "embedding" if weight == "embedding" else "kernel"))
            b = get_in(params, (*f"{base}.lora_B".split("/"), "kernel"))
        except (KeyError, TypeError):
            raise GraphError(f"merge_lora: params have no weights for {base!r} and its adapter "
                             f"(give the adapted graph's params, unscanned: "
                             f"model.unstack_weights gives them)") from None
        if isinstance(nodes[base].op, Conv):
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
