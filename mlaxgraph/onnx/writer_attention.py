"""How ``to_onnx`` writes ``MultiHeadAttention``: from opset 23 as ONNX's own
Attention (grouped key/value heads by ``kv_num_heads``) and RotaryEmbedding operators
between the projections' MatMul (+ Add); for older opsets decomposed into primitive
operators: Reshape, Transpose, Slice, Neg and Concat for the rotation, Expand for the
grouped heads, MatMul, Where and Softmax for the attention itself. The masks (causal,
sliding window, the mask input) are boolean tensors built from positions in both forms.
LoRA adapters left unmerged (``mg.lora`` on the attention) are added to their
projections' outputs (a fused ``qkv`` adapter's output split in three), and an adapter
of the output projection reads the attended values, the node's second output.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..ops.rotary import inverse_frequencies, rotary_scale
from .dtypes import to_code
from .writer_shapes import dim_value, length_range, positions

__all__ = ["attention", "FUSED_OPSET"]

#: The first opset with the Attention and RotaryEmbedding operators.
FUSED_OPSET = 23


def attention(w, node, args, weights, stats, path):
    """``MultiHeadAttention`` in the form of ``w.opset`` (see the module)."""
    op = node.op
    count = len(op.delta_inputs)  # LoRA adapters' outputs, after the inputs (mg.lora)
    base = args[:len(args) - count]
    deltas = dict(zip(op.delta_inputs, args[len(base):]))
    head_dim = np.asarray(weights["query"]["kernel"]).shape[-1]
    q = _project(w, op, weights, base[0], "query", path, deltas.get("query"))
    k = _project(w, op, weights, base[1], "key", path, deltas.get("key"))
    v = _project(w, op, weights, base[1], "value", path, deltas.get("value"))
    if "qkv" in deltas:  # one adapter of the three fused: [q | k | v] along its features
        widths = w.constant(f"{path}.qkv.widths", np.asarray(
            [op.num_heads * head_dim, op.kv_heads * head_dim, op.kv_heads * head_dim], np.int64))
        parts = w.node("Split", [deltas["qkv"], widths], f"{path}/qkv", outputs=3, part=True, axis=-1)
        q, k, v = (w.node("Add", [x, d], f"{path}/{which}/lora", part=True)[0]
                   for x, d, which in zip((q, k, v), parts, ("query", "key", "value")))
    if w.opset >= FUSED_OPSET:
        attended = _fused(w, node, base, q, k, v, head_dim, path)
    else:
        attended = _decomposed(w, node, base, q, k, v, head_dim, path)
    heads = op.num_heads
    out_kernel = np.asarray(weights["out"]["kernel"]).reshape(heads * head_dim, -1)
    (y,) = w.node("MatMul", [attended, w.constant(f"{path}.out.kernel", out_kernel)],
                  f"{path}/out", part=True)
    if op.has_out_bias:
        bias = w.constant(f"{path}.out.bias", np.asarray(weights["out"]["bias"]))
        (y,) = w.node("Add", [y, bias], f"{path}/out", part=True)
    # an adapter of the output projection reads the attended values: the second output
    return [y, attended] if "out" in op.adapters else [y]


def _project(w, op, weights, x: str, which: str, path: str, delta: str | None = None) -> str:
    """``x @ kernel (+ bias) (+ delta``, an adapter's output): ``(batch, length, heads *
    head_dim)``."""
    kernel = np.asarray(weights[which]["kernel"])
    d, h, k = kernel.shape
    (y,) = w.node("MatMul", [x, w.constant(f"{path}.{which}.kernel", kernel.reshape(d, h * k))],
                  f"{path}/{which}", part=True)
    if op.use_bias:
        bias = np.asarray(weights[which]["bias"]).reshape(h * k)
        (y,) = w.node("Add", [y, w.constant(f"{path}.{which}.bias", bias)], f"{path}/{which}",
                      part=True)
    if delta is not None:
        (y,) = w.node("Add", [y, delta], f"{path}/{which}/lora", part=True)
    return y


def _fused(w, node, args, q, k, v, head_dim, path) -> str:
    """Attention (and RotaryEmbedding) on the ``(batch, length, heads * head_dim)``
    projections; the output is ``(batch, q_len, heads * head_dim)``."""
    op = node.op
    if op.rope is not None:
        q = _rotary_op(w, node, q, 0, op.num_heads, head_dim, f"{path}/query/rotary")
        k = _rotary_op(w, node, k, 1, op.kv_heads, head_dim, f"{path}/key/rotary")
    plain_causal = op.causal and op.sliding_window is None and len(args) == 2
    mask = None if plain_causal else _mask(w, node, args, path)
    if mask is not None:  # onnxruntime wants the mask's q_len row by row: broadcast to it
        q_len = w.input_specs[0].shape[1]
        rows = dim_value(w, node, q_len, f"{path}/mask_rows", source=(args[0], 1), vector=True)
        ones = w.constant(f"{path}.mask_ones", np.asarray([1, 1], np.int64))
        last = w.constant(f"{path}.mask_one", np.asarray([1], np.int64))
        (shape,) = w.node("Concat", [ones, rows, last], f"{path}/mask_rows", part=True, axis=0)
        (mask,) = w.node("Expand", [mask, shape], f"{path}/mask_rows", part=True)
    ins = [q, k, v] + ([mask] if mask is not None else [])
    return w.node("Attention", ins, f"{path}/attend", part=True, q_num_heads=op.num_heads,
                  kv_num_heads=op.kv_heads, scale=float(1 / np.sqrt(head_dim)),
                  is_causal=1 if plain_causal else None)[0]


def _decomposed(w, node, args, q, k, v, head_dim, path) -> str:
    op = node.op
    heads, kv_heads = op.num_heads, op.kv_heads
    dtype = node.outputs[0].dtype

    def split(x: str, which: str, h: int) -> str:  # (batch, length, h, head_dim)
        shape = w.constant(f"{path}.{which}.shape", np.asarray([0, 0, h, head_dim], np.int64))
        return w.node("Reshape", [x, shape], f"{path}/{which}", part=True)[0]

    q, k, v = split(q, "query", heads), split(k, "key", kv_heads), split(v, "value", kv_heads)
    if op.rope is not None:
        q = _rotate(w, node, q, 0, head_dim, f"{path}/query/rotary")
        k = _rotate(w, node, k, 1, head_dim, f"{path}/key/rotary")
    (q,) = w.node("Transpose", [q], f"{path}/query", part=True, perm=[0, 2, 1, 3])
    scale = w.constant(f"{path}.scale", np.asarray(1 / np.sqrt(head_dim), dtype))
    (q,) = w.node("Mul", [q, scale], f"{path}/query", part=True)
    (k,) = w.node("Transpose", [k], f"{path}/key", part=True, perm=[0, 2, 3, 1])
    (v,) = w.node("Transpose", [v], f"{path}/value", part=True, perm=[0, 2, 1, 3])
    if kv_heads != heads:  # query head n * group + g reads key/value head n
        k = _repeat_heads(w, k, heads // kv_heads, [0, heads, head_dim, -1], f"{path}/key")
        v = _repeat_heads(w, v, heads // kv_heads, [0, heads, -1, head_dim], f"{path}/value")
    (scores,) = w.node("MatMul", [q, k], f"{path}/scores", part=True)
    mask = _mask(w, node, args, path)
    if mask is not None:
        low = w.constant(f"{path}.low", np.asarray(jnp.finfo(dtype).min, dtype))
        (scores,) = w.node("Where", [mask, scores, low], f"{path}/scores", part=True)
    (probs,) = w.node("Softmax", [scores], f"{path}/scores", part=True, axis=-1)
    (y,) = w.node("MatMul", [probs, v], f"{path}/attend", part=True)
    (y,) = w.node("Transpose", [y], f"{path}/attend", part=True, perm=[0, 2, 1, 3])
    flat = w.constant(f"{path}.attend.shape", np.asarray([0, 0, heads * head_dim], np.int64))
    return w.node("Reshape", [y, flat], f"{path}/attend", part=True)[0]


def _repeat_heads(w, x: str, group: int, target: list[int], path: str) -> str:
    """``(batch, kv_heads, a, b)`` -> ``(batch, kv_heads * group, a, b)``, each head
    ``group`` times in a row (Hugging Face's ``repeat_kv``)."""
    axes = w.constant(f"{path}.repeat_axes", np.asarray([2], np.int64))
    (x,) = w.node("Unsqueeze", [x, axes], f"{path}/repeat", part=True)
    times = w.constant(f"{path}.repeat", np.asarray([1, 1, group, 1, 1], np.int64))
    (x,) = w.node("Expand", [x, times], f"{path}/repeat", part=True)
    shape = w.constant(f"{path}.repeat_shape", np.asarray(target, np.int64))
    return w.node("Reshape", [x, shape], f"{path}/repeat", part=True)[0]


def _mask(w, node, args, path) -> str | None:
    """The boolean mask broadcasting to the scores ``(batch, heads, q_len, kv_len)``:
    the mask input (rank 3 gets the heads axis), the causal one (with its sliding
    window), combined; None when there is neither."""
    op = node.op
    mask = None
    if len(args) > 2:
        mask = args[2]
        if len(w.input_specs[2].shape) == 3:
            axes = w.constant(f"{path}.mask_axes", np.asarray([1], np.int64))
            (mask,) = w.node("Unsqueeze", [mask, axes], f"{path}/mask", part=True)
    if op.causal:
        q_len, kv_len = w.input_specs[0].shape[1], w.input_specs[1].shape[1]
        rows = positions(w, node, q_len, f"{path}/causal_rows", [1], source=(args[0], 1))
        cols = positions(w, node, kv_len, f"{path}/causal_cols", [0], source=(args[1], 1))
        (causal,) = w.node("GreaterOrEqual", [rows, cols], f"{path}/causal", part=True)
        if op.sliding_window is not None:
            (gap,) = w.node("Sub", [rows, cols], f"{path}/window", part=True)
            size = w.constant(f"{path}.window", np.asarray(op.sliding_window, np.int64))
            (near,) = w.node("Less", [gap, size], f"{path}/window", part=True)
            (causal,) = w.node("And", [causal, near], f"{path}/window", part=True)
        mask = causal if mask is None else w.node("And", [mask, causal], f"{path}/mask",
                                                  part=True)[0]
    return mask


def _tables(w, node, x: str, which: int, dim: int, path: str, *, half: bool) -> tuple[str, str]:
    """``cos`` and ``sin`` of the angles ``position * frequency``, ``(length, dim)``
    (``half``: ``dim / 2``, the frequencies once), computed in float32 as
    ``ops.rotary_tables`` does, for the positions ``0 .. length - 1`` of axis 1 of
    ``x`` (input ``which`` of the layer)."""
    op, dtype = node.op, node.outputs[0].dtype
    inv = inverse_frequencies(dim, op.rope, op.rope_scaling)
    freq = (inv if half else np.concatenate([inv, inv]))[None]
    n = w.input_specs[which].shape[1]
    scale = np.float32(rotary_scale(op.rope_scaling))  # YaRN's attention factor
    if isinstance(n, int):
        angles = np.arange(n, dtype=np.float32)[:, None] * freq
        return (w.constant(f"{path}.cos", (np.cos(angles) * scale).astype(dtype)),
                w.constant(f"{path}.sin", (np.sin(angles) * scale).astype(dtype)))
    pos = length_range(w, node, n, f"{path}/positions", source=(x, 1))
    (pos,) = w.node("Cast", [pos], f"{path}/positions", part=True, to=to_code(np.dtype(np.float32)))
    axes = w.constant(f"{path}.axes", np.asarray([1], np.int64))
    (pos,) = w.node("Unsqueeze", [pos, axes], f"{path}/positions", part=True)
    (angles,) = w.node("Mul", [pos, w.constant(f"{path}.frequencies", freq)], f"{path}/angles",
                       part=True)
    tables = []
    for f in ("Cos", "Sin"):
        (t,) = w.node(f, [angles], f"{path}/{f.lower()}", part=True)
        if scale != 1:
            (t,) = w.node("Mul", [t, w.constant(f"{path}.scale", scale)], f"{path}/{f.lower()}_scale",
                          part=True)
        if dtype != np.float32:
            (t,) = w.node("Cast", [t], f"{path}/{f.lower()}", part=True, to=to_code(dtype))
        tables.append(t)
    return tables[0], tables[1]


def _rotate(w, node, x: str, which: int, dim: int, path: str) -> str:
    """``x * cos + rotate_half(x) * sin`` on ``(batch, length, heads, dim)``."""
    cos, sin = _tables(w, node, x, which, dim, path, half=False)
    axes = w.constant(f"{path}.table_axes", np.asarray([1], np.int64))
    (cos,) = w.node("Unsqueeze", [cos, axes], f"{path}/cos", part=True)
    (sin,) = w.node("Unsqueeze", [sin, axes], f"{path}/sin", part=True)
    last = w.constant(f"{path}.last", np.asarray([-1], np.int64))
    bounds = [w.constant(f"{path}.at{b}", np.asarray([b], np.int64)) for b in (0, dim // 2, dim)]
    (x1,) = w.node("Slice", [x, bounds[0], bounds[1], last], f"{path}/x1", part=True)
    (x2,) = w.node("Slice", [x, bounds[1], bounds[2], last], f"{path}/x2", part=True)
    (x2,) = w.node("Neg", [x2], f"{path}/x2", part=True)
    (turned,) = w.node("Concat", [x2, x1], f"{path}/turned", part=True, axis=-1)
    (a,) = w.node("Mul", [x, cos], f"{path}/cos", part=True)
    (b,) = w.node("Mul", [turned, sin], f"{path}/sin", part=True)
    return w.node("Add", [a, b], path, part=True)[0]


def _rotary_op(w, node, x: str, which: int, heads: int, dim: int, path: str) -> str:
    """RotaryEmbedding on ``(batch, length, heads * dim)``, its position ids
    ``0 .. length - 1`` for every batch row."""
    cos, sin = _tables(w, node, x, which, dim, path, half=True)
    n = w.input_specs[which].shape[1]
    ids = positions(w, node, n, f"{path}/ids", [0], source=(x, 1))
    (shape,) = w.node("Shape", [x], f"{path}/batch_length", part=True, start=0, end=2)
    (ids,) = w.node("Expand", [ids, shape], f"{path}/ids", part=True)
    return w.node("RotaryEmbedding", [x, cos, sin, ids], path, part=True, num_heads=heads)[0]
