"""The ``onnx`` family's operators of ONNX's classical machine-learning domain
(``ai.onnx.ml``) that compute on tensors: Binarizer, ArrayFeatureExtractor. Those
on strings (LabelEncoder's string keys) stay out, as strings do."""

from __future__ import annotations

import jax.numpy as jnp

from .layer import DOMAINS, define


@define("Binarizer")
def _binarizer(a, x):
    """1 where the input is above ``threshold`` (default 0), else 0, in its type."""
    return (x > a.get("threshold", 0.0)).astype(x.dtype)


@define("ArrayFeatureExtractor", flops="none")
def _array_feature_extractor(a, x, indices):
    """The elements of the last axis at ``indices`` (all of them, flattened): a vector
    gives a row ``(1, n)``, as onnxruntime does."""
    picked = jnp.take(x, indices.reshape(-1), axis=-1)
    return picked.reshape(1, -1) if x.ndim == 1 else picked


DOMAINS.update(dict.fromkeys(("Binarizer", "ArrayFeatureExtractor"), "ai.onnx.ml"))
