"""Adapters: layers added beside a graph's layers by one rewrite (LoRA), their weights
picked out of params and folded back into the base weights."""

from .lora import lora, lora_params
from .merge import merge_lora

__all__ = ["lora", "lora_params", "merge_lora"]
