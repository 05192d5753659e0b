"""Independent NumPy references (float64) for the second layer set: LayerNorm, RMSNorm,
GroupNorm, AvgPool, global pooling, Embedding, MultiHeadAttention, LSTM and GRU.

Like ``_reference.py`` this imports neither mlaxgraph nor JAX: the formulas are written
from api.md (section 5) and the usual definitions (PyTorch / Keras), with explicit loops
where they keep the math obvious."""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["layer_norm", "rms_norm", "group_norm", "avg_pool", "global_avg_pool",
           "global_max_pool", "embedding", "multi_head_attention", "causal", "lstm", "gru",
           "sigmoid", "softmax"]


def _f64(x):
    return np.asarray(x, np.float64)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-_f64(x)))


def softmax(x, axis=-1):
    x = _f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- normalization -------------------------------------------------------------------


def layer_norm(x, scale=None, bias=None, epsilon=1e-5, axis=-1):
    """Mean and BIASED variance over ``axis`` of each example; per-feature scale/bias."""
    x = _f64(x)
    axis = axis % x.ndim
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).sum(axis=axis, keepdims=True) / x.shape[axis]     # divide by n
    y = (x - mean) / np.sqrt(var + epsilon)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if scale is not None:
        y = y * _f64(scale).reshape(shape)
    if bias is not None:
        y = y + _f64(bias).reshape(shape)
    return y


def rms_norm(x, scale, epsilon=1e-6):
    """``x / sqrt(mean(x**2) + eps) * scale`` over the last axis (no centering)."""
    x = _f64(x)
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + epsilon)
    return x / rms * _f64(scale)


def group_norm(x, num_groups, scale, bias, epsilon=1e-5):
    """Channel-last ``(batch, *spatial, C)``: for each example and each of the groups of
    ``C // num_groups`` consecutive channels, the mean and biased variance over every
    spatial position and the group's channels. Written with a loop over groups."""
    x = _f64(x)
    c = x.shape[-1]
    per = c // num_groups
    y = np.empty_like(x)
    for b in range(x.shape[0]):
        for g in range(num_groups):
            block = x[b, ..., g * per:(g + 1) * per]
            mean = block.mean()
            var = ((block - mean) ** 2).mean()
            y[b, ..., g * per:(g + 1) * per] = (block - mean) / np.sqrt(var + epsilon)
    return y * _f64(scale) + _f64(bias)


# --- pooling -------------------------------------------------------------------------


def _same_pads(size, window, stride):
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return total // 2, total - total // 2


def avg_pool(x, window, strides=None, padding="VALID", count_include_pad=True):
    """Channel-last average pooling by explicit loops over output positions.
    ``count_include_pad``: divide by the full window size (padding counts as zeros) or
    by the number of real input elements in the window."""
    x = _f64(x)
    n = x.ndim - 2
    window = tuple(window)
    strides = window if strides is None else tuple(strides)
    spatial = x.shape[1:-1]
    if padding == "VALID":
        pads = [(0, 0)] * n
    elif padding == "SAME":
        pads = [_same_pads(s, w, st) for s, w, st in zip(spatial, window, strides)]
    else:
        pads = [tuple(p) for p in padding]
    out_sizes = [(s + lo + hi - w) // st + 1 for s, (lo, hi), w, st in zip(spatial, pads, window, strides)]
    y = np.zeros((x.shape[0], *out_sizes, x.shape[-1]))
    for pos in itertools.product(*(range(o) for o in out_sizes)):
        total = np.zeros((x.shape[0], x.shape[-1]))
        real = 0
        for tap in itertools.product(*(range(w) for w in window)):
            idx = [p * st + t - lo for p, st, t, (lo, _) in zip(pos, strides, tap, pads)]
            if all(0 <= i < s for i, s in zip(idx, spatial)):
                total += x[(slice(None), *idx)]
                real += 1
        count = math.prod(window) if count_include_pad else real
        y[(slice(None), *pos)] = total / count
    return y


def global_avg_pool(x, keepdims=False):
    x = _f64(x)
    return x.mean(axis=tuple(range(1, x.ndim - 1)), keepdims=keepdims)


def global_max_pool(x, keepdims=False):
    x = _f64(x)
    return x.max(axis=tuple(range(1, x.ndim - 1)), keepdims=keepdims)


# --- embedding -----------------------------------------------------------------------


def embedding(ids, table):
    """Row ``table[i]`` for each id; a NaN row for ids outside ``[0, rows)`` (negative
    ids included: they are not Python-style indices from the end)."""
    ids = np.asarray(ids)
    table = _f64(table)
    out = np.full(ids.shape + (table.shape[1],), np.nan)
    for index in np.ndindex(*ids.shape):
        i = int(ids[index])
        if 0 <= i < table.shape[0]:
            out[index] = table[i]
    return out


# --- attention -----------------------------------------------------------------------


def causal(length):
    """``mask[i, j] = j <= i``."""
    return np.tril(np.ones((length, length), bool))


def multi_head_attention(q_in, kv_in, params, mask=None):
    """Per batch element and per head, with explicit loops:
    ``q_h = x W_q[:, h, :] + b_q[h]`` (``W_q (d, heads, head_dim)``, ``b_q (heads,
    head_dim)``), likewise ``k_h``, ``v_h`` from ``kv_in``; weights ``softmax(q_h k_h^T /
    sqrt(head_dim))`` over the kv positions where the mask is True; ``o = sum_h (w_h v_h)
    W_o[h] + b_o`` (``W_o (heads, head_dim, out)``). ``mask`` broadcasts to ``(batch,
    heads, q_len, kv_len)``; rank 3 means ``(batch, q_len, kv_len)``."""
    q_in, kv_in = _f64(q_in), _f64(kv_in)
    p = {k: {n: _f64(v) for n, v in w.items()} for k, w in params.items()}
    batch, q_len, _ = q_in.shape
    kv_len = kv_in.shape[1]
    _, heads, head_dim = p["query"]["kernel"].shape
    out_features = p["out"]["kernel"].shape[-1]
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.ndim == 3:
            mask = mask[:, None]
        mask = np.broadcast_to(mask, (batch, heads, q_len, kv_len))
    out = np.zeros((batch, q_len, out_features))
    for b in range(batch):
        for h in range(heads):
            q = q_in[b] @ p["query"]["kernel"][:, h, :] + p["query"]["bias"][h]
            k = kv_in[b] @ p["key"]["kernel"][:, h, :] + p["key"]["bias"][h]
            v = kv_in[b] @ p["value"]["kernel"][:, h, :] + p["value"]["bias"][h]
            scores = q @ k.T / math.sqrt(head_dim)                      # (q_len, kv_len)
            if mask is not None:
                scores = np.where(mask[b, h], scores, -np.inf)
            weights = softmax(scores, axis=-1)
            out[b] += (weights @ v) @ p["out"]["kernel"][h]
    return out + p["out"]["bias"]


# --- recurrent -----------------------------------------------------------------------


def lstm(x, input_kernel, recurrent_kernel, bias):
    """Gate order i, f, g, o along the 4h axis; zero initial state.
    ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``.
    Returns (sequence of h (batch, time, h), final h, final c)."""
    x = _f64(x)
    W, U, b = _f64(input_kernel), _f64(recurrent_kernel), _f64(bias)
    hidden = U.shape[0]
    batch, time, _ = x.shape
    h = np.zeros((batch, hidden))
    c = np.zeros((batch, hidden))
    seq = np.zeros((batch, time, hidden))
    for t in range(time):
        z = x[:, t] @ W + h @ U + b
        i = sigmoid(z[:, 0 * hidden:1 * hidden])
        f = sigmoid(z[:, 1 * hidden:2 * hidden])
        g = np.tanh(z[:, 2 * hidden:3 * hidden])
        o = sigmoid(z[:, 3 * hidden:4 * hidden])
        c = f * c + i * g
        h = o * np.tanh(c)
        seq[:, t] = h
    return seq, h, c


def gru(x, input_kernel, recurrent_kernel, bias, recurrent_bias=None):
    """"Reset after" GRU (PyTorch's), gate order r, z, n along the 3h axis; zero initial
    state: ``r = sigmoid(x W_r + b_ir + h U_r + b_hr)``, ``z`` likewise,
    ``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``, ``h' = (1 - z) n + z h``.
    Returns (sequence of h, final h)."""
    x = _f64(x)
    W, U, b = _f64(input_kernel), _f64(recurrent_kernel), _f64(bias)
    bh = np.zeros_like(b) if recurrent_bias is None else _f64(recurrent_bias)
    hidden = U.shape[0]
    batch, time, _ = x.shape
    h = np.zeros((batch, hidden))
    seq = np.zeros((batch, time, hidden))
    sl = [slice(k * hidden, (k + 1) * hidden) for k in range(3)]
    for t in range(time):
        xw = x[:, t] @ W + b
        hu = h @ U + bh
        r = sigmoid(xw[:, sl[0]] + hu[:, sl[0]])
        z = sigmoid(xw[:, sl[1]] + hu[:, sl[1]])
        n = np.tanh(xw[:, sl[2]] + r * hu[:, sl[2]])
        h = (1 - z) * n + z * h
        seq[:, t] = h
    return seq, h
