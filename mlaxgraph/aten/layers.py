"""The module calls read as mlaxgraph's own layers, so summaries, FLOPs, state dicts
and ``hlo_by_layer`` read as for a model built here: each rule takes an ATen node whose
weights are the module's parameters and returns the layer, its weights in our layout
and the node's tensor argument. ``nn.Linear`` (``aten.linear``), ``nn.Conv1d/2d/3d``
(``aten.conv2d``, ``aten.convolution``), ``nn.BatchNorm*`` (``aten.batch_norm``,
``aten._native_batch_norm_legit_no_training``, ``..._legit_functional``), ``nn.LayerNorm``
over the last dim (``aten.layer_norm``), ``nn.Embedding`` (``aten.embedding``) and
``nn.Dropout`` (``aten.dropout``, ``aten.native_dropout``).

Each call computes in its own mode, as ATen's ``training`` argument says: a rule
reads a BatchNorm or Dropout as our layer (which follows ``apply``'s
``inference_mode``) only when the call's mode is the program's; a BatchNorm left in
eval mode inside a train-mode module (frozen: its running statistics used, not
updated) and ``F.dropout(training=False)`` stay ATen operators computing in theirs.
``trains(nodes)`` is the program's mode: whether a call computes differently in train
mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..ops.conv import Conv
from ..ops.dropout import Dropout
from ..ops.embedding import Embedding
from ..ops.linear import Linear
from ..ops.normalization import BatchNorm, LayerNorm

__all__ = ["Match", "match_layer", "LAYER_TARGETS", "trains"]


class Match(NamedTuple):
    layer: Any               # the layer, without a name yet (``layer(name)``)
    owner: str | None        # the module its weights belong to ("" for the top module's own)
    params: dict             # our weight name -> the program's tensor name
    state: dict              # likewise for state
    convert: dict            # our weight name -> how to lay the tensor out (a function)
    input: Any               # the node's tensor argument ({"ref": ...})


def _owner(targets: list[str | None]) -> str | None:
    """The module owning weights named ``<module>.weight`` ...: None when they are not
    all parameters of one module."""
    given = [t for t in targets if t is not None]
    if any(t.rpartition(".")[2] not in _NAMES for t in given):
        return None  # not the module's own weight and bias (MultiheadAttention's in_proj_weight)
    modules = {t.rpartition(".")[0] for t in given}
    return modules.pop() if len(modules) == 1 else None


_NAMES = ("weight", "bias", "running_mean", "running_var")


def _tuple(v: Any, n: int) -> tuple:
    return tuple(v) * (n if len(v) == 1 else 1) if isinstance(v, list) else (v,) * n


def _linear(args, kwargs, weight, shape, training):
    w, b = weight(args[1]), weight(args[2]) if len(args) > 2 else None
    if w is None or (len(args) > 2 and args[2] is not None and b is None):
        return None
    out = shape(args[1])[0]
    params = {"kernel": w, **({"bias": b} if b else {})}
    return Match(lambda name: Linear(int(out), use_bias=b is not None, precision="highest", name=name),
                 _owner([w, b]), params, {}, {"kernel": lambda a: a.T}, args[0])


def _conv(args, kwargs, weight, shape, training, core=False):
    w = weight(args[1])
    b = weight(args[2]) if len(args) > 2 and args[2] is not None else None
    if w is None or (len(args) > 2 and args[2] is not None and b is None):
        return None
    k = shape(args[1])
    nd = len(k) - 2
    if core:
        stride, padding, dilation, transposed, _, groups = args[3:9]
        if transposed:
            return None
    else:
        stride, padding, dilation, groups = (list(args[3:]) + [1, 0, 1, 1][len(args) - 3:])[:4] \
            if len(args) > 3 else (1, 0, 1, 1)
    if isinstance(padding, str):  # "valid": none; "same" (stride 1): PyTorch's, the odd one right
        totals = [d * (int(n) - 1) if padding == "same" else 0
                  for d, n in zip(_tuple(dilation, nd), k[2:])]
        pads = tuple((t // 2, t - t // 2) for t in totals)
    else:
        pads = tuple((p, p) for p in _tuple(padding, nd))
    params = {"kernel": w, **({"bias": b} if b else {})}

    def make(name):
        return Conv(int(k[0]), tuple(int(d) for d in k[2:]), strides=_tuple(stride, nd), padding=pads,
                    dilation=_tuple(dilation, nd), groups=int(groups), use_bias=b is not None,
                    data_format="NCHW", precision="highest", name=name)
    return Match(make, _owner([w, b]), params, {}, {}, args[0])


def _batch_norm(args, kwargs, weight, shape, training, core=False):
    """``aten.batch_norm(x, weight, bias, running_mean, running_var, training, momentum,
    eps, ...)`` (``core``: ``..._no_training(x, weight, bias, mean, var, momentum, eps)``).
    Without weight and bias (``affine=False``) a BatchNorm without scale and bias; a call
    without running statistics, or in a mode other than the program's, is no layer."""
    names = [weight(a, any_kind=True) if a is not None else None for a in args[1:5]]
    if names[2] is None or names[3] is None or any(
            a is not None and n is None for a, n in zip(args[1:3], names[:2])):
        return None
    momentum, eps = (args[5], args[6]) if core else (args[6], args[7])
    if momentum is None or (False if core else bool(args[5])) != training:
        return None
    params = {k: v for k, v in (("scale", names[0]), ("bias", names[1])) if v is not None}
    state = {"mean": names[2], "var": names[3]}
    return Match(lambda name: BatchNorm(momentum=1.0 - float(momentum), epsilon=float(eps), axis=1,
                                        use_scale=names[0] is not None, use_bias=names[1] is not None,
                                        unbiased_running_var=True, name=name),
                 _owner(names), params, state, {}, args[0])


def _layer_norm(args, kwargs, weight, shape, training):
    if len(args) < 3 or len(args[1]) != 1:
        return None
    w = weight(args[2])
    b = weight(args[3]) if len(args) > 3 and args[3] is not None else None
    if w is None or (len(args) > 3 and args[3] is not None and b is None):
        return None
    eps = args[4] if len(args) > 4 else 1e-5
    params = {"scale": w, **({"bias": b} if b else {})}
    return Match(lambda name: LayerNorm(epsilon=float(eps), use_bias=b is not None, name=name),
                 _owner([w, b]), params, {}, {}, args[0])


def _embedding(args, kwargs, weight, shape, training):
    # padding_idx (args[2]) changes only the gradient (the padding row gets none),
    # not the lookup, so a padded embedding is an Embedding too (its row is trained)
    w = weight(args[0])
    if w is None or (len(args) > 3 and any(args[3:])):
        return None
    n, d = shape(args[0])
    return Match(lambda name: Embedding(int(n), int(d), name=name), _owner([w]),
                 {"embedding": w}, {}, {}, args[1])


def _dropout(args, kwargs, weight, shape, training):
    """``aten.dropout(x, p, train)``, ``aten.native_dropout(x, p, train)``: a call with
    ``train=False`` (``F.dropout(training=False)``) is the identity, no layer."""
    p = float(args[1]) if len(args) > 1 else 0.5
    train = args[2] if len(args) > 2 else kwargs.get("train", False)
    if not 0.0 <= p < 1.0 or not train:
        return None
    return Match(lambda name: Dropout(p, name=name), None, {}, {}, {}, args[0])


def _core(rule: Callable) -> Callable:
    return lambda a, k, w, s, t: rule(a, k, w, s, t, core=True)


_RULES: dict[str, Callable] = {
    "aten.linear.default": _linear,
    "aten.conv1d.default": _conv, "aten.conv2d.default": _conv, "aten.conv3d.default": _conv,
    "aten.conv1d.padding": _conv, "aten.conv2d.padding": _conv, "aten.conv3d.padding": _conv,
    "aten.convolution.default": _core(_conv),
    "aten.batch_norm.default": _batch_norm,
    "aten._native_batch_norm_legit_functional.default": _batch_norm,
    "aten.native_batch_norm.default": _batch_norm,
    "aten._native_batch_norm_legit_no_training.default": _core(_batch_norm),
    "aten.layer_norm.default": _layer_norm,
    "aten.embedding.default": _embedding,
    "aten.dropout.default": _dropout,
    "aten.native_dropout.default": _dropout,
}

_BATCH_NORMS = ("aten.batch_norm.default", "aten._native_batch_norm_legit_functional.default",
                "aten.native_batch_norm.default")
_DROPOUTS = ("aten.dropout.default", "aten.native_dropout.default", "aten.feature_dropout.default",
             "aten.dropout_.default", "aten.feature_dropout_.default", "aten.alpha_dropout.default",
             "aten.alpha_dropout_.default", "aten.feature_alpha_dropout.default",
             "aten.feature_alpha_dropout_.default")
_RECURRENT = ("aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input")


def trains(nodes: list[dict]) -> bool:
    """Whether a program's nodes compute differently in train mode: a BatchNorm with
    running statistics called with ``training=True``, a dropout with ``train=True``,
    attention with ``dropout_p > 0``, a recurrent module's dropout between layers."""
    for node in nodes:
        target, args, kwargs = node["target"], node["args"], node["kwargs"]
        if target in _BATCH_NORMS and len(args) > 5 and args[5] is True and args[3] is not None:
            return True
        if target in _DROPOUTS and (args[2] if len(args) > 2 else kwargs.get("train")) is True:
            return True
        if target in _RECURRENT and len(args) > 6 and args[6] is True and args[5] and args[4] > 1:
            return True  # dropout between layers
        if target == "aten.scaled_dot_product_attention.default":
            p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            if isinstance(p, (int, float)) and p > 0:
                return True
    return False


#: The ATen operators read as mlaxgraph's layers.
LAYER_TARGETS = tuple(sorted(_RULES))


def match_layer(target: str, args: list, kwargs: dict, weight: Callable, shape: Callable,
                training: bool = False) -> Match | None:
    """The layer a node is, or None. ``weight(arg)`` is the parameter an argument
    names (its state-dict name) or None; ``shape(arg)`` its shape; ``training`` the
    program's mode. A weightless layer (dropout) has no owner."""
    rule = _RULES.get(target)
    if rule is None:
        return None
    found = rule(args, kwargs, weight, shape, training)
    if found is None or (found.owner is None and (found.params or found.state)):
        return None
    return found


def as_array(value: Any) -> np.ndarray:
    return np.asarray(value)
