"""Lowering: Graph -> pure init/apply."""

from .interpreter import make_apply, make_init, random_layers

__all__ = ["make_apply", "make_init", "random_layers"]
