"""PyTorch programs in: ``mg.from_torch`` reads a ``torch.export`` program (or exports
a module itself) as a typed graph whose nested blocks are the module hierarchy, and
the ``aten`` op family computes the ATen operators that are not layers of ours. Only
``capture`` imports torch; programs saved with ``save_program`` load without it."""

from . import ops_nn, ops_pool, ops_random, ops_recurrent, ops_table, ops_tensor  # noqa: F401
from .api import from_torch, inference_mode, save_program, supported_ops
from .layer import TABLE, AtenOp, Buffer, Mode, op_class
from .program import load_program

__all__ = ["from_torch", "save_program", "load_program", "supported_ops", "inference_mode",
           "AtenOp", "Buffer", "Mode", "TABLE", "op_class"]
