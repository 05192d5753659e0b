"""Example graphs used by the demo, the docs and the tests, and the bundled data."""

from .data import load_digits
from .models import lstm_classifier, mlp, residual_block, residual_cnn, transformer_block, transformer_lm

__all__ = ["mlp", "residual_block", "residual_cnn", "transformer_block", "transformer_lm", "lstm_classifier",
           "load_digits"]
