"""Adapters: layers added beside a graph's layers by one rewrite (LoRA), their weights
picked out of params and folded back into the base weights; quantization, the same kind
of rewrite, turning layers into their quantized forms; BatchNorm folded into the layer
before it, for inference."""

from .fold import fold_batch_norm
from .lora import lora
from .lora_weights import lora_params
from .merge import merge_lora
from .quantize import quantize
from .quantized_weights import quantize_weights

__all__ = ["fold_batch_norm", "lora", "lora_params", "merge_lora", "quantize", "quantize_weights"]
