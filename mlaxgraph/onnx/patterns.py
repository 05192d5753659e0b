"""The patterns ``from_onnx`` reads as mlaxgraph's own layers, so summaries, FLOPs and
``hlo_by_layer`` read as for a model built here:

- ``MatMul`` by a constant 2-D weight, and the ``Add`` of a constant bias that alone
  reads it -> ``Linear`` (``kernel``, ``bias``); ``Gemm`` with a constant ``B``
  (alpha = beta = 1, ``transA`` = 0) -> ``Linear``; a kernel several nodes read is one
  ``Linear`` called at each when each is that ``Linear``, else none of them;
- ``Conv`` with a constant weight (and bias) -> ``Conv`` (channel-first, OIHW kernel);
- ``LayerNormalization`` over the last axis with a constant scale (and bias) ->
  ``LayerNorm``;
- ``BatchNormalization`` in inference form with constant statistics -> ``BatchNorm``
  (``scale``, ``bias``; state ``mean``, ``var``);
- ``Gather`` (axis 0) of integer ids from a constant 2-D float table that nothing else
  reads -> ``Embedding`` (``embedding``); a table read besides only through a
  ``Transpose`` by ``MatMul`` s (a tied output head, ``to_onnx``'s form of
  ``embedding.attend``) -> ``Embedding`` and ``embedding.attend`` for the MatMuls.
  A negative id counts from the end, as ONNX's ``Gather`` (``less``, ``add`` and
  ``where`` layers before the ``Embedding``); an out-of-range one gives a NaN row, as
  ``Embedding`` does.

Each rule takes a node (and what the reader knows) and returns the layer's outputs,
or None when the node does not match.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..ops.conv import Conv
from ..ops.elementwise import Add, Less
from ..ops.embedding import Embedding
from ..ops.linear import Linear
from ..ops.normalization import BatchNorm, LayerNorm
from ..ops.tensor import Where

__all__ = ["match"]


def _weight(reader: Any, name: str, rank: int | None = None) -> np.ndarray | None:
    from .weights import Weight as _Weight

    value = _value(reader, name) if name else None
    if not isinstance(value, _Weight) or value.array.dtype.kind != "f":
        return None
    if rank is not None and value.array.ndim != rank:
        return None
    return value.array


def _layer_name(reader: Any, node: Any, fallback: str) -> str:
    """The node's scope (``/encoder/fc/MatMul`` -> ``encoder.fc``) as the layer's name;
    nested, the layer is ``fc`` in the block ``encoder``."""
    from .reader import _safe_name, _text, scope_of

    scope_text = _text(node.name).strip("/").rpartition("/")[0]
    name = _safe_name(scope_text or _text(node.name), reader.used, fallback)
    scope, _ = scope_of(node.name)
    if scope:
        reader.places[name] = (scope[:-1], scope[-1])
        reader.modules.add(name)
    return name


def _store(reader: Any, name: str, params: dict, state: dict | None = None) -> None:
    reader.params[name] = {k: jnp.asarray(v) for k, v in params.items()}
    if state:
        reader.state[name] = {k: jnp.asarray(v) for k, v in state.items()}


def _value(reader: Any, name: str) -> Any:
    """A value, or the weight an ``Identity`` not read yet will pass on."""
    if name in reader.values:
        return reader.values[name]
    return reader.values.get((reader.aliases or {}).get(name, ""))


def _root(reader: Any, name: str) -> str:
    """The initializer a value is (through ``Identity`` nodes)."""
    return getattr(_value(reader, name), "name", name)


def _linear_form(reader, node, attrs) -> tuple | None:
    """``(kernel, bias, last node, key)`` of the ``Linear`` a ``MatMul`` (and the ``Add``
    of a bias) or a ``Gemm`` is, or None; ``key`` names its weights, so that the nodes
    reading one kernel are one layer."""
    if node.op_type == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
        kernel = _weight(reader, node.input[1], 2)
        if kernel is None:
            return None
        kernel = kernel.T if attrs.get("transB", 0) else kernel
        bias_name = node.input[2] if len(node.input) > 2 else ""
        bias = _weight(reader, bias_name, 1) if bias_name else None
        if bias_name and (bias is None or bias.shape != kernel.shape[1:]):
            return None
        last = node
    else:
        kernel = _weight(reader, node.input[1], 2)
        if kernel is None:
            return None
        bias, bias_name, last = None, "", node
        users = reader.consumers.get(node.output[0], [])
        if len(users) == 1 and users[0].op_type == "Add" and node.output[0] not in reader.outputs:
            add = users[0]
            other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            candidate = _weight(reader, other, 1)
            if candidate is not None and candidate.shape == kernel.shape[1:]:
                bias, bias_name, last = candidate, other, add
    key = (_root(reader, node.input[1]), bool(attrs.get("transB", 0)),
           _root(reader, bias_name) if bias is not None else None)
    return kernel, bias, last, key


def _shared(reader, key: tuple) -> bool:
    """Whether the kernel ``key`` names may be a ``Linear``'s: read by this node alone,
    or only by nodes that are the same ``Linear`` (one layer called again, its weights
    one copy). Read otherwise too, it stays one weight and the nodes ONNX operators."""
    from .protos import attribute_value
    from .weights import readers

    nodes, outputs = readers(reader, key[0])
    if len(nodes) + outputs <= 1:
        return True
    for n in nodes:
        if outputs or n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            return False
        form = _linear_form(reader, n, {a.name: attribute_value(a, reader.folder, n.name)
                                        for a in n.attribute})
        if form is None or form[3] != key:
            return False
    return True


def _linear(reader, node, attrs):
    form = _linear_form(reader, node, attrs)
    if form is None:
        return None
    kernel, bias, last, key = form
    x = reader.values[node.input[0]]
    if isinstance(x, np.ndarray) or not hasattr(x, "shape") or not x.shape or \
            x.shape[-1] != kernel.shape[0] or not _shared(reader, key):
        return None
    if last is not node:
        reader.done.add(id(last))
    layer = reader.shared.get(key)
    if layer is None:
        name = _layer_name(reader, node, "linear")
        layer = reader.shared[key] = Linear(int(kernel.shape[1]), use_bias=bias is not None,
                                            name=name)
        _store(reader, name, {"kernel": kernel, **({"bias": bias} if bias is not None else {})})
    return last.output, (layer(reader.tensor(node.input[0])),)


def _conv(reader, node, attrs):
    kernel = _weight(reader, node.input[1])
    bias = _weight(reader, node.input[2], 1) if len(node.input) > 2 and node.input[2] else None
    if kernel is None or kernel.ndim not in (3, 4, 5) or (len(node.input) > 2 and node.input[2]
                                                          and bias is None):
        return None
    auto = attrs.get("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID", "SAME_UPPER"):
        return None
    nd = kernel.ndim - 2
    pads = attrs.get("pads") or (0,) * (2 * nd)
    padding: Any = "SAME" if auto == "SAME_UPPER" else tuple(
        (int(pads[i]), int(pads[i + nd])) for i in range(nd))
    # the nodes reading one kernel (and bias) alike are one layer called again
    key = ("conv", _root(reader, node.input[1]), _root(reader, node.input[2]) if bias is not None else None,
           repr(sorted(attrs.items())))
    layer = reader.shared.get(key)
    if layer is None:
        name = _layer_name(reader, node, "conv")
        layer = reader.shared[key] = Conv(
            int(kernel.shape[0]), tuple(int(k) for k in kernel.shape[2:]),
            strides=tuple(attrs.get("strides") or (1,) * nd), padding=padding,
            dilation=tuple(attrs.get("dilations") or (1,) * nd), groups=int(attrs.get("group", 1)),
            use_bias=bias is not None, data_format="NCHW", precision="highest", name=name)
        _store(reader, name, {"kernel": kernel, **({"bias": bias} if bias is not None else {})})
    return node.output, (layer(reader.tensor(node.input[0])),)


def _layer_norm(reader, node, attrs):
    if len(node.output) > 1 and any(node.output[1:]):
        return None
    x = reader.values[node.input[0]]
    scale = _weight(reader, node.input[1], 1)
    bias = _weight(reader, node.input[2], 1) if len(node.input) > 2 and node.input[2] else None
    if scale is None or not hasattr(x, "shape") or not x.shape or \
            attrs.get("axis", -1) not in (-1, len(x.shape) - 1):
        return None
    # a scale or bias ONNX broadcasts ((1,) for a last axis of 4) is left to the operator
    if any(w is not None and w.shape != (x.shape[-1],) for w in (scale, bias)) or \
            (len(node.input) > 2 and node.input[2] and bias is None):
        return None
    name = _layer_name(reader, node, "layer_norm")
    layer = LayerNorm(epsilon=float(attrs.get("epsilon", 1e-5)), use_bias=bias is not None,
                      name=name)
    _store(reader, name, {"scale": scale, **({"bias": bias} if bias is not None else {})})
    return node.output[:1], (layer(reader.tensor(node.input[0])),)


def _batch_norm(reader, node, attrs):
    if len(node.output) > 1 or attrs.get("training_mode", 0):
        return None
    weights = [_weight(reader, name, 1) for name in node.input[1:5]]
    if len(weights) != 4 or any(w is None for w in weights):
        return None
    scale, bias, mean, var = weights
    name = _layer_name(reader, node, "batch_norm")
    layer = BatchNorm(momentum=float(attrs.get("momentum", 0.9)),
                      epsilon=float(attrs.get("epsilon", 1e-5)), axis=1, name=name)
    _store(reader, name, {"scale": scale, "bias": bias}, {"mean": mean, "var": var})
    return node.output, (layer(reader.tensor(node.input[0])),)


def _ties(reader: Any, node: Any, table: str) -> list | None:
    """The ``Transpose`` nodes through which MatMuls alone read ``table`` besides
    ``node`` (a tied head: ``h @ table.T``), or None when anything else reads it."""
    from .weights import Weight as _Weight

    root = reader.values[table].name if isinstance(reader.values.get(table), _Weight) else table
    names = {root} | {k for k, v in (reader.aliases or {}).items() if v == root}
    names |= {n.output[0] for n in reader.model.graph.node
              if n.op_type == "Identity" and n.input and n.input[0] in names and n.output}
    if names & reader.outputs:
        return None
    ties = []
    for name in names:
        for user in reader.consumers.get(name, []):
            if user is node or (user.op_type == "Identity" and user.output[0] in names):
                continue
            perm = [a.ints for a in user.attribute if a.name == "perm"]
            if user.op_type != "Transpose" or (perm and list(perm[0]) != [1, 0]) or \
                    user.output[0] in reader.values or user.output[0] in reader.outputs or \
                    not all(m.op_type == "MatMul" and list(m.input).index(user.output[0]) == 1
                            for m in reader.consumers.get(user.output[0], [])):
                return None
            ties.append(user)
    return ties


class Tied:
    """A tied head's transposed table (``Transpose`` of an ``Embedding``'s table): the
    MatMuls reading it are ``embedding.attend``."""

    def __init__(self, layer: Embedding):
        self.layer = layer


def _embedding(reader, node, attrs):
    table = _weight(reader, node.input[0], 2)
    ids = reader.values[node.input[1]]
    if table is None or int(attrs.get("axis", 0)) != 0 or isinstance(ids, np.ndarray) or \
            not hasattr(ids, "dtype") or not jnp.issubdtype(ids.dtype, jnp.integer):
        return None
    ties = _ties(reader, node, node.input[0])
    if ties is None:
        return None
    name = _layer_name(reader, node, "embedding")
    layer = Embedding(int(table.shape[0]), int(table.shape[1]), dtype=table.dtype, name=name)
    _store(reader, name, {"embedding": table})
    out = layer(_from_end(reader, name, reader.tensor(node.input[1]), int(table.shape[0])))
    for tie in ties:
        reader.values[tie.output[0]] = Tied(layer)
        reader.done.add(id(tie))
    return node.output, (out,)


def _from_end(reader: Any, name: str, ids: Any, rows: int) -> Any:
    """Signed ids as ONNX's ``Gather`` reads them: a negative one counts from the end
    (``Embedding`` gives it a NaN row); one out of range stays out of range (NaN)."""
    from .reader import _safe_name

    if not jnp.issubdtype(ids.dtype, jnp.signedinteger):
        return ids
    parts = {}
    for part in ("negative", "from_end", "ids"):
        parts[part] = _safe_name(f"{name}.{part}", reader.used, part)
        if name in reader.places:
            scope, last = reader.places[name]
            reader.places[parts[part]] = (scope, f"{last}.{part}")
    negative = Less(constant=0, name=parts["negative"])(ids)
    return Where(name=parts["ids"])(negative, Add(constant=rows, name=parts["from_end"])(ids),
                                    ids)


def _attend(reader, node, attrs):
    """A MatMul by a tied table's transpose: ``embedding.attend``."""
    tied = reader.values.get(node.input[1])
    if not isinstance(tied, Tied):
        return None
    return node.output, (tied.layer.attend(reader.tensor(node.input[0])),)


_ARITY = {"MatMul": 2, "Gemm": 2, "Conv": 2, "LayerNormalization": 2, "BatchNormalization": 5,
          "Gather": 2}
_RULES = {"MatMul": _linear, "Gemm": _linear, "Conv": _conv,
          "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm,
          "Gather": _embedding}


def match(reader: Any, node: Any, attrs: dict) -> tuple | None:
    """``(output names, output tensors)`` when ``node`` is read as a layer of ours."""
    rule = _RULES.get(node.op_type)
    if rule is None or not reader.layers or not node.output or \
            len(node.input) < _ARITY[node.op_type]:
        return None
    if not all(v in reader.values for v in node.input if v):
        return None
    if node.op_type == "MatMul" and isinstance(reader.values.get(node.input[1]), Tied):
        return _attend(reader, node, attrs)
    return rule(reader, node, attrs)
