"""Independent NumPy references for the numerics tests (float64, loops where it keeps
them obvious). Nothing here imports mlaxgraph or JAX: these are the "ground truth" the
layers are compared against."""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["same_pads", "conv", "max_pool", "batch_norm", "softmax", "log_softmax",
           "gelu", "sigmoid", "relu", "silu", "rand"]


def rand(shape, seed=0, low=None, high=None):
    """A float32 array of standard normals (or uniforms in [low, high))."""
    gen = np.random.default_rng(seed)
    if low is not None:
        return gen.uniform(low, high, size=shape).astype(np.float32)
    return gen.standard_normal(size=shape).astype(np.float32)


def same_pads(size, window, stride, dilation=1):
    """TensorFlow/XLA "SAME": output ceil(size / stride), the extra padding at the end."""
    out = -(-size // stride)
    effective = (window - 1) * dilation + 1
    total = max((out - 1) * stride + effective - size, 0)
    return (total // 2, total - total // 2)


def _pads(padding, spatial, kernel, strides, dilation):
    if padding == "VALID":
        return [(0, 0)] * len(spatial)
    if padding == "SAME":
        return [same_pads(n, k, s, d) for n, k, s, d in zip(spatial, kernel, strides, dilation)]
    return [tuple(p) for p in padding]


def conv(x, kernel, bias=None, strides=None, padding="VALID", dilation=None, groups=1,
         channels_last=True):
    """N-D convolution (cross-correlation, as every DL framework) by explicit loops over
    the kernel taps. Channel-last: x (N, *S, C), kernel OHWI (O, *K, C // groups).
    Channel-first: x (N, C, *S), kernel OIHW (O, C // groups, *K)."""
    x = np.asarray(x, np.float64)
    kernel = np.asarray(kernel, np.float64)
    if not channels_last:  # to channel-last, and back at the end
        n = x.ndim - 2
        x = np.moveaxis(x, 1, -1)
        kernel = np.moveaxis(kernel, 1, -1)
    n = x.ndim - 2
    ksize = kernel.shape[1:-1]
    strides = (1,) * n if strides is None else tuple(strides)
    dilation = (1,) * n if dilation is None else tuple(dilation)
    pads = _pads(padding, x.shape[1:-1], ksize, strides, dilation)
    xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)])
    out_sizes = [(xp.shape[1 + i] - ((ksize[i] - 1) * dilation[i] + 1)) // strides[i] + 1
                 for i in range(n)]
    features = kernel.shape[0]
    cin_g = kernel.shape[-1]
    cout_g = features // groups
    y = np.zeros((x.shape[0], *out_sizes, features))
    for g in range(groups):
        xg = xp[..., g * cin_g:(g + 1) * cin_g]
        wg = kernel[g * cout_g:(g + 1) * cout_g]
        for tap in itertools.product(*(range(k) for k in ksize)):
            sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                       for t, d, o, s in zip(tap, dilation, out_sizes, strides))
            patch = xg[(slice(None),) + sl]                      # (N, *out, cin_g)
            w = wg[(slice(None),) + tap]                          # (cout_g, cin_g)
            y[..., g * cout_g:(g + 1) * cout_g] += patch @ w.T
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if not channels_last:
        y = np.moveaxis(y, -1, 1)
    return y


def max_pool(x, window, strides=None, padding="VALID"):
    """Channel-last max pooling; padding counts as -inf (the minimum for integers)."""
    x = np.asarray(x)
    n = x.ndim - 2
    strides = tuple(window) if strides is None else tuple(strides)
    pads = _pads(padding, x.shape[1:-1], window, strides, (1,) * n)
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
        fill = -np.inf
    else:
        fill = np.iinfo(x.dtype).min
    xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)], constant_values=fill)
    out_sizes = [(xp.shape[1 + i] - window[i]) // strides[i] + 1 for i in range(n)]
    y = None
    for tap in itertools.product(*(range(w) for w in window)):
        sl = tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(tap, out_sizes, strides))
        patch = xp[(slice(None),) + sl]
        y = patch if y is None else np.maximum(y, patch)
    return y


def batch_norm(x, scale, bias, mean, var, *, momentum, epsilon, axis=-1, training=True):
    """Returns (y, new_mean, new_var). Training: batch mean and biased variance;
    new = momentum * old + (1 - momentum) * batch. Inference: running statistics."""
    x = np.asarray(x, np.float64)
    axis = axis % x.ndim
    reduce = tuple(i for i in range(x.ndim) if i != axis)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    mean = np.asarray(mean, np.float64)
    var = np.asarray(var, np.float64)
    if training:
        bmean = x.mean(axis=reduce)
        bvar = ((x - bmean.reshape(shape)) ** 2).mean(axis=reduce)   # biased
        new_mean = momentum * mean + (1 - momentum) * bmean
        new_var = momentum * var + (1 - momentum) * bvar
        use_mean, use_var = bmean, bvar
    else:
        new_mean, new_var = mean, var
        use_mean, use_var = mean, var
    y = (x - use_mean.reshape(shape)) / np.sqrt(use_var.reshape(shape) + epsilon)
    if scale is not None:
        y = y * np.asarray(scale, np.float64).reshape(shape)
    if bias is not None:
        y = y + np.asarray(bias, np.float64).reshape(shape)
    return y, new_mean, new_var


def relu(x):
    return np.maximum(np.asarray(x, np.float64), 0.0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def silu(x):
    x = np.asarray(x, np.float64)
    return x * sigmoid(x)


def gelu(x, approximate=False):
    x = np.asarray(x, np.float64)
    if approximate:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
