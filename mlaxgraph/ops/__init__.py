"""The layer library. Each op is one registered class; stateless ones also have a
functional form (``ops.relu(x)``)."""

from .base import Layer, ParamSpec
from .registry import register, lookup, registered_ops
from .linear import Linear
from .conv import Conv
from .normalization import BatchNorm
from .dropout import Dropout
from .pooling import MaxPool
from .shape import Flatten, Reshape, Concat, flatten, reshape, concat
from .activation import (Relu, Gelu, Silu, Tanh, Sigmoid, Softmax, LogSoftmax, relu, gelu,
                         silu, tanh, sigmoid, softmax, log_softmax)
from .elementwise import Add, Sub, Mul, add, sub, mul
from .cast import Cast, cast
from .function import F

__all__ = [
    "Layer", "ParamSpec", "register", "lookup", "registered_ops",
    "Linear", "Conv", "BatchNorm", "Dropout", "MaxPool",
    "Flatten", "Reshape", "Concat", "flatten", "reshape", "concat",
    "Relu", "Gelu", "Silu", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
    "relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax",
    "Add", "Sub", "Mul", "add", "sub", "mul", "Cast", "cast", "F",
]
