"""Data that ships with a package, for the examples, the demo and the notebooks (no
download)."""

from __future__ import annotations

__all__ = ["load_digits"]


def load_digits(seed: int = 0):
    """scikit-learn's digits as ``(x_train, y_train), (x_test, y_test)``: float32
    images ``(n, 8, 8, 1)`` scaled to [0, 1] and int32 labels, a stratified 80/20
    split (1437 train, 360 test)."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels)
    return (x_train, y_train), (x_test, y_test)
