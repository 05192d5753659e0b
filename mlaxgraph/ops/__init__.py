"""The layer library. Each op is one registered class; stateless ones also have a
functional form (``ops.relu(x)``)."""

from .base import Layer, ParamSpec
from .registry import register, lookup, registered_ops
from .linear import Linear
from .conv import Conv
from .normalization import BatchNorm, LayerNorm, RMSNorm, GroupNorm
from .dropout import Dropout
from .pooling import MaxPool, AvgPool, GlobalMaxPool, GlobalAvgPool
from .shape import (Flatten, Reshape, Concat, Transpose, Split, flatten, reshape, concat,
                    transpose, split)
from .embedding import Embedding
from .attention import MultiHeadAttention, CausalMask, causal_mask
from .recurrent import LSTM, GRU
from .activation import (Relu, Gelu, Silu, Tanh, Sigmoid, Softmax, LogSoftmax, relu, gelu,
                         silu, tanh, sigmoid, softmax, log_softmax)
from .elementwise import Add, Sub, Mul, add, sub, mul
from .cast import Cast, cast
from .constraint import Constrain, constrain
from .function import F

__all__ = [
    "Layer", "ParamSpec", "register", "lookup", "registered_ops",
    "Linear", "Conv", "BatchNorm", "LayerNorm", "RMSNorm", "GroupNorm", "Dropout",
    "MaxPool", "AvgPool", "GlobalMaxPool", "GlobalAvgPool",
    "Flatten", "Reshape", "Concat", "Transpose", "Split",
    "flatten", "reshape", "concat", "transpose", "split",
    "Embedding", "MultiHeadAttention", "CausalMask", "causal_mask", "LSTM", "GRU",
    "Relu", "Gelu", "Silu", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
    "relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax",
    "Add", "Sub", "Mul", "add", "sub", "mul", "Cast", "cast", "F", "Constrain", "constrain",
]
