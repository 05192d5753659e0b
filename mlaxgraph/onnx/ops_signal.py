"""The ``onnx`` family's rotary embeddings and signal processing: RotaryEmbedding
(interleaved or split halves, a partial rotary dim, position ids), DFT (real or
complex input, forward or inverse, one-sided), STFT, the windows (Hann, Hamming,
Blackman) and MelWeightMatrix. The windows and the mel matrix have only static
inputs: they are constants of the graph, computed when it is built."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from .dtypes import canonical, to_dtype
from .layer import define


@define("RotaryEmbedding", dtypes="float")
def _rotary(a, x, cos, sin, positions=None):
    shape = x.shape
    y = jnp.transpose(x, (0, 2, 1, 3)) if x.ndim == 4 else x  # (batch, seq, heads, head)
    if x.ndim == 3:
        heads = a["num_heads"]
        y = y.reshape(shape[0], shape[1], heads, shape[2] // heads)
    dim = a.get("rotary_embedding_dim", 0) or y.shape[-1]
    rot, rest = y[..., :dim], y[..., dim:]
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    if a.get("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = jnp.split(rot, 2, axis=-1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if a.get("interleaved", 0):
        rot = jnp.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rot, rest], axis=-1).astype(x.dtype)
    return out.reshape(shape) if x.ndim == 3 else jnp.transpose(out, (0, 2, 1, 3))


@define("DFT", static=(1, 2), flops="input")
def _dft(a, x, length=None, axis=None):
    if a.opset < 20:
        axis = a.get("axis", 1)
    else:
        axis = -2 if axis is None else int(np.asarray(axis).reshape(-1)[0])
    axis = axis % x.ndim
    # in the widest float JAX runs (float64 under jax_enable_x64), as numpy's FFT does
    wide = canonical(np.dtype("float64"))
    xw = x.astype(wide)
    signal = xw[..., 0] + 0j if x.shape[-1] == 1 else xw[..., 0] + 1j * xw[..., 1]
    inverse, onesided = a.get("inverse", 0), a.get("onesided", 0)
    if length is not None and np.size(length):
        n = int(np.asarray(length).reshape(-1)[0])
    else:
        n = 2 * (signal.shape[axis] - 1) if inverse and onesided else signal.shape[axis]
    if inverse and onesided:
        return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    out = (jnp.fft.ifft if inverse else jnp.fft.fft)(signal, n=n, axis=axis)
    if onesided:
        out = jnp.take(out, jnp.arange(n // 2 + 1), axis=axis)
    return jnp.stack([out.real, out.imag], axis=-1).astype(x.dtype)


@define("STFT", static=(1, 3), flops="input")
def _stft(a, x, step, window=None, length=None):
    """Frames ``frame_step`` apart, each multiplied by the window, each one's DFT:
    ``(batch, frames, bins, 2)``, the bins one-sided unless ``onesided=0``."""
    hop = int(np.asarray(step).reshape(-1)[0])
    if length is not None:
        n = int(np.asarray(length).reshape(-1)[0])
    elif window is not None:
        n = window.shape[0]
    else:
        raise ShapeError("STFT needs a window or a frame_length", expected="window or frame_length")
    frames = (x.shape[1] - n) // hop + 1
    wide = canonical(np.dtype("float64"))
    xw = x.astype(wide)
    signal = xw[..., 0] + 0j if x.shape[-1] == 1 else xw[..., 0] + 1j * xw[..., 1]
    at = np.arange(frames)[:, None] * hop + np.arange(n)[None, :]
    pieces = signal[:, at]  # (batch, frames, n)
    if window is not None:
        pieces = pieces * window.astype(wide)
    out = jnp.fft.fft(pieces, axis=-1)
    if a.get("onesided", 1):
        out = out[..., :n // 2 + 1]
    return jnp.stack([out.real, out.imag], axis=-1).astype(x.dtype)


def _window(a, size, terms):
    """``sum_k c_k cos(2 pi k n / N)`` for ``n < size``, ``N = size`` (periodic, the
    default) or ``size - 1`` (symmetric), in the type ``output_datatype`` names."""
    n = int(np.asarray(size).reshape(-1)[0])
    span = n if a.get("periodic", 1) else n - 1
    phase = 2 * np.pi * np.arange(n, dtype=np.float64) / span if span else np.zeros(n)
    out = sum(c * np.cos(k * phase) for k, c in enumerate(terms))
    return jnp.asarray(out.astype(to_dtype(a.get("output_datatype", 1))))


@define("HannWindow", static=(0,), flops="none")
def _hann(a, size):
    return _window(a, size, (0.5, -0.5))


@define("HammingWindow", static=(0,), flops="none")
def _hamming(a, size):
    return _window(a, size, (25 / 46, -21 / 46))


@define("BlackmanWindow", static=(0,), flops="none")
def _blackman(a, size):
    return _window(a, size, (0.42, -0.5, 0.08))


@define("MelWeightMatrix", static=(0, 1, 2, 3, 4), flops="none")
def _mel(a, mel_bins, dft_length, sample_rate, low, high):
    """Triangular filters of peak 1, ``(dft_length // 2 + 1, mel_bins)``: ``mel_bins
    + 2`` edges spaced evenly in mel (``2595 log10(1 + f / 700)``) from ``low`` by
    ``(mel(high) - mel(low)) / (mel_bins + 2)``, each edge on the spectrum's bin
    ``floor((dft_length + 1) f / sample_rate)``; filter i rises from edge i to edge
    i + 1 and falls to edge i + 2."""
    m, length = (int(np.asarray(v).reshape(-1)[0]) for v in (mel_bins, dft_length))
    rate, lo, hi = (float(np.asarray(v).reshape(-1)[0]) for v in (sample_rate, low, high))
    mel = [2595 * np.log10(1 + f / 700) for f in (lo, hi)]
    edges_mel = mel[0] + np.arange(m + 2) * (mel[1] - mel[0]) / (m + 2)
    hertz = 700 * (10 ** (edges_mel / 2595) - 1)
    edges = np.floor((length + 1) * hertz / rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(length // 2 + 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = np.where(center > left, (j - left) / (center - left), 1.0)
        fall = (right - j) / (right - center)
    out = np.where((j >= left) & (j <= center) & ((center > left) | (j == center)), rise, 0.0)
    out = np.where((j >= center) & (j < right), fall, out)
    return jnp.asarray(out.astype(to_dtype(a.get("output_datatype", 1))))


def _heads(x, heads: int):
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3)


@define("LinearAttention", dtypes="float", flops="input")
def _linear_attention(a, q, k, v, past=None, decay=None, beta=None):
    """The recurrent form, one ``lax.scan`` step per position: the state decays
    (``gated``), is corrected toward the value (``delta``) and accumulates ``k v^T``;
    each query reads it."""
    from jax import lax

    rule = a.get("update_rule", "gated_delta")
    qh, kvh = a["q_num_heads"], a["kv_num_heads"]
    b, t, _ = q.shape
    q4, k4, v4 = (_heads(x, h).astype(jnp.float32) for x, h in ((q, qh), (k, kvh), (v, kvh)))
    d_k, d_v = q4.shape[-1], v4.shape[-1]
    if decay is not None:
        decay4 = (decay.reshape(b, t, kvh, 1).transpose(0, 2, 1, 3) if decay.shape[-1] == kvh
                  else _heads(decay, kvh)).astype(jnp.float32)
    if beta is not None:
        beta4 = beta.reshape(b, t, beta.shape[-1], 1).transpose(0, 2, 1, 3).astype(jnp.float32)
    state = jnp.zeros((b, kvh, d_k, d_v), jnp.float32) if past is None else past.astype(jnp.float32)
    scale = a.get("scale") or 1.0 / np.sqrt(d_k)
    group = qh // kvh

    def step(state, i):
        k_t, v_t = k4[:, :, i], v4[:, :, i]
        if rule in ("gated", "gated_delta"):
            state = state * jnp.exp(decay4[:, :, i])[..., None]
        if rule in ("delta", "gated_delta"):
            v_t = beta4[:, :, i] * (v_t - jnp.einsum("bhdm,bhd->bhm", state, k_t,
                                                     precision=lax.Precision.HIGHEST))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        read = jnp.repeat(state, group, axis=1) if group > 1 else state
        return state, scale * jnp.einsum("bhd,bhdm->bhm", q4[:, :, i], read,
                                         precision=lax.Precision.HIGHEST)

    state, outs = lax.scan(step, state, jnp.arange(t))
    out = jnp.transpose(outs, (1, 0, 2, 3)).reshape(b, t, qh * d_v)
    return out.astype(q.dtype), state.astype(q.dtype if past is None else past.dtype)
