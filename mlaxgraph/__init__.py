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

from .errors import (MlaxGraphError, GraphError, ShapeError, DTypeError, SerializationError,
                     ShardingError)
from .specs import TensorSpec
from .ir import Graph, Input, Node, Value, SymbolicTensor
from .policy import Policy
from .compile import compile, CompiledModel
from . import ops
from .io.save import save, load
from .io.functions import register_function
from .cost_table import CostTable, LayerCost
from .hlo_layers import HloByLayer, HloOperation
from .exported import ExportedModel, load_exported
from .policy_comparison import PolicyComparison, compare_policies
from .render.html import show, diff_html
from . import train

__version__ = "0.1.0"

__all__ = [
    "MlaxGraphError", "GraphError", "ShapeError", "DTypeError", "SerializationError",
    "ShardingError",
    "TensorSpec", "Graph", "Input", "Node", "Value", "SymbolicTensor",
    "Policy", "compile", "CompiledModel", "ops", "save", "load", "register_function",
    "CostTable", "LayerCost", "HloByLayer", "HloOperation", "ExportedModel", "load_exported",
    "PolicyComparison", "compare_policies", "show", "diff_html", "train",
    "__version__",
]
