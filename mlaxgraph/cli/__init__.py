"""The command line: ``mlaxgraph`` and ``python -m mlaxgraph``."""

from .main import main

__all__ = ["main"]
