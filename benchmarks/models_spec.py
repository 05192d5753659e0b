"""The benchmark models, described once: shapes, sizes, batch, data and optimizer.

Every system (mlaxgraph, hand-written JAX, Flax linen, Flax NNX, Haiku, Equinox) builds
these same architectures from these numbers, trains them with the same optax optimizer
and the same loss (mean softmax cross-entropy over integer labels), and gets the same
batch. The benchmark checks at run time that every system's trainable parameter count
equals the hand-written one.

Nothing here imports a neural-network library: ``tests/test_hlo_parity.py`` and the
hand-written models use it too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model: its input per example, classes, batch and a one-line description."""

    name: str
    title: str
    x_shape: tuple[int, ...]          # one example, channel-last for images
    x_dtype: str
    classes: int
    batch: int
    vocab: int = 0                    # token models: ids in [0, vocab)


# The architectures (each system's module builds them from these constants):
MLP_HIDDEN = (256, 256)               # 784 -> 256 -> 256 -> 10, relu
CNN_CHANNELS = 32                     # 8x8x1: conv 3x3 SAME (32) - relu - maxpool 2x2 - flatten - linear 10
RESNET_STEM = 16                      # 16x16x3: conv 3x3 (16, no bias) - BN - relu,
RESNET_STAGES = ((16, 1), (32, 2))    # basic blocks (channels, stride); a 1x1 conv + BN shortcut when
                                      # the shape changes; then global average pool - linear 10
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5
TRANSFORMER = dict(length=32, width=64, heads=4, mlp=128)  # pre-norm block, exact GELU,
                                      # then mean over the sequence - linear 10
LN_EPSILON = 1e-5
LSTM = dict(length=32, width=32, hidden=64)  # embedding (vocab 100, 32) - LSTM 64 - final h - linear 5
TINY_MLP = (16, 32, 32, 4)            # the per-call overhead model, batch 8

SPECS: dict[str, Spec] = {
    "mlp": Spec("mlp", "MLP 784-256-256-10", (784,), "float32", 10, 128),
    "cnn": Spec("cnn", "digits CNN 8x8x1, conv32-relu-pool-linear", (8, 8, 1), "float32", 10, 128),
    "resnet": Spec("resnet", "ResNet-style CNN 16x16x3, 2 basic blocks + BN", (16, 16, 3), "float32",
                   10, 32),
    "transformer": Spec("transformer", "Transformer encoder block, 32x64, 4 heads", (32, 64),
                        "float32", 10, 32),
    "lstm": Spec("lstm", "LSTM classifier, 32 tokens, hidden 64", (32,), "int32", 5, 64, vocab=100),
    "tiny_mlp": Spec("tiny_mlp", "tiny MLP 16-32-32-4, batch 8", (16,), "float32", 4, 8),
}

MODELS = ("mlp", "cnn", "resnet", "transformer", "lstm")


def batch(spec: Spec, seed: int = 0, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic batch ``(x, y)`` (NumPy), or ``k`` stacked batches."""
    gen = np.random.default_rng(seed)
    lead = (spec.batch,) if k is None else (k, spec.batch)
    if spec.vocab:
        x = gen.integers(0, spec.vocab, size=lead + spec.x_shape).astype(spec.x_dtype)
    else:
        x = gen.standard_normal(size=lead + spec.x_shape).astype(spec.x_dtype)
    y = gen.integers(0, spec.classes, size=lead).astype(np.int32)
    return x, y


def optimizer():
    """The one optimizer every system uses."""
    import optax

    return optax.adam(LEARNING_RATE)
