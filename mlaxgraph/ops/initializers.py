"""Default initializers, as module-level functions so that layers using them compare
equal and print by name. Any ``jax.nn.initializers`` initializer may be passed instead."""

from __future__ import annotations

import jax

__all__ = ["zeros", "ones", "lecun_normal", "lecun_normal_conv_channels_last",
           "lecun_normal_conv_channels_first"]

_dense = jax.nn.initializers.lecun_normal(in_axis=-2, out_axis=-1)
_conv_last = jax.nn.initializers.lecun_normal(in_axis=-1, out_axis=0)
_conv_first = jax.nn.initializers.lecun_normal(in_axis=1, out_axis=0)


def zeros(key, shape, dtype):
    return jax.numpy.zeros(shape, dtype)


def ones(key, shape, dtype):
    return jax.numpy.ones(shape, dtype)


# Constants draw nothing: ``init`` calls them without a key (no key to derive or split).
zeros.keyless = True  # type: ignore[attr-defined]
ones.keyless = True  # type: ignore[attr-defined]


def lecun_normal(key, shape, dtype):
    """Truncated normal with variance 1/fan_in; fan_in is the second-to-last axis."""
    return _dense(key, shape, dtype)


def lecun_normal_conv_channels_last(key, shape, dtype):
    """LeCun normal for an O...I kernel: fan_in = spatial size * input channels."""
    return _conv_last(key, shape, dtype)


def lecun_normal_conv_channels_first(key, shape, dtype):
    """LeCun normal for an OI... kernel: fan_in = input channels * spatial size."""
    return _conv_first(key, shape, dtype)
