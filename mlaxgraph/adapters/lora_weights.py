"""The LoRA adapters' weights in a params tree: ``mg.lora_params``."""

from __future__ import annotations

from collections.abc import Mapping

from ..core.errors import GraphError
from ..ir.paths import is_adapter

__all__ = ["lora_params", "is_adapter"]


def lora_params(params: Mapping) -> dict:
    """The adapters' weights in ``params``: the ``*.lora_A`` and ``*.lora_B`` entries,
    in the same nested dicts (blocks, scans) as in ``params``.

    Example:
      >>> import jax, mlaxgraph as mg
      >>> from mlaxgraph import ops
      >>> x = mg.Input(("batch", 8), name="x")
      >>> g = mg.lora(mg.Graph(x, ops.Linear(16, name="fc")(x)), "fc", rank=2)
      >>> params, state = mg.compile(g).init(jax.random.key(0))
      >>> jax.tree.map(lambda w: w.shape, mg.lora_params(params))
      {'fc.lora_A': {'kernel': (8, 2)}, 'fc.lora_B': {'kernel': (2, 16)}}
    """
    if not isinstance(params, Mapping):
        raise GraphError(f"lora_params takes params (nested dicts), got {type(params).__name__}")
    out: dict = {}
    for key, value in params.items():
        if is_adapter(key):
            out[key] = value
        elif isinstance(value, Mapping):
            inner = lora_params(value)
            if inner:
                out[key] = inner
    return out
