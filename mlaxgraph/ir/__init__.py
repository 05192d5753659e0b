"""The IR: Node, Value, Graph and the builder that makes them."""

from .node import Node, Value, SourceInfo
from .builder import SymbolicTensor
from .graph import Graph, Input, InputLayer, Block

__all__ = ["Node", "Value", "SourceInfo", "SymbolicTensor", "Graph", "Input", "InputLayer", "Block"]
