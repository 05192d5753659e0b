"""The IR: Node, Value, Graph and the builder that makes them."""

from .block import Block
from .builder import SymbolicTensor
from .graph import Graph, Input, InputLayer
from .node import Node, SourceInfo, Value
from .op import Layer
from .scan import Scan
from .sequential import Sequential

__all__ = ["Layer", "Node", "Value", "SourceInfo", "SymbolicTensor", "Graph", "Input", "InputLayer", "Block",
           "Scan", "Sequential"]
