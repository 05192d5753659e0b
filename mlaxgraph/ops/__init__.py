"""The layer library. Each op is one registered class; stateless ones also have a
functional form (``ops.relu(x)``)."""

from ..core.registry import lookup, register, registered_ops
from .activation import (
    Gelu,
    LogSoftmax,
    Relu,
    Sigmoid,
    Silu,
    Softmax,
    Tanh,
    gelu,
    log_softmax,
    relu,
    sigmoid,
    silu,
    softmax,
    tanh,
)
from .attention import MultiHeadAttention
from .base import Layer, ParamSpec
from .cached_attention import CachedAttention
from .cast import Cast, cast
from .causal_mask import CausalMask, causal_mask
from .constraint import Constrain, constrain
from .conv import Conv
from .conv_transpose import ConvTranspose
from .creation import Arange, BroadcastTo, arange, broadcast_to
from .dequantize import Dequantize
from .dropout import Dropout
from .elementwise import (
    Add,
    Div,
    Equal,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
    Maximum,
    Minimum,
    Mul,
    NotEqual,
    Pow,
    Sub,
    add,
    mul,
    sub,
)
from .embedding import Embedding
from .function import F
from .indexing import GetItem
from .linear import Linear
from .matmul import MatMul, matmul
from .normalization import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from .param import Param
from .pooling import AvgPool, GlobalAvgPool, GlobalMaxPool, MaxPool
from .quantize import Quantize
from .quantized import QuantizedConv, QuantizedLinear
from .quantized_attention import QuantizedMultiHeadAttention
from .quantized_cached_attention import QuantizedCachedAttention
from .quantized_embedding import QuantizedEmbedding
from .recurrent import GRU, LSTM
from .reduce import Max, Mean, Sum, max, mean, sum
from .resize import Resize, Upsample, resize
from .rotary import RotaryEmbedding, rotary_embedding
from .shape import Concat, Flatten, Reshape, Split, Transpose, concat, flatten, reshape, split, transpose
from .tensor import (
    ExpandDims,
    Identity,
    Neg,
    Pad,
    Squeeze,
    Where,
    expand_dims,
    identity,
    pad,
    squeeze,
    where,
)


def equal(a, b):
    """``a == b`` elementwise, as a node (``==`` on symbolic tensors is identity)."""
    return Equal()(a, b) if not isinstance(b, (bool, int, float)) else Equal(constant=b)(a)


def not_equal(a, b):
    """``a != b`` elementwise, as a node."""
    return NotEqual()(a, b) if not isinstance(b, (bool, int, float)) else NotEqual(constant=b)(a)

__all__ = [
    "Layer", "ParamSpec", "register", "lookup", "registered_ops",
    "Linear", "Conv", "BatchNorm", "LayerNorm", "RMSNorm", "GroupNorm", "Dropout",
    "MaxPool", "AvgPool", "GlobalMaxPool", "GlobalAvgPool",
    "Flatten", "Reshape", "Concat", "Transpose", "Split",
    "flatten", "reshape", "concat", "transpose", "split",
    "Embedding", "MultiHeadAttention", "CachedAttention", "CausalMask", "causal_mask", "LSTM", "GRU",
    "Relu", "Gelu", "Silu", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
    "relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax",
    "Add", "Sub", "Mul", "add", "sub", "mul", "Cast", "cast", "F", "Constrain", "constrain",
    "Div", "Pow", "Maximum", "Minimum", "Equal", "NotEqual", "Less", "LessEqual", "Greater",
    "GreaterEqual", "equal", "not_equal", "MatMul", "matmul", "GetItem", "Neg",
    "ConvTranspose", "Upsample", "Resize", "resize", "Arange", "arange", "BroadcastTo",
    "broadcast_to", "Param", "RotaryEmbedding", "rotary_embedding",
    "Identity", "identity", "Pad", "pad", "Where", "where", "Squeeze", "squeeze",
    "ExpandDims", "expand_dims", "Sum", "Mean", "Max", "sum", "mean", "max",
    "Quantize", "QuantizedLinear", "QuantizedConv", "QuantizedEmbedding",
    "QuantizedMultiHeadAttention", "QuantizedCachedAttention", "Dequantize",
]
