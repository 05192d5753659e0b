"""The ``onnx`` family's rotary embeddings and Fourier transforms: RotaryEmbedding
(interleaved or split halves, a partial rotary dim, position ids), DFT (real or
complex input, forward or inverse, one-sided)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .dtypes import canonical
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
