"""The decoding graph, derived from a causal language model's graph by one rewrite.

``decode_graph(graph, max_length=..., batch=...)`` returns the graph that runs new
tokens against a key/value cache:

- its inputs are the model's token ids, then ``positions (batch, seq)`` int32 (each
  token's position, counted from the attention mask), ``cache_index ()`` int32 (the
  cache slot of the first token) and ``cache_mask (batch, max_length)`` bool (the
  slots holding a token); blocks that need them get them as further inputs;
- each causal ``multi_head_attention`` (``causal=True``, or a mask made by
  ``ops.causal_mask``) becomes a ``cached_attention`` of the same name (its weights
  keep their paths), whose state is the cache; a ``quantized_multi_head_attention``
  (``mg.quantize``'s) a ``quantized_cached_attention``, its stored weights kept;
- the position ``arange`` over the sequence becomes the positions input, and a
  ``rotary_embedding`` without positions reads them;
- every other layer that reads the tokens' activations must compute each position
  from that position alone (linear, norms, elementwise, embedding, reshapes of the
  feature axes, ...); one that mixes positions (a non-causal attention, a
  convolution or a reduction over the sequence, a recurrent layer, ``ops.F``) is a
  ``GraphError`` naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import GraphError, ShapeError, node_message
from ..core.specs import TensorSpec, is_symbolic
from ..ir.graph import Graph, InputLayer
from ..ir.node import Node, Value
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ops.activation import Gelu, LogSoftmax, Relu, Sigmoid, Silu, Softmax, Tanh
from ..ops.attention import MultiHeadAttention
from ..ops.cached_attention import CachedAttention
from ..ops.cast import Cast
from ..ops.causal_mask import CausalMask
from ..ops.constraint import Constrain
from ..ops.creation import Arange
from ..ops.dequantize import Dequantize
from ..ops.dropout import Dropout
from ..ops.elementwise import Binary
from ..ops.embedding import Embedding
from ..ops.foreign import ForeignOp
from ..ops.function import F
from ..ops.indexing import GetItem
from ..ops.linear import Linear
from ..ops.matmul import MatMul
from ..ops.normalization import BatchNorm, LayerNorm, RMSNorm
from ..ops.quantize import Quantize
from ..ops.quantized_attention import QuantizedMultiHeadAttention
from ..ops.quantized_cached_attention import QuantizedCachedAttention
from ..ops.reduce import _Reduce
from ..ops.rotary import RotaryEmbedding
from ..ops.shape import Concat, Reshape, Split, Transpose
from ..ops.tensor import ExpandDims, Identity, Neg, Pad, Squeeze, Where

__all__ = ["decode_graph", "DecodeRule", "EXTRA_INPUTS"]

#: The names of the inputs the rewrite adds (made unique in each graph).
EXTRA_INPUTS = ("positions", "cache_index", "cache_mask")

_POINTWISE = (Relu, Gelu, Silu, Tanh, Sigmoid, Binary, Dropout, Cast, Constrain, Identity, Neg,
              Where, Linear, Embedding, RMSNorm, Dequantize)


def decode_graph(graph: Graph, *, max_length: int, batch: int | str, cache_dtype: Any = None) -> Graph:
    """The decoding graph of ``graph`` (see the module's docstring), with caches of
    ``max_length`` slots for ``batch`` rows (an int, or a symbolic dim's name: caches
    of any batch, for an exported decoder), in ``cache_dtype`` (None: each attention's
    compute dtype).

    Raises:
      GraphError: for a graph that is not a causal language model (token ids in), or a
        layer that mixes positions, naming it and the user's line.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.decode.derive import decode_graph
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> d = decode_graph(g, max_length=16, batch=2)
      >>> d.inputs
      ('input_ids', 'positions', 'cache_index', 'cache_mask')
      >>> d.node("h.0").op.graph.node("attn").op.op_name
      'cached_attention'
    """
    if not (isinstance(batch, str) and batch) and (
            not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1):
        raise GraphError(f"batch must be a positive int (or a symbolic dim's name, a str), got {batch!r}")
    graph = unfold_scans(graph)
    if not graph.inputs:
        raise GraphError(f"graph {graph.name!r} has no input: a decoder takes token ids")
    ids = graph.node(graph.inputs[0]).outputs[0]
    if ids.rank != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise GraphError(f"graph {graph.name!r}: a decoder takes token ids (batch, seq) of an "
                         f"integer dtype as the first input, got {ids}")
    if len(graph.inputs) > 1:
        raise GraphError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs; a decoder "
                         f"takes token ids alone (the attention mask is the decoder's)")
    specs = graph.output_specs
    if len(specs) != 1:
        _not_logits(graph)
    decoding = rewrite(graph, DecodeRule(int(max_length), batch if isinstance(batch, str) else int(batch),
                                         cache_dtype=None if cache_dtype is None else jnp.dtype(cache_dtype).name,
                                         root=True))
    if len(specs[0].shape) != 3:  # after the rewrite, which names a layer mixing positions
        _not_logits(graph)
    return decoding


def _not_logits(graph: Graph) -> None:
    raise GraphError(f"graph {graph.name!r} gives {', '.join(map(str, graph.output_specs))}; a "
                     f"decoder takes a graph whose one output is the logits (batch, seq, vocab) "
                     f"(mg.Graph(ids, logits))")


@dataclasses.dataclass
class _Facts:
    """What the rule knows of one graph: the values carrying the tokens' positions (axis
    1 the sequence), the sequence dim, whether the graph needs the extra inputs, and
    the extra inputs once made."""

    carries: set[Value]
    seq: Any
    needs: bool
    extra: tuple[Value, ...] = ()


@dataclasses.dataclass(frozen=True)
class DecodeRule(Rule):
    """The rewrite of ``decode_graph``: one instance per cache size, shared by every
    graph it descends into (equal blocks are rewritten once). ``root``: the model's
    own graph, which takes the extra inputs even when nothing in it reads them (a model
    without attention or positions), as the decoder passes them."""

    max_length: int
    batch: int | str
    cache_dtype: str | None = None
    root: bool = False

    def prepare(self, graph: Graph) -> _Facts:
        first = graph.node(graph.inputs[0]).outputs[0] if graph.inputs else None
        if first is None or first.rank < 2:
            raise GraphError(f"block {graph.name!r}: its first input is not (batch, seq, ...): "
                             f"the decoder cannot tell its tokens' axis")
        carries = {Value(name) for name in graph.inputs if graph.node(name).outputs[0].rank >= 2}
        for node in graph.nodes:
            if node.name in graph.inputs:
                continue
            if any(v in carries for v in node.inputs) or _is_positions(node, first.shape[1]):
                carries.update(node.value(i) for i in range(len(node.outputs)))
        return _Facts(carries, first.shape[1], self.root or _needs(graph))

    def nested(self, node: Node) -> Rule | None:
        return dataclasses.replace(self, root=False) if self.root else self

    def inputs(self, names: tuple[str, ...], rewrite: Rewrite) -> tuple[str, ...]:
        facts: _Facts = rewrite.data
        return names + tuple(v.node for v in facts.extra)

    def visit(self, node: Node, rewrite: Rewrite) -> None | Node | Sequence[Value]:
        facts: _Facts = rewrite.data
        graph = rewrite.graph
        if facts.needs and not facts.extra:
            facts.extra = self._emit_inputs(graph, rewrite)
        if node.name in graph.inputs:
            return None
        op = node.op
        if isinstance(op, MultiHeadAttention):
            return self._attention(node, graph, facts)
        if isinstance(op, CausalMask):
            readers = graph.consumers()[node.name]
            if all(isinstance(r.op, MultiHeadAttention) and r.inputs[2:] == (node.value(),)
                   for r in readers):
                return ()  # the attentions reading it attend by position instead
            raise _mixes(node, "a causal mask read by other layers than attention")
        if isinstance(op, Arange) and _is_positions(node, facts.seq):
            if op.limit is not None and self.max_length > op.limit:
                # A slot past the position table would look its position up past the
                # table (NaN logits): refuse the cache now, naming the table.
                raise ShapeError(node_message(
                    node.name, op.op_name, f"max_length={self.max_length} slots, but the "
                    f"position table has {op.limit} (positions 0 .. {op.limit - 1})",
                    expected=f"max_length of at most {op.limit}", source=node.source))
            positions = facts.extra[0]
            if op.dtype == np.dtype("int32"):
                return (positions,)
            name = rewrite.fresh(f"{node.name}.cast")
            cast = rewrite.emit(Node(name, Cast(op.dtype), (positions,), (), name, node.source),
                                infer=True)
            return (cast.value(),)
        if isinstance(op, Arange) and is_symbolic(op.n) and _mentions(op.n, facts.seq):
            raise _mixes(node, f"an arange of {op.n} (not the sequence's {facts.seq})")
        if isinstance(op, RotaryEmbedding) and len(node.inputs) == 1:
            return node.replace(inputs=node.inputs + facts.extra[:1])
        inner = op.subgraph()
        if inner is not None:
            added = len(inner.inputs) - len(node.inputs)
            if added:
                return node.replace(inputs=node.inputs + facts.extra[:added])
            return None
        original = graph.node(node.name)
        if (any(v in facts.carries for v in original.inputs)
                and not _position_wise(original, graph, facts.carries)):
            if isinstance(original.op, (ForeignOp, F)):
                raise _refuse(original, f"an operator the rewrite cannot see into "
                              f"({original.op.op_name}): it cannot tell whether each position is "
                              f"computed from itself alone. A decoding graph is made of "
                              f"mlaxgraph's layers: for an imported model, build it with "
                              f"mg.models and load its weights (mg.models.load_state_dict)")
            raise _mixes(original, "its output at one position depends on other positions")
        return None

    def _emit_inputs(self, graph: Graph, rewrite: Rewrite) -> tuple[Value, ...]:
        first = graph.node(graph.inputs[0])
        batch, seq = first.outputs[0].shape[:2]
        specs = (TensorSpec((batch, seq), np.dtype("int32")), TensorSpec((), np.dtype("int32")),
                 TensorSpec((batch, self.max_length), np.dtype(bool)))
        values = []
        for base, spec in zip(EXTRA_INPUTS, specs):
            name = rewrite.fresh(base)
            layer = InputLayer(spec.shape, spec.dtype, name=name)
            values.append(rewrite.emit(Node(name, layer, (), (spec,), name, first.source)).value())
        return tuple(values)

    def _attention(self, node: Node, graph: Graph, facts: _Facts) -> Node:
        op: MultiHeadAttention = node.op  # type: ignore[assignment]
        original = graph.node(node.name)
        if type(op) not in (MultiHeadAttention, QuantizedMultiHeadAttention):
            raise _refuse(original, f"a {type(op).__name__}: the decoder caches "
                          f"MultiHeadAttention and mg.quantize's QuantizedMultiHeadAttention")
        count = len(op.delta_inputs)  # mg.lora's adapters' outputs, after the others
        bases = original.inputs[:len(original.inputs) - count]
        causal_input = (len(bases) == 3
                        and isinstance(graph.node(bases[2].node).op, CausalMask))
        if len(bases) == 3 and not causal_input:
            raise _refuse(original, "an attention with a mask of its own: the decoder masks "
                         "padding itself (pass attention_mask to prefill or generate)")
        if not (op.causal or causal_input):
            raise _mixes(original, "a non-causal attention between tokens: each token attends "
                         "to later ones (use causal=True or mask=ops.causal_mask(x))")
        if original.shares_weights or any(n.layer == node.name and n.name != node.name
                                          for n in graph.nodes):
            raise _refuse(original, "an attention layer called more than once: its calls would "
                         "share one cache")
        if bases[0] != bases[1]:
            raise _refuse(original, "a cross-attention: the decoder caches self-attention only")
        x = graph.spec(original.inputs[0])
        head_dim = op.head_dim or x.shape[-1] // op.num_heads
        quantized = ({"scheme": op.scheme, "group_size": op.group_size}
                     if isinstance(op, QuantizedMultiHeadAttention) else {})
        cached = (QuantizedCachedAttention if quantized else CachedAttention)(
            op.num_heads, head_dim, op.out_features or x.shape[-1], max_length=self.max_length,
            batch=self.batch, num_kv_heads=op.num_kv_heads, use_bias=op.use_bias, rope=op.rope,
            rope_scaling=op.rope_scaling, sliding_window=op.sliding_window, out_bias=op.out_bias,
            param_axes=op.param_axes, adapters=op.adapters, cache_dtype=self.cache_dtype, name=op.name,
            **quantized)
        deltas = node.inputs[len(node.inputs) - count:] if count else ()
        return node.replace(op=cached, inputs=node.inputs[:1] + facts.extra + deltas)


def _needs(graph: Graph) -> bool:
    """Whether the graph (or a block inside it) reads the extra inputs."""
    memo = graph.memo("decode_needs")
    if "needs" not in memo:
        first = graph.node(graph.inputs[0]).outputs[0] if graph.inputs else None
        seq = first.shape[1] if first is not None and first.rank >= 2 else None
        memo["needs"] = any(
            isinstance(n.op, MultiHeadAttention) or _is_positions(n, seq)
            or (isinstance(n.op, RotaryEmbedding) and len(n.inputs) == 1)
            or (n.op.subgraph() is not None and _needs(n.op.subgraph()))  # type: ignore[arg-type]
            for n in graph.nodes)
    return memo["needs"]


def position_limit(graph: Graph) -> int | None:
    """The fewest positions a position table of ``graph`` holds (an ``arange`` with a
    ``limit``, nested blocks included), or None when nothing bounds them."""
    limits = []
    for node in graph.nodes:
        if isinstance(node.op, Arange) and node.op.limit is not None:
            limits.append(node.op.limit)
        inner = node.op.subgraph()
        if inner is not None:
            found = position_limit(inner)
            if found is not None:
                limits.append(found)
    return min(limits) if limits else None


def _is_positions(node: Node, seq: Any) -> bool:
    op = node.op
    if not isinstance(op, Arange) or seq is None:
        return False
    try:
        return bool(op.n == seq)
    except Exception:  # an inconclusive comparison of symbolic dims
        return False


def _mentions(dim: Any, seq: Any) -> bool:
    if not is_symbolic(seq):
        return False
    names = set(seq._get_vars())
    return bool(names & set(dim._get_vars()))


def _mixes(node: Node, why: str) -> GraphError:
    return _refuse(node, f"{why}. A decoding graph needs each position computed from "
                   f"itself and earlier ones only")


def _refuse(node: Node, why: str) -> GraphError:
    return GraphError(node_message(node.name, node.op.op_name,
                                   f"the decoder cannot cache this layer: {why}",
                                   source=node.source))


def _axes_after_positions(axes: Sequence[int], rank: int) -> bool:
    return all((a % rank) >= 2 for a in axes)


def _position_wise(node: Node, graph: Graph, carries: set[Value]) -> bool:
    """Whether ``node`` computes each (batch row, position) of its output from the same
    one of its inputs: layers of the feature axes, elementwise ops, the norms."""
    op = node.op
    specs = graph.input_specs_of(node)
    rank = specs[0].rank if specs else 0
    out = node.outputs[0] if node.outputs else None
    if isinstance(op, _POINTWISE):
        return True
    if isinstance(op, (Softmax, LogSoftmax)):
        return _axes_after_positions((op.axis,), rank)
    if isinstance(op, LayerNorm):
        return _axes_after_positions((op.axis,), rank)
    if isinstance(op, Quantize):  # a scale per token (or one calibrated scale)
        return _axes_after_positions(op.axes, rank)
    if isinstance(op, BatchNorm):  # inference: the running statistics
        return _axes_after_positions((op.axis,), rank)
    if isinstance(op, (Concat, Split)):
        return _axes_after_positions((op.axis,), rank)
    if isinstance(op, Transpose):
        return tuple(op.perm[:2]) == (0, 1)
    if isinstance(op, Reshape):
        return out is not None and rank >= 2 and _same(out.shape[:2], specs[0].shape[:2])
    if isinstance(op, _Reduce):
        return op.axis is not None and _axes_after_positions(op.axis, rank)
    if isinstance(op, Squeeze):
        return _axes_after_positions(op.axis, rank)
    if isinstance(op, ExpandDims):
        return out is not None and _axes_after_positions(op.axis, out.rank)
    if isinstance(op, Pad):
        return tuple(op.pad_width[:2]) == ((0, 0), (0, 0))
    if isinstance(op, GetItem):
        return (_keeps_positions(tuple(op.index), rank) and out is not None
                and _same(out.shape[:2], specs[0].shape[:2]))
    if isinstance(op, MatMul):  # activations times a matrix that carries no positions
        return (len(specs) == 2 and node.inputs[1] not in carries and specs[1].rank <= 2
                and rank >= 3)
    return False


def _keeps_positions(index: tuple[Any, ...], rank: int) -> bool:
    """Whether a ``GetItem`` index (its entries: ints, ``(start, stop, step)`` slices,
    None and ``"..."``) takes axes 0 and 1 whole, whatever it does to the others."""
    consuming = sum(1 for e in index if e is not None and e != "...")
    whole = (None, None, None)
    if "..." in index:
        at = index.index("...")
        index = index[:at] + (whole,) * max(rank - consuming, 0) + index[at + 1:]
    axis = 0
    for entry in index:
        if axis >= 2:
            return True
        if entry is None:  # a new axis before the sequence's
            return False
        if not (isinstance(entry, tuple) and entry[0] in (None, 0) and entry[1] is None
                and entry[2] in (None, 1)):
            return False
        axis += 1
    return True


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    try:
        return len(a) == len(b) and all(bool(x == y) for x, y in zip(a, b))
    except Exception:
        return False
