"""Quantization as one rewrite: ``mg.quantize`` turns the layers a selection names
into their quantized forms (``mlaxgraph/ops/quantized.py``), with a ``Quantize`` node
before each layer that reads its input quantized, so every change of precision is a
node of the graph; ``mg.quantize_weights`` makes their weights from float ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import re
import warnings
from typing import Any

from ..core.errors import ConfigError, GraphError, QuantizeWarning, ShapeError, SourceInfo, capture_source, node_message
from ..core.signatures import unknown_keywords
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.scan import unfold_scans
from ..ir.surgery import layer_paths, resolve_selection
from ..ir.verify import verify
from ..ops.conv import Conv
from ..ops.dequantize import Dequantize
from ..ops.quantize import SCHEMES, Quantize
from ..ops.quantized import QuantizedConv, QuantizedLinear
from ..ops.quantized_attention import QuantizedMultiHeadAttention, matrix_param_axes
from ..ops.quantized_embedding import QuantizedEmbedding

__all__ = ["quantize", "QUANTIZABLE", "QUANTIZED_OPS", "ONE_SIGNED"]

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
             group_size: int | None = None, **unknown: Any) -> Graph:
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
    256 levels, a zero point as third output). Layers reading one value read one
    ``Quantize`` node (named after the first). An attention quantizes its projections'
    inputs inside it with int8 (per token), and dequantizes its kernels with the other
    schemes. A tied head (``embedding.attend``) is the same layer, quantized with it.

    ``targets``: a path, glob pattern or list of paths (what ``graph.select``
    returns); None takes every layer the scheme quantizes (LoRA adapters aside).
    A targeted layer the scheme cannot quantize, or whose input size ``group_size``
    does not divide, is an ``mg.ConfigError`` naming it; a selection of nothing an
    ``mg.GraphError``. With the default targets, layers ``group_size`` does not divide
    stay float, listed in one ``mg.QuantizeWarning`` (a CNN's first convolution reads
    3 channels). The new graph's weights come from float ones through
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
    if unknown:
        raise ConfigError(unknown_keywords(
            "quantize", unknown, "quantize(graph, scheme, targets=None, group_size=None)",
            {k: f"{k} is mg.quantize_weights's" for k in ("calibration", "method", "static_scales")}))
    source = capture_source()
    if not isinstance(graph, Graph):
        raise GraphError(f"quantize works on a Graph, got {type(graph).__name__}")
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        near = _near_scheme(scheme)
        raise ConfigError(f"quantize: scheme must be one of {', '.join(map(repr, SCHEMES))}, "
                          f"got {scheme!r}{f' (did you mean {near!r}?)' if near else ''}")
    if scheme == "int4_weight_only":
        group_size = DEFAULT_GROUP if group_size is None else group_size
        if isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool):
            group_size = int(group_size)  # NumPy's ints too
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2 \
                or group_size % 2:
            raise ConfigError(f"quantize: group_size must be an even int >= 2 (32 or 128), "
                              f"got {group_size!r}")
    elif group_size is not None:
        raise ConfigError(f"quantize: group_size is for 'int4_weight_only', not {scheme!r}")
    graph = unfold_scans(graph)
    nodes = dict(layer_paths(graph))
    if targets is None:
        done = [path for path, node in nodes.items() if isinstance(node.op, tuple(QUANTIZED_OPS.values()))]
        if done:
            raise ConfigError(f"quantize: graph {graph.name!r} is quantized already "
                              f"(quantized layers: {', '.join(done[:3])}"
                              f"{' ...' if len(done) > 3 else ''}): quantize the float graph, "
                              f"with the scheme you want, or name the layers to quantize "
                              f"further in targets= (a mix of schemes)")
        paths = [path for path, node in nodes.items() if node.op.op_name in QUANTIZABLE[scheme]
                 and not path.endswith((".lora_A", ".lora_B"))]
        paths = _groupable(paths, nodes, graph, scheme, group_size, source)
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


#: The peers' names for the schemes: torchao's, and the W<bits>A<bits> shorthand.
_OTHER_NAMES = {"int8_wo": "int8_weight_only", "w8a16": "int8_weight_only", "w8a8": "int8",
                "int8_dynamic_activation_int8_weight": "int8", "int4_wo": "int4_weight_only",
                "w4a16": "int4_weight_only", "int4": "int4_weight_only",
                "float8_dynamic_activation_float8_weight": "float8", "w8a8_fp8": "float8"}


def _near_scheme(scheme: Any) -> str | None:
    """The scheme a misspelt one most likely meant: another case, a prefix (``"int4"``),
    ``"fp8"``, or the closest spelling."""
    if not isinstance(scheme, str) or not scheme:
        return None
    name = scheme.lower().replace("-", "_")
    if name in SCHEMES:
        return name
    if name in _OTHER_NAMES:
        return _OTHER_NAMES[name]
    prefixed = [s for s in SCHEMES if s.startswith(name) and s != "int8"]
    if prefixed:
        return prefixed[0]
    if name.startswith(("fp8", "float8", "e4m3")):
        return "float8"
    close = difflib.get_close_matches(name, SCHEMES, n=1, cutoff=0.6)
    return close[0] if close else None


def _check_target(path: str, node: Node, graph: Graph, scheme: str, group: int | None,
                  source: SourceInfo | None) -> None:
    op = node.op
    if isinstance(op, tuple(QUANTIZED_OPS.values())):
        raise ConfigError(node_message(path, op.op_name, "this layer is quantized already",
                                       source=source))
    if path.endswith((".lora_A", ".lora_B")):
        raise ConfigError(node_message(
            path, op.op_name, "this is a LoRA adapter's layer: adapters stay float, to train "
            "(QLoRA) or to merge; quantize the layer it adapts "
            f"({path.rpartition('.')[0]!r})", source=source))
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
        raise ConfigError(node_message(path, op.op_name, f"{e.problem}; {_group_hint(e, group)}",
                                       source=source)) from None


def _groupable(paths: list[str], nodes: dict, graph: Graph, scheme: str, group: int | None,
               source: SourceInfo | None) -> list[str]:
    """The default targets an int4 group divides (each checked as an explicit target
    is); the others stay float, listed in one ``mg.QuantizeWarning`` with the group
    size that would take them (as an explicit target each is an ``mg.ConfigError``).
    Without a group every default target is quantizable by construction."""
    if group is None:
        return paths
    kept, left, first = [], {}, None
    for path in paths:
        try:
            _check_target(path, nodes[path], graph, scheme, group, source)
            kept.append(path)
        except ConfigError as e:
            found = re.search(r"groups the (\d+) inputs", e.problem)
            left[path] = int(found.group(1)) if found else 0
            first = first or e
    if not left:
        return kept
    if not kept and len(left) == 1:
        raise first  # type: ignore[misc]
    listed = ", ".join(f"{path} ({n} inputs)" for path, n in list(left.items())[:8])
    more = f" and {len(left) - 8} more" if len(left) > 8 else ""
    sizes = [n for n in left.values() if n % 2 == 0]
    smaller = next((g for g in range(group - 2, 1, -2) if sizes and all(n % g == 0 for n in sizes)), None)
    hint = (f"; group_size={smaller} divides {'all of them' if len(sizes) == len(left) else 'the even ones'}"
            if smaller else "")
    message = (f"quantize: {scheme!r} groups inputs by group_size={group}, which does not divide "
               f"the inputs of {len(left)} layer{'s' if len(left) > 1 else ''}: {listed}{more}{hint}")
    if not kept:
        raise ConfigError(f"{message}; no layer of graph {graph.name!r} is left to quantize")
    warnings.warn(QuantizeWarning(f"{message}. {'They stay' if len(left) > 1 else 'It stays'} float "
                                  f"(the default targets take every layer the scheme can quantize "
                                  f"as it is)"), stacklevel=3)
    return kept


def _group_hint(error: ShapeError, group: int) -> str:
    """What to do when ``group`` does not divide a layer's inputs: the even group sizes
    that do, or leaving the layer out when none does."""
    found = re.search(r"groups the (\d+) inputs", str(error.problem))
    if found is None:
        return "leave this layer out of targets"
    inputs = int(found.group(1))
    divisors = [g for g in range(2, inputs + 1, 2) if inputs % g == 0]
    if not divisors:
        return (f"no even group size divides {inputs}: leave this layer out of targets "
                f"(targets= the other layers, e.g. from graph.select)")
    best = max((g for g in divisors if g <= group), default=divisors[0])
    return (f"pass group_size={best} (even sizes dividing {inputs}: "
            f"{', '.join(map(str, divisors[:6]))}{' ...' if len(divisors) > 6 else ''}) or leave "
            f"this layer out of targets")


def _quantized_op(op: Any, specs: Any, scheme: str, group: int | None) -> Any:
    """The quantized form of float layer ``op`` (its input specs resolve a Conv's
    kernel size)."""
    if isinstance(op, Conv):
        op = op.resolved(specs)
    cls = QUANTIZED_OPS[op.op_name]
    # A Dequantize node rescales the product of a layer reading a quantized input.
    attrs = op.attrs()
    if cls is QuantizedMultiHeadAttention and attrs.get("param_axes"):
        # the kernels are matrices: a float (d, heads, head_dim) override names two dims
        attrs["param_axes"] = matrix_param_axes(attrs["param_axes"], scheme)
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

    def prepare(self, graph: Graph) -> dict:
        """The Quantize nodes made so far, by what they cast: layers reading one value
        (Llama's gate and up projections) read one Quantize node."""
        return {}

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
        zero = (self.scheme == "int8" and isinstance(quantized, QuantizedLinear)
                and _one_signed(rewrite, x))
        cast_of = (x, quantized.input_dtype, axes, zero)
        q = rewrite.data.get(cast_of)
        if q is None:  # one cast of a value for all the layers reading it
            name = rewrite.fresh(node.name + ".quantize")
            cast = Quantize(quantized.input_dtype, axes, zero_point=zero, name=name)
            q = rewrite.data[cast_of] = rewrite.emit(Node(name, cast, (x,), (), name, self.source),
                                                     infer=True)
        # The layer's product, then a Dequantize node: scales, bias, activation.
        activation = getattr(node.op, "activation", None)
        layer = quantized
        kept = rewrite.keep(node.replace(op=layer, inputs=tuple(q.value(i)
                                                                for i in range(2 + zero))))
        axis = 1 if isinstance(layer, Conv) and not layer.channels_last else -1
        name = rewrite.fresh(node.name + ".dequantize")
        back = Dequantize(activation, axis, rewrite.spec(x).dtype, name=name)
        inputs = (kept.value(0), q.value(1)) + tuple(kept.value(i)
                                                     for i in range(1, len(kept.outputs)))
        d = rewrite.emit(Node(name, back, inputs, (), name, self.source), infer=True)
        return (d.value(0),)


#: Activations whose outputs are of one sign but for a small bound (ReLU's >= 0,
#: GELU's >= -0.17, SiLU's >= -0.28): a symmetric int8 range wastes half its levels on
#: them.
ONE_SIGNED = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "softmax")


def _one_signed(rewrite: Rewrite, x: Any) -> bool:
    """Whether value ``x`` is the output of an activation of ``ONE_SIGNED`` (as its own
    layer, or the ``activation`` of a Linear or Conv)."""
    producer = next((n for n in reversed(rewrite.nodes) if n.name == x.node), None)
    if producer is None:
        return False
    op = producer.op
    return op.op_name in ONE_SIGNED or getattr(op, "activation", None) in ONE_SIGNED
