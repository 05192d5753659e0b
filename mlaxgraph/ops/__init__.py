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
from .attention import CausalMask, MultiHeadAttention, causal_mask
from .base import Layer, ParamSpec
from .cast import Cast, cast
from .constraint import Constrain, constrain
from .conv import Conv
from .dropout import Dropout
from .elementwise import Add, Mul, Sub, add, mul, sub
from .embedding import Embedding
from .function import F
from .linear import Linear
from .normalization import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from .pooling import AvgPool, GlobalAvgPool, GlobalMaxPool, MaxPool
from .recurrent import GRU, LSTM
from .shape import Concat, Flatten, Reshape, Split, Transpose, concat, flatten, reshape, split, transpose

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
