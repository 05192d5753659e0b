"""Example graphs used by the demo, the docs and the tests."""

from .models import mlp, residual_cnn

__all__ = ["mlp", "residual_cnn"]
