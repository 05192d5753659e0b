"""ONNX in and out: ``from_onnx`` reads an ONNX model as a typed graph whose nodes are
layers of the ``onnx`` op family (``onnx.Add``, ``onnx.Conv``, ...) or of mlaxgraph's
own layers where a pattern is recognised; ``to_onnx`` writes a graph as ONNX. The op
family needs only JAX; reading and writing files need the ``onnx`` package
(``pip install mlaxgraph[onnx]``)."""

from . import (  # noqa: F401  (they fill the op table)
    ops_bounded,
    ops_control,
    ops_math,
    ops_ml,
    ops_nn,
    ops_quant,
    ops_recurrent,
    ops_resize,
    ops_signal,
    ops_tensor,
    ops_training,
    ops_vision,
)
from .layer import TABLE, Constant, OnnxOp, op_class
from .reader import from_onnx

__all__ = ["from_onnx", "OnnxOp", "Constant", "TABLE", "op_class"]
