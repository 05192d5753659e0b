"""Error-compensating rounding of quantized weights (GPTQ, Frantar et al. 2022):
``mg.quantize_weights(..., calibration=batches, method="gptq")``.

A layer's weights are rounded one input row at a time; the error each rounding makes
on the layer's output, measured by the Hessian ``H = X^T X`` of its inputs over the
calibration batches, is moved onto the rows not rounded yet, which absorb it. The
stored format is the scheme's own, with the same (absmax) scales: only which integer
(or float8 value) each weight rounds to changes.

Which inputs each weight multiplies is read from the quantized model itself: a
rewrite (``_Probe``) puts a named ``Identity`` node on the float input of every layer
GPTQ rounds (before its ``Quantize`` node when it reads a quantized input), and makes
each attention also output its heads' concatenated values (what its output projection
multiplies), read by another such node; one jitted call per batch captures them and
sums ``X^T X``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg.lapack

from ..compiler.compile import compile
from ..core.errors import ConfigError, MlaxGraphError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.rewrite import Rewrite, Rule, rewrite
from ..ir.surgery import layer_paths
from ..ops.function import F
from ..ops.quantize import FLOAT8, FLOAT8_MAX, INT4_MAX, INT4_MIN, INT8_MAX, Quantize, absmax_scale, pack_int4
from ..ops.quantized import QuantizedLinear
from ..ops.quantized_attention import PROJECTIONS, QuantizedMultiHeadAttention
from ..ops.quantized_embedding import QuantizedEmbedding
from ..ops.tensor import Identity

__all__ = ["gptq_round", "gptq_weight", "hessians", "gptq_params", "DAMP", "BLOCK"]

#: The damping added to the Hessian's diagonal, a share of its mean.
DAMP = 0.01
#: Rows rounded between two updates of the rest (the same result; the rows of a
#: block are updated row by row, the rest once per block).
BLOCK = 32
_INPUT, _KV, _CONTEXT = ".gptq_input", ".gptq_kv_input", ".gptq_context"


def gptq_round(w: Any, hessian: Any, scale: Any, scheme: str, *, damp: float = DAMP,
               block: int = BLOCK) -> np.ndarray:
    """The values (integers, or float8 values, as float64) GPTQ rounds ``w`` to.

    ``w``: ``(in, out)`` float weights (``y = x @ w``); ``hessian``: ``(in, in)``, the
    sum of ``x^T x`` over the calibration inputs; ``scale``: broadcasting to ``w``
    (``(1, out)`` per output channel; ``(in, out)`` per group, each row its group's).
    Rows are rounded in decreasing order of the Hessian's diagonal (the inputs that
    matter most first); an input the calibration never saw (zero diagonal) counts
    with weight 1; the diagonal gets ``damp`` times its mean. Row ``i`` rounds to
    ``q = round(w_i / s_i)`` (clipped to the scheme's range), then the rows after it
    absorb its error: ``w_j -= U_ij (w_i - q s_i) / U_ii`` with ``U`` the upper
    Cholesky factor of ``H^-1`` (``H^-1 = U^T U``).
    """
    w = np.array(w, dtype=np.float64)
    n = w.shape[0]
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), w.shape)
    h = np.array(hessian, dtype=np.float64)
    diag = np.diagonal(h).copy()
    diag[diag <= 0] = 1.0
    h[np.diag_indices(n)] = diag
    order = np.argsort(-diag, kind="stable")
    w, s, h = w[order], s[order], h[order][:, order]
    h[np.diag_indices(n)] += damp * float(np.mean(diag))
    u = _inverse_cholesky(h)
    rounder = _rounder(scheme)
    q = np.empty_like(w)
    for start in range(0, n, block):
        stop = min(start + block, n)
        rows = w[start:stop].copy()
        errors = np.empty_like(rows)
        for j in range(stop - start):
            i = start + j
            q[i] = rounder(rows[j] / s[i])
            errors[j] = (rows[j] - q[i] * s[i]) / u[i, i]
            rows[j + 1:] -= np.outer(u[i, i + 1:stop], errors[j])
        w[stop:] -= u[start:stop, stop:].T @ errors
    out = np.empty_like(q)
    out[order] = q
    return out


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``h^-1`` (``h^-1 = U^T U``) without forming
    ``h^-1``: with ``J`` the reversal and ``J h J = L L^T``, ``U = J L^-1 J``."""
    lower = np.linalg.cholesky(h[::-1, ::-1])
    inverse, info = scipy.linalg.lapack.dtrtri(lower, lower=1)
    if info:
        raise np.linalg.LinAlgError(f"the Cholesky factor is singular (LAPACK info {info})")
    return np.ascontiguousarray(inverse[::-1, ::-1])


def _rounder(scheme: str):
    if scheme == "float8":
        return lambda v: np.clip(v, -FLOAT8_MAX, FLOAT8_MAX).astype(np.float32).astype(
            FLOAT8).astype(np.float64)
    low, high = (INT4_MIN, INT4_MAX) if scheme == "int4_weight_only" else (-INT8_MAX, INT8_MAX)
    return lambda v: np.clip(np.round(v), low, high)


def gptq_weight(w: Any, hessian: Any, scheme: str, group: int | None) -> tuple[Any, Any]:
    """``(values, scale)`` of an ``(in, out)`` weight as ``quantize_weight(w, scheme,
    reduce=(0,), axis=0, group=group)`` stores it (the same absmax scales), its values
    rounded by ``gptq_round``."""
    w = jnp.asarray(w, jnp.float32)
    if scheme == "int4_weight_only":
        g = group or 2
        grouped = w.reshape(w.shape[0] // g, g, -1)
        scale = jnp.squeeze(absmax_scale(grouped, (1,), float(INT4_MAX)), 1)  # (in / g, out)
        rows = np.repeat(np.asarray(scale), g, axis=0)
        q = gptq_round(w, hessian, rows, scheme)
        return pack_int4(jnp.asarray(q, jnp.int8), 0), scale
    bound = FLOAT8_MAX if scheme == "float8" else float(INT8_MAX)
    scale = absmax_scale(w, (0,), bound)
    q = gptq_round(w, hessian, np.asarray(scale), scheme)
    dtype = FLOAT8 if scheme == "float8" else np.dtype(jnp.int8)
    return jnp.asarray(q.astype(np.float32)).astype(dtype), jnp.squeeze(scale, 0)


def gptq_params(op: Any, params: Mapping, found: Mapping[str, Any]) -> dict | None:
    """The stored weights of quantized layer ``op`` from its float ``params``, rounded
    by GPTQ with the Hessians ``found`` (``"input"``, ``"kv_input"``, ``"context"``);
    None for a layer GPTQ does not round (a Conv, a lookup-only Embedding)."""
    scheme, group = op.scheme, op.group_size
    if isinstance(op, QuantizedMultiHeadAttention):
        out: dict[str, Any] = {}
        for name in PROJECTIONS:
            p = dict(params[name])
            w = jnp.asarray(p["kernel"])
            if name == "out":
                matrix, h = w.reshape((-1, w.shape[-1])), found["context"]
            else:
                matrix = w.reshape((w.shape[0], -1))
                h = found["input"] if name == "query" else found.get("kv_input", found["input"])
            p["kernel"], p["kernel_scale"] = gptq_weight(matrix, h, scheme, group)
            out[name] = p
        return out
    if "input" not in found:
        return None
    if isinstance(op, QuantizedEmbedding):  # the tied head: y = x @ table^T
        values, scale = gptq_weight(jnp.asarray(params["embedding"]).T, found["input"], scheme,
                                    group)
        return {"embedding": values.T, "embedding_scale": scale.T}
    values, scale = gptq_weight(params["kernel"], found["input"], scheme, group)
    out = {"kernel": values, "kernel_scale": scale}
    if "bias" in params:
        out["bias"] = params["bias"]
    return out


# --- the Hessians -----------------------------------------------------------------------


def hessians(qgraph: Graph, params: Mapping, state: Mapping, batches: Iterable) -> dict:
    """``{layer path: {"input" | "kv_input" | "context": X^T X}}`` (float32) over
    ``batches``, from the quantized model ``(qgraph, params, state)`` run in inference
    mode: the inputs each weight GPTQ rounds multiplies."""
    probed = rewrite(qgraph, _Probe(), memo={})
    wanted: dict[str, tuple[str, str]] = {}  # capture path -> (layer, role)
    for path, node in layer_paths(probed):
        for suffix, role in ((_INPUT, "input"), (_KV, "kv_input"), (_CONTEXT, "context")):
            if isinstance(node.op, Identity) and path.endswith(suffix):
                wanted[path] = (path[:-len(suffix)], role)
    if not wanted:
        raise ConfigError(f"quantize_weights: method='gptq' rounds Linear, attention and tied "
                          f"head weights and graph {qgraph.name!r} quantizes none")
    apply = compile(probed).apply

    @jax.jit
    def sums(p, s, inputs):
        _, _, captured = apply(p, s, *inputs, inference_mode=True, capture=list(wanted))
        out = {}
        for path in wanted:
            x = captured[path].astype(jnp.float32)
            x = x.reshape((-1, x.shape[-1]))
            out[path] = (jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST),
                         jnp.asarray(x.shape[0], jnp.int32))  # and the tokens summed
        return out

    total: dict[str, Any] = {}
    rows: dict[str, int] = {}  # the tokens each Hessian sums over
    for number, batch in enumerate(batches):
        inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        try:
            batch_sums = sums(params, state, inputs)
        except MlaxGraphError as e:  # which batch, not only which input
            raise type(e)(f"quantize_weights: calibration batch {number}: {e}") from None
        for path, (h, count) in batch_sums.items():
            rows[path] = rows.get(path, 0) + int(count)
            total[path] = h if path not in total else total[path] + h
    if not total:
        raise ConfigError("quantize_weights: calibration gave no batch; method='gptq' needs a "
                          "few input batches")
    _warn_few_tokens(wanted, rows, total)
    found: dict[str, dict[str, Any]] = {}
    for path, (layer, role) in wanted.items():
        found.setdefault(layer, {})[role] = np.asarray(total[path], np.float64)
    for layer, first in _sharing(qgraph).items():  # one Quantize node read by several
        if first in found:
            found.setdefault(layer, {})["input"] = found[first]["input"]
    return found


def _sharing(qgraph: Graph) -> dict[str, str]:
    """``{layer path: path of the first layer reading the same Quantize node}`` for
    each rounded layer after the first that reads a shared one (the probe, named after
    the first, measures the input they share)."""
    first: dict[str, str] = {}
    out: dict[str, str] = {}
    paths = dict(layer_paths(qgraph))
    for path, node in paths.items():
        if not (node.inputs and _rounded(node)):
            continue
        prefix = path.rpartition("/")[0]
        source = (prefix + "/" if prefix else "") + node.inputs[0].node
        if not isinstance(getattr(paths.get(source), "op", None), Quantize):
            continue
        if source in first:
            out[path] = first[source]
        else:
            first[source] = path
    return out


def _warn_few_tokens(wanted: Mapping[str, tuple[str, str]], rows: Mapping[str, int],
                     total: Mapping[str, Any]) -> None:
    """A warning naming the layers whose Hessian sums fewer tokens than the layer has
    inputs: ``X^T X`` is then singular, and GPTQ's compensation, fitted to a few
    tokens, can round worse than absmax."""
    short = [(wanted[path][0], rows[path], total[path].shape[0]) for path in wanted
             if rows.get(path, 0) < total[path].shape[0]]
    if not short:
        return
    layer, tokens, inputs = short[0]
    need = max(n for _, _, n in short)
    more = f" (and {len(short) - 1} more layers)" if len(short) > 1 else ""
    warnings.warn(f"quantize_weights(method='gptq'): layer {layer!r} reads {inputs} inputs and "
                  f"the calibration batches give it {tokens} tokens{more}: its Hessian X^T X is "
                  f"singular, so GPTQ can round worse than absmax; give at least {need} "
                  f"calibration tokens (a few hundred or more)", UserWarning, stacklevel=4)


@dataclasses.dataclass(frozen=True)
class _Probe(Rule):
    """An ``Identity`` node ``<layer>.gptq_input`` on the float input of each quantized
    Linear, tied head and attention (``<layer>.gptq_kv_input`` on a cross attention's
    key/value input), and each quantized attention outputting its context too, read by
    ``<layer>.gptq_context`` (the path names one output: the attention's, with an
    output adapter the adapter's sum)."""

    def prepare(self, graph: Graph) -> dict[str, Node]:
        """Each ``Quantize`` node's name -> the layer reading its values."""
        readers: dict[str, Node] = {}
        for node in graph.nodes:
            if node.inputs and _rounded(node):
                readers.setdefault(node.inputs[0].node, node)
        return readers

    def visit(self, node: Node, rewrite: Rewrite):
        op = node.op
        if isinstance(op, Quantize):
            reader = rewrite.data.get(node.name)
            if reader is None:
                return None
            x = self._probe(node.inputs[0], reader.layer + _INPUT, rewrite)
            return node.replace(inputs=(x,) + node.inputs[1:])
        if isinstance(op, QuantizedMultiHeadAttention):
            q = self._probe(node.inputs[0], node.layer + _INPUT, rewrite)
            kv = q if node.inputs[1] == node.inputs[0] else \
                self._probe(node.inputs[1], node.layer + _KV, rewrite)
            adapters = op.adapters if "out" in op.adapters else op.adapters + ("out",)
            kept = rewrite.keep(node.replace(op=dataclasses.replace(op, adapters=adapters),
                                             inputs=(q, kv) + node.inputs[2:]))
            context = self._probe(kept.value(1), node.layer + _CONTEXT, rewrite)
            # the attention's output read with the probe, so that the probe stays live
            name = rewrite.fresh(node.layer + ".gptq_keep")
            live = rewrite.emit(Node(name, F(_first, name=name), (kept.value(0), context), (),
                                     name), infer=True)
            return [live.value(0)] + [kept.value(i) for i in range(1, len(node.outputs))]
        if _rounded(node) and len(node.inputs) == 1 and rewrite.spec(node.inputs[0]).is_float:
            # weight-only: the layer reads the float input itself
            x = self._probe(node.inputs[0], node.layer + _INPUT, rewrite)
            return node.replace(inputs=(x,) + node.inputs[1:])
        return None

    @staticmethod
    def _probe(x: Any, name: str, rewrite: Rewrite) -> Any:
        name = rewrite.fresh(name)
        node = rewrite.emit(Node(name, Identity(name=name), (x,), (), name), infer=True)
        return node.value(0)


def _first(x: Any, _: Any) -> Any:
    return x


def _rounded(node: Node) -> bool:
    """Whether GPTQ rounds the weights of ``node``'s layer (a Linear or a tied head)."""
    return isinstance(node.op, (QuantizedLinear, QuantizedEmbedding))
