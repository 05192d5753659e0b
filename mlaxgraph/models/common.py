"""What the zoo's builders share: activations by their Hugging Face names, dropout
where the config asks for it, and the equal blocks of a stack."""

from __future__ import annotations

from typing import Any

from .. import ops
from .config import Config

__all__ = ["activation", "dropout"]

#: Hugging Face's activation names (``ACT2FN``) -> our layer.
_ACTIVATIONS = {
    "gelu": lambda name: ops.Gelu(name=name),
    "gelu_new": lambda name: ops.Gelu(approximate=True, name=name),
    "gelu_pytorch_tanh": lambda name: ops.Gelu(approximate=True, name=name),
    "relu": lambda name: ops.Relu(name=name),
    "silu": lambda name: ops.Silu(name=name),
    "swish": lambda name: ops.Silu(name=name),
    "tanh": lambda name: ops.Tanh(name=name),
}


def activation(config: Config, field: str, name: str) -> Any:
    """The activation layer the config's ``field`` names, named ``name``."""
    return _ACTIVATIONS[config.choice(field, _ACTIVATIONS)](name)


def dropout(config: Config, field: str, name: str, x: Any) -> Any:
    """``x`` through a Dropout of the config's rate ``field``, named ``name``; ``x`` itself
    when the rate is 0 (no layer)."""
    rate = config.number(field, 0.0, 1.0)
    return ops.Dropout(rate, name=name)(x) if rate > 0 else x
