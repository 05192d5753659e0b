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
import difflib
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import ConfigError, GraphError, SourceInfo, capture_source, node_message
from ..ir.graph import Graph
from ..ir.node import Node, Value
from ..ir.paths import is_pattern, path_matcher
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths, resolve_selection, select
from ..ir.verify import verify
from ..ops import initializers
from ..ops.attention import ADAPTABLE, MultiHeadAttention
from ..ops.conv import Conv
from ..ops.dequantize import Dequantize
from ..ops.dropout import Dropout
from ..ops.elementwise import Add, Mul
from ..ops.embedding import Embedding
from ..ops.embedding import normal as normal_init
from ..ops.initializers import lora_a_uniform, lora_a_uniform_conv
from ..ops.linear import Linear
from ..ops.quantize import Quantize
from .lora_arguments import LORA_SIGNATURE, checked_arguments
from .lora_weights import is_adapter

__all__ = ["lora", "lora_targets", "lora_a_uniform", "lora_a_uniform_conv"]

#: The adapter's nodes beside layer ``<name>``: ``<name><suffix>``.
_PARTS = (".lora_dropout", ".lora_A", ".lora_B", ".lora_scale")
#: The node summing the layer's output and the adapter's: ``<name>.lora``.
_SUM = ".lora"
#: The op names ``lora`` adapts (quantized layers get float adapters: QLoRA).
ADAPTED_OPS = ("linear", "embedding", "conv", "multi_head_attention")
QUANTIZED_ADAPTED_OPS = tuple(f"quantized_{name}" for name in ADAPTED_OPS)
#: The projections of an attention layer that naming the layer itself adapts, as PEFT's
#: and Keras's defaults for attention (query and value).
DEFAULT_PROJECTIONS = ("query", "value")


def lora(graph: Graph, targets: Any = None, *positional: Any, rank: int | None = None, alpha: float | None = None,
         dropout: float = 0.0, use_rslora: bool = False,
         init_weights: bool | str = True, **unknown: Any) -> Graph:
    """``graph`` with a low-rank adapter beside each layer ``targets`` selects.

    Each target's output ``y`` becomes ``y + scale * B(A(dropout(x)))``, ``scale`` being
    ``alpha / rank`` (``alpha / sqrt(rank)`` with ``use_rslora``; ``alpha`` defaults to
    ``rank``, as in PEFT). ``A`` and ``B`` are layers of their own, ``<name>.lora_A``
    and ``<name>.lora_B`` beside the target ``<name>``, so their weights sit at their
    own paths and the base weights keep theirs: ``init(key, reuse=(params, state))``
    keeps every base weight. ``B`` starts at zero, so the adapted model starts equal to
    the base model. ``A`` is drawn as PEFT draws it (``lora_a_uniform``).

    ``init_weights`` is PEFT's ``init_lora_weights``: True (the default, above);
    ``"gaussian"``: ``A`` normal with standard deviation ``1 / rank``, ``B`` zero;
    False: ``B`` drawn too, as PyTorch draws a new layer (uniform in ``[-1/sqrt(fan_in),
    1/sqrt(fan_in)]``; an Embedding's ``A`` and ``B`` standard normal), so the adapted
    model starts away from the base model.

    Targets are a path, a glob pattern or a list of paths (what ``graph.select``
    returns). An attention layer's projections are named inside it:
    ``<attention>/query``, ``/key``, ``/value``, ``/out``, or ``/qkv`` (one adapter over
    the three fused, as on GPT-2's ``c_attn``); the attention layer itself means its
    query and value (PEFT's and Keras's defaults); see ``lora_targets``. Their adapters
    are the nodes ``<attention>.<projection>.lora_A`` ... beside the layer, which adds
    them inside (``MultiHeadAttention.adapters``). Linear layers (without a fused
    activation) and Embeddings are adapted;
    for an Embedding, as PEFT, ``A`` is a table of ``rank`` columns that starts at zero
    and ``B`` a Linear drawn normal, and dropout does not apply (its input is ids). For
    a Conv (without a fused activation), as PEFT, ``A`` is a Conv of ``rank``
    outputs with the target's kernel size, strides, padding and dilation (PEFT's has no
    dilation: a dilated conv's adapter is not exchanged with PEFT), ``B`` a 1x1
    Conv (zeros) with the target's groups (``rank`` divisible by them), both without
    bias (``lora_a_uniform_conv`` draws ``A``). Another op is an ``mg.ConfigError``
    naming the layer.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.Graph(x, ops.Linear(4, name="head")(ops.Linear(16, name="fc")(x)))
      >>> g2 = mg.lora(g, "fc", rank=2)
      >>> [node.name for node in g2.nodes]
      ['x', 'fc', 'fc.lora_A', 'fc.lora_B', 'fc.lora_scale', 'fc.lora', 'head']
    """
    if positional:
        raise ConfigError(f"lora takes rank and the rest by keyword: lora(graph, targets, "
                          f"rank={positional[0]!r}, ...), got {len(positional)} more positional "
                          f"argument(s); it takes {LORA_SIGNATURE}")
    rank, scale = checked_arguments(targets, rank, alpha, dropout, use_rslora, init_weights,
                                    unknown)
    source = capture_source()
    if not isinstance(graph, Graph):
        raise GraphError(f"lora works on a Graph, got {type(graph).__name__}")
    graph = unfold_scans(graph)
    nodes = dict(layer_paths(graph))
    chosen = {path: projections for path, projections in lora_targets(graph, targets).items()
              if not _quantize_helper(path, nodes)}
    for path, projections in chosen.items():
        _check_target(path, nodes[path], source, nodes, rank)
        op: Any = nodes[path].op
        if isinstance(op, MultiHeadAttention) and (
                set(op.adapters) & set(projections)
                or ("qkv" in op.adapters + projections and len(set(op.adapters + projections)) > 1
                    and set(op.adapters + projections) & {"query", "key", "value"})):
            raise ConfigError(node_message(
                path, op.op_name, f"this attention has adapters already ({', '.join(op.adapters)}); "
                f"merge_lora folds them in first", source=source))
    rule = _Lora(tuple((tuple(path.split("/")), projections)
                       for path, projections in chosen.items()),
                 rank, scale, float(dropout), init_weights, source)
    result = rewrite(graph, rule, memo={})
    verify(result)
    return result


def lora_targets(graph: Graph, targets: Any) -> dict[str, tuple[str, ...]]:
    """The layers ``targets`` names, each with the attention projections it adapts (empty
    for other layers). ``<attention path>/<projection>`` names one projection
    (``query``, ``key``, ``value``, ``out``, or ``qkv`` for the three fused in one
    adapter); a pattern there (``*``) names query, key, value and out; the attention
    layer itself its query and value. A layer named by several targets gets what they
    ask together (``["attn", "attn/out"]``: query, value and out)."""
    items = [targets] if isinstance(targets, str) else targets
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise GraphError(f"lora takes a path, a glob pattern or a list of paths (what "
                         f"select returns), got {targets!r}")
    known = dict(layer_paths(graph))
    attention = [path for path, node in known.items() if isinstance(node.op, MultiHeadAttention)]
    chosen: dict[str, list[str]] = {}
    plain = []
    for item in items:
        head, _, tail = item.rpartition("/")
        if head:
            match = path_matcher(head)
            layers = [path for path in attention if match(path)]
            names = [p for p in ADAPTABLE if p != "qkv" and path_matcher(tail)(p)] \
                if is_pattern(tail) else [tail] if tail in ADAPTABLE else []
            if layers and names:
                for path in layers:
                    chosen.setdefault(path, []).extend(names)
                continue
            if layers and not select(graph, item) and all(path in layers for path in known if match(path)):
                # inside an attention layer there are its projections alone (a head that
                # names other layers too, "**", leaves the item a path as any other)
                raise GraphError(_no_projection(item, head, tail))
        plain.append(item)
    selection = targets if len(plain) == len(items) else plain  # as the user wrote it
    plain_paths = resolve_selection(graph, selection, "lora") if plain or not chosen else []
    for path in plain_paths:
        # What each target asks, together: the attention itself asks its defaults.
        chosen.setdefault(path, []).extend(DEFAULT_PROJECTIONS if path in attention else ())
    out = {}
    for path, names in chosen.items():
        projections = tuple(p for p in ADAPTABLE if p in names)
        if "qkv" in projections and len(projections) > 1 and set(projections) & {"query", "key", "value"}:
            itself = "; naming the attention itself asks for query and value" \
                if path in plain_paths else ""
            raise ConfigError(f"lora: {path!r} is asked for the fused 'qkv' adapter and for "
                              f"separate ones ({', '.join(p for p in projections if p != 'qkv')})"
                              f"{itself}; choose one form")
        out[path] = projections
    return out


def _no_projection(item: str, head: str, tail: str) -> str:
    """The message for ``<attention>/<tail>`` where ``tail`` names no projection."""
    if is_pattern(tail) and path_matcher(tail)("qkv"):
        return (f"lora({item!r}): {tail!r} matches no projection of the attention {head!r} "
                f"but the fused qkv, which a pattern does not select (it would adapt query, "
                f"key and value twice with the separate ones): name it, {head}/qkv")
    close = difflib.get_close_matches(tail.lower(), ADAPTABLE, n=1, cutoff=0.5)
    near = f"; near: {head}/{close[0]}" if close else ""
    return (f"lora({item!r}): {head!r} names attention (MultiHeadAttention), and {tail!r} "
            f"is none of its projections: query, key, value, out, and qkv (the three fused "
            f"in one adapter, as on GPT-2's c_attn){near}. PyTorch's module names (q_proj, "
            f"c_attn, ...) are what lora_from_peft reads")


def _quantize_helper(path: str, nodes: Mapping[str, Node]) -> bool:
    """Whether ``path`` is the ``Quantize`` or ``Dequantize`` node ``mg.quantize`` put
    beside a quantized layer (``h.0/mlp.c_fc.quantize``): part of that layer, which a
    pattern selecting it adapts, not a target of its own."""
    for suffix in (".quantize", ".dequantize"):
        base = path[: -len(suffix)] if path.endswith(suffix) else None
        if base is not None and getattr(nodes.get(base), "op", None) is not None \
                and getattr(nodes[base].op, "scheme", None) is not None:
            return True
    return False


def _check_target(path: str, node: Node, source: SourceInfo | None,
                  nodes: Mapping[str, Node], rank: int) -> None:
    op = node.op
    if is_adapter(path):
        base = path.rsplit(".lora_", 1)[0]
        owner, _, projection = base.rpartition(".")
        if base not in nodes and isinstance(getattr(nodes.get(owner), "op", None), MultiHeadAttention):
            base = f"{owner}/{projection}"
        raise ConfigError(node_message(
            path, op.op_name,
            f"this is a LoRA adapter's own layer, not a layer of the model; select the layer "
            f"it adapts ({base!r}) or others, leaving out '*.lora_*' (to adapt it again, "
            f"merge_lora folds the adapters in first)", source=source))
    if op.op_name not in ADAPTED_OPS + QUANTIZED_ADAPTED_OPS:
        raise ConfigError(node_message(
            path, op.op_name,
            f"LoRA does not adapt op {op.op_name!r} yet (it adapts {', '.join(ADAPTED_OPS)}, "
            f"quantized or not); "
            f"select those layers instead", source=source))
    if isinstance(op, (Linear, Conv)) and op.activation is not None:
        kind = type(op).__name__
        raise ConfigError(node_message(
            path, op.op_name,
            f"LoRA adds beside a {kind}'s output before any activation, and this one applies "
            f"{op.activation!r} itself; build it as a {kind} followed by the activation",
            source=source))
    if isinstance(op, Conv) and rank % op.groups:
        raise ConfigError(node_message(
            path, op.op_name,
            f"a grouped Conv's adapter (groups={op.groups}) has B grouped as the conv, as in "
            f"PEFT, so the rank must be divisible by {op.groups}, got rank={rank}", source=source))


_DEQUANTIZE = ".dequantize"


def _dequantized(graph: Graph, name: str) -> bool:
    """Whether layer ``name`` of ``graph`` is followed by its ``Dequantize`` node (a
    quantized layer reading a quantized input: its own output is an int32 product)."""
    after = graph._index.get(name + _DEQUANTIZE)
    return after is not None and isinstance(after.op, Dequantize) and \
        after.inputs[0].node == name


@dataclasses.dataclass(frozen=True)
class _Lora(Rule):
    #: (path parts, attention projections) of each target
    targets: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
    rank: int
    scale: float
    dropout: float
    init_weights: bool | str
    source: SourceInfo | None = dataclasses.field(compare=False, hash=False)

    def _inits(self, a_uniform: Callable) -> tuple[Callable, Callable]:
        """The initializers of ``A`` and ``B`` of a Linear's or Conv's adapter
        (``a_uniform``: PyTorch's default draw of such a layer, by its fan-in)."""
        if self.init_weights is False:
            return a_uniform, a_uniform
        if self.init_weights == "gaussian":
            return initializers.normal(1.0 / self.rank), initializers.zeros
        return a_uniform, initializers.zeros

    def nested(self, node: Node) -> Rule | None:
        inner = tuple((t[1:], p) for t, p in self.targets
                      if len(t) > 1 and t[0] in (node.name, node.layer))
        return dataclasses.replace(self, targets=inner) if inner else None

    def visit(self, node: Node, rewrite: Rewrite):
        chosen = dict(self.targets).get((node.name,))
        if chosen is not None and not isinstance(node.op, Embedding):
            calls = [n.name for n in rewrite.graph.nodes if n.layer == node.name and n.name != node.name]
            if calls:
                raise ConfigError(node_message(
                    node.name, node.op.op_name, f"this layer is called {len(calls) + 1} times "
                    f"({node.name}, {', '.join(calls)}), and LoRA adapts one call of a layer: "
                    f"build the calls as layers of their own, or adapt a block called twice",
                    source=self.source))
        if chosen is not None and _dequantized(rewrite.graph, node.name):
            return None  # adapted after its Dequantize node, where its output is float
        if chosen is None and isinstance(node.op, Dequantize) \
                and node.name.endswith(_DEQUANTIZE):
            target = node.name[: -len(_DEQUANTIZE)]
            if (target,) in dict(self.targets) and _dequantized(rewrite.graph, target):
                return self._after_dequantize(node, target, rewrite)
        if chosen is None:
            return None
        if isinstance(node.op, MultiHeadAttention):
            return self._attention(node, chosen, rewrite)
        return self._beside(node, node.name, rewrite.keep(node), rewrite)

    def _after_dequantize(self, node: Node, target: str, rewrite: Rewrite):
        """The adapter of quantized layer ``target`` whose product ``node`` (its
        ``Dequantize``) turns back into floats: added to ``node``'s output."""
        op: Any = node.op
        layer = next(n for n in reversed(rewrite.nodes) if n.name == target)
        if op.activation is not None:
            raise ConfigError(node_message(
                target, layer.op.op_name,
                f"LoRA adds beside a layer's output before any activation, and its "
                f"{node.name!r} applies {op.activation!r}; build the layer followed by the "
                f"activation", source=self.source))
        return self._beside(layer, target, rewrite.keep(node), rewrite)

    def _beside(self, node: Node, name: str, kept: Node, rewrite: Rewrite):
        """``kept``'s output plus the adapter of layer ``node``, named after ``name``."""
        taken = [name + suffix for suffix in (*_PARTS, _SUM) if name + suffix in rewrite.names]
        if taken:
            raise ConfigError(node_message(
                name, node.op.op_name,
                f"the graph already has {taken[0]!r}: this layer has an adapter already "
                f"(merge_lora folds it in first)", source=self.source))

        def emit(suffix: str, op: Any, inputs: tuple[Value, ...]) -> Value:
            return self._emit(rewrite, name + suffix, op, inputs)

        x = node.inputs[0]
        producer = next((n for n in reversed(rewrite.nodes) if n.name == x.node), None)
        if producer is not None and isinstance(producer.op, Quantize):
            # A quantized layer's adapter reads the float input, not its Quantize node's
            # cast (an int8 embedding looking ids up has none: it reads the ids).
            x = producer.inputs[0]
        if isinstance(node.op, Embedding):
            a = emit(".lora_A", Embedding(node.op.num_embeddings, self.rank, dtype=node.op.dtype,
                                          embedding_init=(normal_init if self.init_weights is False
                                                          else initializers.zeros),
                                          name=name + ".lora_A"), (x,))
            b = emit(".lora_B", Linear(node.op.features, use_bias=False, kernel_init=normal_init,
                                       name=name + ".lora_B"), (a,))
            scaled = emit(".lora_scale", Mul(constant=self.scale, name=name + ".lora_scale"), (b,))
        elif isinstance(node.op, Conv):
            if self.dropout > 0:
                x = emit(".lora_dropout", Dropout(self.dropout, name=name + ".lora_dropout"), (x,))
            conv = node.op
            a_init, b_init = self._inits(lora_a_uniform_conv)
            a = emit(".lora_A", Conv(self.rank, conv.kernel_size, strides=conv.strides,
                                     padding=conv.padding, dilation=conv.dilation,
                                     use_bias=False, data_format=conv.data_format,
                                     kernel_init=a_init, precision=conv.precision,
                                     name=name + ".lora_A"), (x,))
            ones = 1 if isinstance(conv.kernel_size, int) else (1,) * len(conv.kernel_size)
            b = emit(".lora_B", Conv(conv.features, ones, use_bias=False, groups=conv.groups,
                                     data_format=conv.data_format,
                                     kernel_init=b_init, precision=conv.precision,
                                     name=name + ".lora_B"), (a,))
            scaled = emit(".lora_scale", Mul(constant=self.scale, name=name + ".lora_scale"), (b,))
        else:
            linear: Any = node.op
            scaled = self._adapter(rewrite, name, x, linear.features, linear.precision)
        return (emit(_SUM, Add(name=name + _SUM), (kept.value(), scaled)),)

    def _emit(self, rewrite: Rewrite, name: str, op: Any, inputs: tuple[Value, ...]) -> Value:
        """A new node ``name`` of the adapter, its output specs inferred."""
        return rewrite.emit(Node(name, op, inputs, (), name, self.source), infer=True).value()

    def _adapter(self, rewrite: Rewrite, name: str, x: Value, features: int, precision: Any) -> Value:
        """``scale * B(A(dropout(x)))`` as the nodes ``<name>.lora_*``: Linears, as for a
        Linear target and an attention projection."""
        def emit(suffix: str, op: Any, inputs: tuple[Value, ...]) -> Value:
            return self._emit(rewrite, name + suffix, op, inputs)

        if self.dropout > 0:
            x = emit(".lora_dropout", Dropout(self.dropout, name=name + ".lora_dropout"), (x,))
        a_init, b_init = self._inits(lora_a_uniform)
        a = emit(".lora_A", Linear(self.rank, use_bias=False, kernel_init=a_init,
                                   precision=precision, name=name + ".lora_A"), (x,))
        b = emit(".lora_B", Linear(features, use_bias=False, kernel_init=b_init,
                                   precision=precision, name=name + ".lora_B"), (a,))
        return emit(".lora_scale", Mul(constant=self.scale, name=name + ".lora_scale"), (b,))

    def _attention(self, node: Node, projections: tuple[str, ...], rewrite: Rewrite):
        """An attention layer's projections adapted: the adapters of query, key, value
        (or the fused qkv) read the layer's inputs and come in as its extra inputs; the
        output projection's reads its second output (the attended values)."""
        op: Any = node.op
        name = node.name
        taken = [f"{name}.{p}{s}" for p in projections for s in _PARTS
                 if f"{name}.{p}{s}" in rewrite.names]
        if taken:
            raise ConfigError(node_message(name, op.op_name, f"the graph already has {taken[0]!r}",
                                           source=self.source))
        count = len(op.delta_inputs)
        base_inputs = node.inputs[: len(node.inputs) - count]
        existing = dict(zip(op.delta_inputs, node.inputs[len(base_inputs):]))
        q_in, kv_in = base_inputs[:2]
        if "qkv" in projections and q_in != kv_in:
            raise ConfigError(node_message(
                name, op.op_name, "a fused qkv adapter reads one sequence, and this attention "
                "reads its keys and values from another input than its queries "
                "(cross-attention): adapt 'query', 'key' and 'value' apart", source=self.source))
        head_dim = op._dims(tuple(rewrite.spec(v) for v in node.inputs))[2]
        deltas = dict(existing)
        for p in projections:
            if p != "out":
                source = kv_in if p in ("key", "value") else q_in
                deltas[p] = self._adapter(rewrite, f"{name}.{p}", source,
                                          op.delta_width(p, head_dim), None)
        adapters = tuple(p for p in ADAPTABLE if p in projections or p in op.adapters)
        new_op = dataclasses.replace(op, adapters=adapters)
        inputs = base_inputs + tuple(deltas[p] for p in new_op.delta_inputs)
        kept = rewrite.keep(node.replace(op=new_op, inputs=inputs))
        rest = (kept.value(1),) if "out" in op.adapters else ()   # an adapter reads it already
        if "out" not in projections:
            return (kept.value(), *rest)
        out_features = rewrite.spec(kept.value()).shape[-1]
        scaled = self._adapter(rewrite, f"{name}.out", kept.value(1), out_features, None)
        total = f"{name}.out{_SUM}"
        return (self._emit(rewrite, total, Add(name=total), (kept.value(), scaled)),)
