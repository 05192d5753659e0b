"""The model zoo: real architectures as graphs whose layers carry the original
modules' names, and their original checkpoints (torchvision's, Hugging Face's) read
and written without torch."""

from .bert import bert
from .gpt2 import gpt2
from .llama import llama, qwen2
from .peft import lora_from_peft, save_adapter
from .resnet import resnet18, resnet34, resnet50
from .sharding import sharding_rules
from .state_dict import load_state_dict, to_state_dict
from .unet import unet
from .vit import vit

__all__ = ["resnet18", "resnet34", "resnet50", "gpt2", "bert", "vit", "llama", "qwen2", "unet",
           "load_state_dict", "to_state_dict", "sharding_rules", "lora_from_peft", "save_adapter"]
