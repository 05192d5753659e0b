"""What the zoo's builders share: activations by their Hugging Face names, dropout
where the config asks for it, and the equal blocks of a stack."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping
from typing import Any

from .. import ops
from ..core.errors import ConfigError
from .config import Config

__all__ = ["activation", "dropout", "AxisOverrides", "ROW_PARALLEL"]

#: The kernel axes of a Transformer's down-projection (Megatron's row-parallel layer:
#: the input features split like the up-projection's outputs, one all-reduce after).
ROW_PARALLEL = {"kernel": ("mlp", "embed"), "bias": ("embed",)}

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


class AxisOverrides:
    """A builder's ``axes=``: layer name (as in the params tree; a pattern with ``*``
    matches several) -> ``{weight path: logical axes}``, given to each layer it names as
    ``param_axes``. A block's layer is named as inside the block (``"attn"``), and its
    override holds in every block (they share one definition). A name that matches no
    layer is a ``ConfigError`` once the graph is built (``check``)."""

    def __init__(self, model: str, axes: Mapping[str, Mapping[str, Any]] | None):
        if axes is not None and not isinstance(axes, Mapping):
            raise ConfigError(f"{model}: axes= maps layer names to {{weight path: logical "
                              f"axes}}, got {type(axes).__name__}")
        self.model = model
        self.axes = dict(axes or {})
        self.used: set[str] = set()
        self.names: list[str] = []

    def __call__(self, name: str, defaults: Mapping[str, Any] | None = None) -> Any:
        """The ``param_axes`` of the layer ``name``: its ``defaults`` with the user's
        overrides on top (None when neither has any)."""
        self.names.append(name)
        result = dict(defaults or {})
        for pattern, weights in self.axes.items():
            if fnmatch.fnmatchcase(name, pattern):
                if not isinstance(weights, Mapping):
                    raise ConfigError(f"{self.model}: axes[{pattern!r}] maps weight paths "
                                      f"(\"kernel\", \"key/kernel\") to logical axes, got "
                                      f"{type(weights).__name__}")
                self.used.add(pattern)
                result.update(weights)
        return result or None

    def check(self) -> None:
        unused = [p for p in self.axes if p not in self.used]
        if unused:
            near = difflib.get_close_matches(unused[0], self.names, n=3, cutoff=0.5)
            raise ConfigError(f"{self.model}: axes= names {unused[0]!r}, which matches no layer "
                              f"with weights" + (f"; near: {', '.join(map(repr, near))}" if near else
                                                 f"; layers: {', '.join(map(repr, sorted(set(self.names))[:12]))}"))
