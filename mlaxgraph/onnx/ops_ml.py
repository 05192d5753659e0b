"""The ``onnx`` family's operators of ONNX's classical machine-learning domain
(``ai.onnx.ml``) that compute on tensors: Binarizer, ArrayFeatureExtractor,
TreeEnsemble (which holds TreeEnsembleRegressor's and, with an ArgMax after it,
TreeEnsembleClassifier's trees). Those on strings (LabelEncoder's string keys) stay out, as strings do."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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




def _tensor(a, key, default=None):
    value = a.get(key)
    return default if value is None else np.asarray(value)


@define("TreeEnsemble", flops="input")
def _tree_ensemble(a, x):
    """Each row walks every tree from its root: at an interior node it compares its
    feature with the split (``nodes_modes``: <=, <, >=, >, ==, !=, or membership of
    the node's set in ``membership_values``; NaN goes where
    ``nodes_missing_value_tracks_true`` says) and goes to the true or the false
    child, a node or a leaf. The leaves' weights add up per target (``SUM``), or
    average, or take the least or the largest; then ``post_transform``."""
    modes = _tensor(a, "nodes_modes").astype(np.int64)
    n_nodes = modes.size
    feature = np.asarray(a["nodes_featureids"], np.int64)
    splits = _tensor(a, "nodes_splits", np.zeros(n_nodes))
    child = np.stack([np.asarray(a["nodes_falsenodeids"]), np.asarray(a["nodes_truenodeids"])])
    leafy = np.stack([np.asarray(a["nodes_falseleafs"]), np.asarray(a["nodes_trueleafs"])])
    missing = np.asarray(a.get("nodes_missing_value_tracks_true") or (0,) * n_nodes, bool)
    # each membership node's set, padded with NaN (which equals nothing)
    members = _tensor(a, "membership_values", np.zeros(0))
    sets = np.split(members, np.flatnonzero(np.isnan(members)) + 1) if members.size else []
    sets = [s[~np.isnan(s)] for s in sets]
    table = np.full((n_nodes, max([len(s) for s in sets] + [1])), np.nan)
    for node, values in zip(np.flatnonzero(modes == 6), sets):
        table[node, :len(values)] = values
    # the deepest path: the number of steps every row takes
    depth, frontier = 0, list(a["tree_roots"])
    while frontier:
        depth += 1
        frontier = [int(child[s, n]) for n in frontier for s in (0, 1) if not leafy[s, n]]
    wide = jnp.promote_types(x.dtype, jnp.float32)
    xs = x.astype(wide)
    rows = jnp.arange(x.shape[0])[:, None]
    at = jnp.broadcast_to(jnp.asarray(a["tree_roots"]), (x.shape[0], len(a["tree_roots"])))
    done = jnp.zeros(at.shape, bool)
    for _ in range(depth):
        value = xs[rows, jnp.asarray(feature)[at]]
        split = jnp.asarray(splits, wide)[at]
        tests = jnp.stack([value <= split, value < split, value >= split, value > split,
                           value == split, value != split,
                           (value[..., None] == jnp.asarray(table, wide)[at]).any(-1)])
        go = jnp.take_along_axis(tests, jnp.asarray(modes)[at][None], axis=0)[0]
        go = jnp.where(jnp.isnan(value), jnp.asarray(missing)[at], go).astype(jnp.int32)
        leaf_now = jnp.asarray(leafy)[go, at] > 0
        at = jnp.where(done, at, jnp.asarray(child)[go, at])
        done = done | leaf_now  # a row at a leaf stays there
    return _aggregate(a, at, wide).astype(x.dtype)


def _aggregate(a, leaves, wide):
    """``(rows, targets)`` from each tree's leaf ``(rows, trees)``."""
    weights = jnp.asarray(_tensor(a, "leaf_weights"), wide)[leaves]
    onehot = jnp.asarray(a["leaf_targetids"])[leaves][..., None] == jnp.arange(a.get("n_targets", 1))
    how = a.get("aggregate_function", 1)
    if how in (0, 1):
        out = jnp.where(onehot, weights[..., None], 0).sum(axis=1)
        out = out / leaves.shape[1] if how == 0 else out
    else:
        pick = jnp.min if how == 2 else jnp.max
        fill = jnp.inf if how == 2 else -jnp.inf
        out = pick(jnp.where(onehot, weights[..., None], fill), axis=1)
        out = jnp.where(onehot.any(axis=1), out, 0)
    post = a.get("post_transform", 0)
    if post == 1:
        out = jax.nn.softmax(out, axis=-1)
    elif post == 2:
        out = jax.nn.sigmoid(out)
    elif post == 3:  # a softmax over the non-zero scores, zeros staying zero
        exp = jnp.where(out != 0, jnp.exp(out - out.max(axis=-1, keepdims=True)), 0)
        out = exp / jnp.maximum(exp.sum(axis=-1, keepdims=True), jnp.finfo(wide).tiny)
    elif post == 4:
        out = jnp.sqrt(2.0) * jax.scipy.special.erfinv(2 * out - 1)
    return out


DOMAINS.update(dict.fromkeys(("Binarizer", "ArrayFeatureExtractor", "TreeEnsemble"), "ai.onnx.ml"))
