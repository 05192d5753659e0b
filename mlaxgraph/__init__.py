"""mlaxgraph: compose neural networks as symbolic graphs of layers, compile them into
one pure, jitted init/apply, and inspect, render and export them. Pure JAX underneath.

Example:
  >>> import jax, jax.numpy as jnp
  >>> import mlaxgraph as mg
  >>> from mlaxgraph import ops
  >>> x = mg.Input(("batch", 784), name="pixels")
  >>> y = ops.Linear(10, name="logits")(ops.relu(ops.Linear(128)(x)))
  >>> model = mg.compile(mg.Graph(inputs=x, outputs=y, name="mlp"))
  >>> params, state = model.init(jax.random.key(0))
  >>> logits, state = model.apply(params, state, jnp.zeros((32, 784)))
  >>> logits.shape, logits.dtype
  ((32, 10), dtype('float32'))
"""

from . import aten, models, ops, train
from .adapters import fold_batch_norm, lora, lora_params, merge_lora, quantize, quantize_weights
from .analysis.cost import CostTable, LayerCost
from .analysis.hlo.by_layer import HloByLayer, HloOperation
from .analysis.policy_comparison import PolicyComparison, compare_policies
from .aten import from_torch
from .compiler.compile import CompiledModel, compile
from .compiler.policy import Policy
from .core.errors import (
    AdapterWarning,
    CheckError,
    ConfigError,
    DTypeError,
    FoldWarning,
    GraphError,
    MlaxGraphError,
    QuantizeWarning,
    SerializationError,
    ShapeError,
    ShardingError,
    UnverifiedFileWarning,
)
from .core.specs import TensorSpec
from .core.version import __version__
from .decode import Decoder, decoder, generate, generate_stream, sampling
from .io.exported import ExportedModel, load_exported
from .io.functions import register_function
from .io.model_file import load, save
from .ir import Graph, Input, Node, Sequential, SymbolicTensor, Value
from .models.peft import lora_from_peft
from .onnx import from_onnx
from .render.html import diff_html, show
from .train import Trainer

__all__ = [
    "MlaxGraphError", "GraphError", "ShapeError", "DTypeError", "SerializationError",
    "ShardingError", "ConfigError", "CheckError", "UnverifiedFileWarning", "FoldWarning", "AdapterWarning",
    "QuantizeWarning",
    "TensorSpec", "Graph", "Input", "Sequential", "Node", "Value", "SymbolicTensor",
    "Policy", "compile", "CompiledModel", "ops", "save", "load", "register_function",
    "CostTable", "LayerCost", "HloByLayer", "HloOperation", "ExportedModel", "load_exported",
    "PolicyComparison", "compare_policies", "show", "diff_html", "train", "Trainer", "models",
    "lora", "lora_params", "merge_lora", "fold_batch_norm", "lora_from_peft", "quantize", "quantize_weights",
    "from_onnx", "aten", "from_torch",
    "decoder", "Decoder", "generate", "generate_stream", "sampling",
    "__version__",
]
