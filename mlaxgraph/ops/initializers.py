"""Default initializers, as module-level functions so that layers using them compare
equal and print by name. Any ``jax.nn.initializers`` initializer may be passed instead."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax

__all__ = ["zeros", "ones", "lecun_normal", "lecun_normal_conv_channels_last",
           "lecun_normal_conv_channels_first", "normal", "uniform", "PARAMETRIC",
           "lora_a_uniform", "lora_a_uniform_conv"]

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


def lora_a_uniform(key, shape, dtype):
    """PEFT's default for ``lora_A``: PyTorch's ``kaiming_uniform_(a=sqrt(5))``, that is
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, fan_in the kernel's input size
    (all axes but the last of a ``(in, rank)`` kernel)."""
    fan_in = math.prod(shape[:-1])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def lora_a_uniform_conv(key, shape, dtype):
    """PEFT's default for a Conv's ``lora_A``: uniform in ``[-1/sqrt(fan_in),
    1/sqrt(fan_in)]``, fan_in = in_channels * prod(kernel_size): all axes but the first
    of our ``(rank, *kernel_size, in)`` (OHWI) or ``(rank, in, *kernel_size)`` (OIHW)
    kernel."""
    fan_in = math.prod(shape[1:])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def _parametric(family: str) -> Callable[[Callable], Callable]:
    """An initializer family of one number: ``family(x)`` is one function per value
    (cached, so layers holding the same one compare equal), carrying ``.family`` and
    ``.argument`` so that a file names it ``mlaxgraph.initializers.<family>:<x>``."""
    def wrap(make: Callable) -> Callable:
        @functools.cache
        def cached(x: float) -> Callable:
            init = make(x)
            init.__name__ = init.__qualname__ = f"{family}({x!r})"
            init.family, init.argument = family, x
            return init

        def factory(x: float) -> Callable:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
                raise ValueError(f"initializers.{family} takes a number >= 0, got {x!r}")
            return cached(float(x))

        factory.__name__ = factory.__qualname__ = family
        factory.__doc__ = make.__doc__
        return factory
    return wrap


@_parametric("normal")
def normal(std: float) -> Callable:
    """Normal with mean 0 and standard deviation ``std`` (not truncated), as PyTorch's
    ``nn.init.normal_`` and Hugging Face's ``initializer_range``."""
    def init(key, shape, dtype):
        return std * jax.random.normal(key, shape, dtype)
    return init


@_parametric("uniform")
def uniform(bound: float) -> Callable:
    """Uniform on ``[-bound, bound)``, as PyTorch's default for ``nn.Linear`` and
    ``nn.Conv2d`` with ``bound = 1 / sqrt(fan_in)``."""
    def init(key, shape, dtype):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


#: The families of one number, by the name files use.
PARAMETRIC = {"normal": normal, "uniform": uniform}
