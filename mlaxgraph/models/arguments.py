"""The arguments of the zoo's weight readers and writers (``load_state_dict``,
``to_state_dict``, ``lora_from_peft``), written out for their message on an unknown
keyword, and where PyTorch's, transformers' and PEFT's names for them go here."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import ConfigError

__all__ = ["float_dtype", "LOAD_STATE_DICT_HINTS", "LOAD_STATE_DICT_SIGNATURE", "LORA_FROM_PEFT_HINTS",
           "LORA_FROM_PEFT_SIGNATURE", "SAVE_ADAPTER_SIGNATURE", "TASK_TYPES", "TO_STATE_DICT_HINTS",
           "TO_STATE_DICT_SIGNATURE"]

LOAD_STATE_DICT_SIGNATURE = ("load_state_dict(graph, state_dict, strict=True, dtype='float32', "
                             "adapter=None)")
TO_STATE_DICT_SIGNATURE = ("to_state_dict(graph, params, state=None, dtype=None, "
                           "adapter_only=False, modules_to_save=())")
LORA_FROM_PEFT_SIGNATURE = "lora_from_peft(graph, folder)"
SAVE_ADAPTER_SIGNATURE = ("save_adapter(graph, params, folder, base_model_name_or_path=None, "
                          "lora_dropout=None, modules_to_save=None, state=None, task_type=None, "
                          "like=None)")
#: PEFT's ``TaskType`` values (``adapter_config.json``'s ``task_type``).
TASK_TYPES = ("SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS",
              "FEATURE_EXTRACTION")

_ON_HOST = ("the arrays are read as NumPy on the host; place them with jax.device_put, or "
            "shard them with the compiled model's sharding")
_ONE_ADAPTER = "one adapter a graph: lora_from_peft(graph, folder) for each folder"
LOAD_STATE_DICT_HINTS = {
    "assign": "torch's assign is not needed: load_state_dict returns new (params, state)",
    "torch_dtype": "transformers' torch_dtype is dtype=",
    "map_location": f"torch.load's map_location is not needed: {_ON_HOST}",
    "device_map": f"transformers' device_map is not needed: {_ON_HOST}",
    "weights_only": "files are read as safetensors, which hold no code: nothing to allow",
    "adapter_name": f"PEFT's adapter_name is not needed: {_ONE_ADAPTER}, then adapter=folder",
    "model_id": "PEFT's model_id is adapter=, the adapter's folder",
}
TO_STATE_DICT_HINTS = {
    "keep_vars": "the arrays are NumPy copies: there are no variables to keep",
    "safe_serialization": "to_state_dict returns the arrays, which "
                          "safetensors.numpy.save_file writes; mg.models.save_adapter writes "
                          "the folder PEFT reads",
}
LORA_FROM_PEFT_HINTS = {
    "adapter_name": f"PEFT's adapter_name is not needed: {_ONE_ADAPTER}",
    "is_trainable": "adapters are weights like the others: mg.train.Trainer(..., "
                    "trainable='*/lora_*') trains only them",
    "config": "a config is given as folder: lora_from_peft(graph, config_dict)",
    "model_id": "PEFT's model_id is folder, the second argument",
}


def float_dtype(dtype: Any, where: str) -> np.dtype | None:
    """``dtype=`` of the readers and writers: None or a float dtype (an int8 or bool
    dtype would turn the weights into another thing)."""
    if dtype is None:
        return None
    try:
        out = np.dtype(jnp.dtype(dtype))
    except (TypeError, ValueError):
        out = None
    if out is None or not (np.issubdtype(out, np.floating) or out.name == "bfloat16"):
        raise ConfigError(f"{where}: dtype is the dtype of the floating weights, a float dtype "
                          f"('float32', 'bfloat16', 'float16'), got {dtype!r}")
    return out
