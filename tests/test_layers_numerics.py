"""Forward numerics, parameter layouts (api.md section 5), gradients, the bfloat16 dtype
guarantee and build-time errors of the second layer set: LayerNorm, RMSNorm, GroupNorm,
AvgPool, GlobalAvgPool/GlobalMaxPool, transpose, split, Embedding, MultiHeadAttention
(and causal_mask), LSTM, GRU, and the precision options of Linear and Conv.

Everything goes through the public path ``mg.Input`` -> ``mg.compile`` -> ``model.init``
(or ``jax.eval_shape(model.init)`` plus random values) -> ``model.apply``. To keep XLA
compilations few, the forward cases are one-layer subgraphs side by side in one graph
(``family``), each with its own inputs and outputs. References are independent NumPy
code (float64) in ``_reference_layers.py`` and ``_reference.py``."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

import mlaxgraph as mg
from mlaxgraph import ops

import _helpers
import _reference as ref
import _reference_layers as lref
from _helpers import f64, next_line, one_layer, shapes

RTOL = 1e-5
ATOL = 1e-5
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


# --- helpers ------------------------------------------------------------------------


close = functools.partial(_helpers.close, rtol=RTOL, atol=ATOL)
# This file's random weights: normals times 0.5 (variances uniform in [0.5, 1.5)).
random_init = functools.partial(_helpers.random_init, scale=0.5)
family = functools.partial(_helpers.family, scale=0.5)


def random_mask(shape, seed):
    """A random boolean mask with at least one True in every row (last axis)."""
    gen = np.random.default_rng(seed)
    mask = gen.uniform(size=shape) < 0.6
    rows = mask.reshape(-1, shape[-1])
    rows[np.arange(rows.shape[0]), gen.integers(0, shape[-1], rows.shape[0])] = True
    return rows.reshape(shape)


def norm_input(shape, seed):
    """Inputs with a non-zero mean and a spread away from 1 (what a norm removes)."""
    return ref.rand(shape, seed) * np.float32(3.0) + np.float32(1.5)


# --- the forward cases ---------------------------------------------------------------
#
# name -> (call, [(graph shape, dtype, concrete shape or array maker)], reference)
# ``reference(params, xs)`` gets the float32 params of the whole family and the inputs,
# and returns the list of expected outputs.

CASES = {}


def case(name, call, inputs, reference):
    CASES[name] = (call, inputs, reference)


def _p(params, name):
    return f64(params[name])


# LayerNorm
case("ln_last", lambda x: ops.LayerNorm(name="ln_last")(x),
     [(("b0", 3, 6), "float32", (2, 3, 6))],
     lambda P, xs: [lref.layer_norm(xs[0], **_p(P, "ln_last"))])
case("ln_axis1_eps", lambda x: ops.LayerNorm(epsilon=1e-2, axis=1, name="ln_axis1_eps")(x),
     [(("b1", 4, 3), "float32", (3, 4, 3))],
     lambda P, xs: [lref.layer_norm(xs[0], **_p(P, "ln_axis1_eps"), epsilon=1e-2, axis=1)])
case("ln_axis_neg2", lambda x: ops.LayerNorm(axis=-2, name="ln_axis_neg2")(x),
     [(("b2", 2, 5, 3), "float32", (2, 2, 5, 3))],
     lambda P, xs: [lref.layer_norm(xs[0], **_p(P, "ln_axis_neg2"), axis=-2)])
case("ln_plain", lambda x: ops.LayerNorm(use_scale=False, use_bias=False, name="ln_plain")(x),
     [(("b3", 7), "float32", (4, 7))],
     lambda P, xs: [lref.layer_norm(xs[0])])

# RMSNorm
case("rms", lambda x: ops.RMSNorm(name="rms")(x),
     [(("b4", 3, 8), "float32", (2, 3, 8))],
     lambda P, xs: [lref.rms_norm(xs[0], P["rms"]["scale"])])
case("rms_eps", lambda x: ops.RMSNorm(epsilon=0.5, name="rms_eps")(x),
     [(("b5", 5), "float32", (3, 5))],
     lambda P, xs: [lref.rms_norm(xs[0], P["rms_eps"]["scale"], epsilon=0.5)])

# GroupNorm (channel-last)
for _name, _groups, _graph, _shape, _kw in [
    ("gn_2d", 3, ("b6", 4, 5, 6), (2, 4, 5, 6), {}),
    ("gn_1d_eps", 2, ("b7", 7, 4), (3, 7, 4), {"epsilon": 1e-2}),
    ("gn_rank2", 2, ("b8", 6), (4, 6), {}),
    ("gn_one_group", 1, ("b9", 3, 3, 4), (2, 3, 3, 4), {}),
    ("gn_instance", 4, ("b10", 5, 4), (2, 5, 4), {}),
]:
    case(_name, lambda x, n=_name, g=_groups, kw=_kw: ops.GroupNorm(num_groups=g, name=n, **kw)(x),
         [(_graph, "float32", _shape)],
         lambda P, xs, n=_name, g=_groups, kw=_kw: [
             lref.group_norm(xs[0], g, P[n]["scale"], P[n]["bias"], **kw)])

# AvgPool
for _name, _kw, _shape in [
    ("avg_2d_valid", dict(window=(2, 2)), (2, 6, 7, 3)),
    ("avg_2d_valid_strided", dict(window=(3, 2), strides=(1, 2)), (2, 5, 6, 2)),
    ("avg_2d_same_incl", dict(window=(3, 3), strides=(2, 2), padding="SAME"), (2, 7, 8, 2)),
    ("avg_2d_same_excl", dict(window=(3, 3), strides=(2, 2), padding="SAME",
                              count_include_pad=False), (2, 7, 8, 2)),
    ("avg_2d_same_stride1_excl", dict(window=(2, 3), strides=1, padding="SAME",
                                      count_include_pad=False), (1, 4, 5, 2)),
    ("avg_2d_explicit_incl", dict(window=(2, 3), strides=(1, 2), padding=((1, 1), (0, 1))), (1, 5, 6, 2)),
    ("avg_2d_explicit_excl", dict(window=(2, 3), strides=(1, 2), padding=((1, 1), (0, 1)),
                                  count_include_pad=False), (1, 5, 6, 2)),
    ("avg_1d_valid", dict(window=(4,)), (2, 9, 3)),
    ("avg_1d_same_incl", dict(window=(3,), strides=(2,), padding="SAME"), (2, 9, 3)),
    ("avg_1d_same_excl", dict(window=(3,), strides=(2,), padding="SAME", count_include_pad=False), (2, 9, 3)),
]:
    case(_name, lambda x, n=_name, kw=_kw: ops.AvgPool(**kw, name=n)(x),
         [((f"b_{_name}",) + _shape[1:], "float32", _shape)],
         lambda P, xs, kw=_kw: [lref.avg_pool(
             xs[0], kw["window"],
             (kw["strides"],) * len(kw["window"]) if isinstance(kw.get("strides"), int) else kw.get("strides"),
             kw.get("padding", "VALID"), kw.get("count_include_pad", True))])

# Global pooling
for _name, _cls, _fn, _keep, _shape in [
    ("gap", ops.GlobalAvgPool, lref.global_avg_pool, False, (2, 4, 5, 3)),
    ("gap_keep", ops.GlobalAvgPool, lref.global_avg_pool, True, (2, 4, 5, 3)),
    ("gap_1d_keep", ops.GlobalAvgPool, lref.global_avg_pool, True, (3, 7, 2)),
    ("gmp", ops.GlobalMaxPool, lref.global_max_pool, False, (2, 4, 5, 3)),
    ("gmp_keep", ops.GlobalMaxPool, lref.global_max_pool, True, (2, 4, 5, 3)),
    ("gmp_3d", ops.GlobalMaxPool, lref.global_max_pool, False, (2, 3, 2, 4, 3)),
]:
    case(_name, lambda x, n=_name, c=_cls, k=_keep: c(keepdims=k, name=n)(x),
         [((f"b_{_name}",) + _shape[1:], "float32", _shape)],
         lambda P, xs, f=_fn, k=_keep: [f(xs[0], keepdims=k)])

# transpose and split
case("transpose_fn", lambda x: ops.transpose(x, (0, 2, 1)),
     [(("bt0", 3, 4), "float32", (2, 3, 4))],
     lambda P, xs: [np.transpose(xs[0], (0, 2, 1))])
case("transpose_moves_batch", lambda x: ops.Transpose((2, 0, 3, 1), name="transpose_moves_batch")(x),
     [(("bt1", 3, 4, 5), "float32", (2, 3, 4, 5))],
     lambda P, xs: [np.transpose(xs[0], (2, 0, 3, 1))])
case("split_int", lambda x: list(ops.split(x, 3)),
     [(("bs0", 4, 6), "float32", (2, 4, 6))],
     lambda P, xs: [xs[0][..., 0:2], xs[0][..., 2:4], xs[0][..., 4:6]])
case("split_int_axis1", lambda x: list(ops.Split(2, axis=1, name="split_int_axis1")(x)),
     [(("bs1", 4, 6), "float32", (2, 4, 6))],
     lambda P, xs: [xs[0][:, 0:2], xs[0][:, 2:4]])
case("split_indices", lambda x: list(ops.split(x, (1, 4))),
     [(("bs2", 3, 6), "float32", (2, 3, 6))],
     lambda P, xs: [xs[0][..., :1], xs[0][..., 1:4], xs[0][..., 4:]])
case("split_indices_four", lambda x: list(ops.Split([1, 3, 5], axis=-2, name="split_indices_four")(x)),
     [(("bs3", 6, 2), "float32", (3, 6, 2))],
     lambda P, xs: [xs[0][:, :1], xs[0][:, 1:3], xs[0][:, 3:5], xs[0][:, 5:]])

# Embedding: ids with out-of-range entries (-1, -7, 7 and 100 for a table of 7 rows).
_IDS = {
    "emb_2d": np.array([[0, 3, 6, 2], [7, -1, 5, 100], [1, 1, -7, 4]], np.int32),
    "emb_rank1": np.array([5, 0, 6, 6, 2], np.int32),
    "emb_3d": np.array([[[1, 2, 3], [4, 5, 6]], [[0, 0, -2], [9, 3, 1]]], np.int32),
    "emb_uint8": np.array([[0, 6, 200], [3, 7, 1]], np.uint8),
}
for _name, _graph, _dtype in [("emb_2d", ("be0", 4), "int32"), ("emb_rank1", (5,), "int32"),
                              ("emb_3d", ("be2", 2, 3), "int32"), ("emb_uint8", ("be3", 3), "uint8")]:
    case(_name, lambda ids, n=_name: ops.Embedding(7, 5, name=n)(ids),
         [(_graph, _dtype, lambda _seed, n=_name: _IDS[n])],
         lambda P, xs, n=_name: [lref.embedding(xs[0], P[n]["embedding"])])

# MultiHeadAttention


def _mha_case(name, layer_kwargs, q_shape, kv_shape=None, mask_shape=None, causal=False):
    specs = [(("bm_" + name,) + q_shape[1:], "float32", q_shape)]
    if kv_shape is not None:
        specs.append((("bm_" + name,) + kv_shape[1:], "float32", kv_shape))
    if mask_shape is not None:
        graph_mask = tuple("bm_" + name if (i == 0 and len(mask_shape) >= 3 and d != 1) else d
                           for i, d in enumerate(mask_shape))
        specs.append((graph_mask, "bool", lambda seed, s=mask_shape: random_mask(s, seed)))

    def call(*xs):
        layer = ops.MultiHeadAttention(**layer_kwargs, name=name)
        q = xs[0]
        kv = xs[1] if kv_shape is not None else None
        if causal:
            mask = ops.causal_mask(q)
            return [layer(q, kv, mask=mask), mask]
        if mask_shape is not None:
            return layer(q, kv, mask=xs[-1])
        return layer(q) if kv is None else layer(q, kv)

    def reference(P, xs):
        q = xs[0]
        kv = xs[1] if kv_shape is not None else q
        if causal:
            mask = lref.causal(q.shape[1])
            return [lref.multi_head_attention(q, kv, P[name], mask), mask]
        mask = xs[-1] if mask_shape is not None else None
        return [lref.multi_head_attention(q, kv, P[name], mask)]

    case(name, call, specs, reference)


_mha_case("mha_self", dict(num_heads=2), (2, 5, 8))
# head_dim 4 with d = 6 and 3 heads: the 1/sqrt(head_dim) scale differs from 1/sqrt(d // heads).
_mha_case("mha_cross", dict(num_heads=3, head_dim=4, out_features=5), (2, 4, 6), (2, 7, 10))
_mha_case("mha_mask_rank2", dict(num_heads=2, head_dim=3), (2, 4, 6), (2, 5, 6), mask_shape=(4, 5))
_mha_case("mha_mask_rank3", dict(num_heads=2), (3, 5, 8), mask_shape=(3, 5, 5))
_mha_case("mha_mask_rank4", dict(num_heads=2, head_dim=3), (2, 4, 6), (2, 5, 4), mask_shape=(2, 2, 4, 5))
_mha_case("mha_mask_rank4_bcast", dict(num_heads=2), (2, 5, 8), mask_shape=(2, 1, 5, 5))
_mha_case("mha_causal", dict(num_heads=2), (2, 6, 8), causal=True)

# LSTM and GRU


def _lstm_reference(name, return_state):
    def reference(P, xs):
        seq, h, c = lref.lstm(xs[0], **_p(P, name))
        return [seq, h, c] if return_state else [seq]
    return reference


def _gru_reference(name, return_state):
    def reference(P, xs):
        seq, h = lref.gru(xs[0], **_p(P, name))
        return [seq, h] if return_state else [seq]
    return reference


case("lstm_seq", lambda x: ops.LSTM(4, name="lstm_seq")(x),
     [(("bl0", 5, 3), "float32", (2, 5, 3))], _lstm_reference("lstm_seq", False))
case("lstm_state", lambda x: list(ops.LSTM(3, return_state=True, name="lstm_state")(x)),
     [(("bl1", "tl1", 2), "float32", (3, 6, 2))], _lstm_reference("lstm_state", True))
case("gru_seq", lambda x: ops.GRU(4, name="gru_seq")(x),
     [(("bg0", 5, 3), "float32", (2, 5, 3))], _gru_reference("gru_seq", False))
case("gru_state", lambda x: list(ops.GRU(3, return_state=True, name="gru_state")(x)),
     [(("bg1", "tg1", 2), "float32", (3, 6, 2))], _gru_reference("gru_state", True))


def _concrete(name, spec, seed):
    _, dtype, maker = spec
    if callable(maker):
        return maker(seed)
    assert dtype == "float32", spec
    if name.startswith(("ln_", "rms", "gn_")):
        return norm_input(maker, seed)
    return ref.rand(maker, seed)


@functools.lru_cache(maxsize=None)
def forward_family():
    cases = {name: (call, [(g, d) for g, d, _ in specs]) for name, (call, specs, _) in CASES.items()}
    model, params, state, index = family(cases, seed=1)
    xs = []
    for k, (name, (_, specs, _)) in enumerate(CASES.items()):
        xs += [_concrete(name, spec, seed=10 * k + j) for j, spec in enumerate(specs)]
    outs, new_state = model.apply(params, state, *xs)
    return model, params, state, xs, outs, new_state, index


@pytest.mark.parametrize("name", list(CASES))
def test_forward(name):
    model, params, state, xs, outs, new_state, index = forward_family()
    ins, outs_at = index[name]
    mine = [xs[i] for i in ins]
    got = [outs[o] for o in outs_at]
    want = CASES[name][2](params, mine)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype == bool:
            assert g.dtype == bool
            np.testing.assert_array_equal(g, w)
        else:
            assert g.dtype == F32
            close(g, w)
    assert new_state == {} and state == {}


def test_embedding_out_of_range_ids_give_nan_rows():
    # Stated separately from the reference: every out-of-range id (negative ones too)
    # is a whole NaN row, and every in-range id is its table row exactly.
    model, params, state, xs, outs, new_state, index = forward_family()
    for name, ids in _IDS.items():
        _, (o,) = index[name]
        out = np.asarray(outs[o])
        table = np.asarray(params[name]["embedding"])
        bad = (ids.astype(np.int64) < 0) | (ids.astype(np.int64) >= 7)
        assert np.all(np.isnan(out[bad])), (name, ids[bad], out[bad])
        np.testing.assert_array_equal(out[~bad], table[ids[~bad].astype(np.int64)])


def test_mha_mask_is_respected():
    # A masked-out key/value position cannot change the output: changing the values at
    # masked kv positions leaves every query's output as it was.
    mha = ops.MultiHeadAttention(2, head_dim=3, name="mha")
    model = one_layer(lambda q, kv, m: mha(q, kv, mask=m),
                      (("batch", 3, 4), "float32"), (("batch", 5, 4), "float32"), ((3, 5), "bool"))
    params, state = random_init(model, seed=4)
    q, kv = ref.rand((2, 3, 4), 1), ref.rand((2, 5, 4), 2)
    mask = np.array([[1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 1, 0, 1]], bool)
    out, _ = model.apply(params, state, q, kv, mask)
    kv2 = kv.copy()
    kv2[:, 3] += np.float32(10.0)                     # position 3: masked for every query
    out2, _ = model.apply(params, state, q, kv2, mask)
    np.testing.assert_allclose(out2, out, rtol=1e-6, atol=1e-6)
    kv2[:, 4] += np.float32(10.0)                     # position 4: seen by query 2 only
    out3, _ = model.apply(params, state, q, kv2, mask)
    np.testing.assert_allclose(out3[:, :2], out[:, :2], rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(out3[:, 2]) - np.asarray(out[:, 2])).max() > 1e-3


def test_mha_in_float64_keeps_float64_precision():
    """The float32 softmax protects half-precision inputs (api.md: "softmax in
    float32"); it must not make a float64 attention lose precision. A float64 graph
    (no policy: every layer computes in its input's dtype) against the float64
    reference, to float64 accuracy."""
    with jax.enable_x64(True):
        model = one_layer(lambda q: ops.MultiHeadAttention(2, name="mha")(q), (("batch", 5, 8), "float64"))
        params, state = random_init(model, seed=5)
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        x = np.asarray(ref.rand((2, 5, 8), seed=6), np.float64)
        out, _ = model.apply(params, state, x)
        assert out.dtype == np.float64
        close(out, lref.multi_head_attention(x, x, f64(params)["mha"]), rtol=1e-10, atol=1e-10)


# --- parameter layouts and initial values (api.md section 5) -------------------------


def layout_model():
    ids = mg.Input(("batch", 4), "int32", name="ids")
    q = mg.Input(("batch", 5, 6), name="q")
    kv = mg.Input(("batch", 9, 7), name="kv")
    seq = mg.Input(("batch", "time", 3), name="seq")
    x = mg.Input(("batch", 4, 6), name="x")
    outs = [ops.Embedding(11, 6, name="emb")(ids),
            ops.MultiHeadAttention(3, head_dim=4, out_features=5, name="mha")(q, kv),
            ops.MultiHeadAttention(2, name="mha_default")(q),
            ops.LSTM(5, name="lstm")(seq),
            ops.GRU(4, name="gru")(seq),
            ops.LayerNorm(name="ln")(x),
            ops.LayerNorm(axis=1, name="ln_axis1")(x),
            ops.RMSNorm(name="rms")(x),
            ops.GroupNorm(num_groups=2, name="gn")(x)]
    return mg.compile(mg.Graph([ids, q, kv, seq, x], outs, name="layouts"))


def test_param_names_and_shapes_match_api_table():
    # What init makes (traced by jax.eval_shape: names, shapes and dtypes, no compile).
    params, state = jax.eval_shape(layout_model().init, jax.random.key(0))
    assert state == {}
    assert shapes(params) == {
        "emb": {"embedding": (11, 6)},                                   # (num_embeddings, features)
        "mha": {"query": {"kernel": (6, 3, 4), "bias": (3, 4)},          # (d, heads, head_dim)
                "key": {"kernel": (7, 3, 4), "bias": (3, 4)},            # d_kv
                "value": {"kernel": (7, 3, 4), "bias": (3, 4)},
                "out": {"kernel": (3, 4, 5), "bias": (5,)}},             # (heads, head_dim, out)
        "mha_default": {"query": {"kernel": (6, 2, 3), "bias": (2, 3)},  # head_dim = d // heads
                        "key": {"kernel": (6, 2, 3), "bias": (2, 3)},
                        "value": {"kernel": (6, 2, 3), "bias": (2, 3)},
                        "out": {"kernel": (2, 3, 6), "bias": (6,)}},     # out_features = d
        "lstm": {"input_kernel": (3, 20), "recurrent_kernel": (5, 20), "bias": (20,)},
        "gru": {"input_kernel": (3, 12), "recurrent_kernel": (4, 12), "bias": (12,),
                "recurrent_bias": (12,)},
        "ln": {"scale": (6,), "bias": (6,)},
        "ln_axis1": {"scale": (4,), "bias": (4,)},
        "rms": {"scale": (6,)},
        "gn": {"scale": (6,), "bias": (6,)},
    }
    assert all(a.dtype == F32 for a in jax.tree.leaves(params))


def test_initial_values():
    # model.init compiled for the layers whose initial values the API pins or documents
    # (an "rbg" key: XLA on CPU compiles it faster than threefry; init takes any key).
    seq = mg.Input(("batch", "time", 3), name="seq")
    x = mg.Input(("batch", 4, 6), name="x")
    outs = [ops.LSTM(5, name="lstm")(seq), ops.LayerNorm(name="ln")(x), ops.RMSNorm(name="rms")(x),
            ops.GroupNorm(num_groups=2, name="gn")(x)]
    params, state = mg.compile(mg.Graph([seq, x], outs)).init(jax.random.key(0, impl="rbg"))
    assert state == {}
    ones, zeros = np.ones, np.zeros
    np.testing.assert_array_equal(params["ln"]["scale"], ones(6))
    np.testing.assert_array_equal(params["ln"]["bias"], zeros(6))
    np.testing.assert_array_equal(params["rms"]["scale"], ones(6))
    np.testing.assert_array_equal(params["gn"]["scale"], ones(6))
    np.testing.assert_array_equal(params["gn"]["bias"], zeros(6))
    # LSTM: zeros, but the forget gate's quarter (gate order i, f, g, o) is ones.
    np.testing.assert_array_equal(params["lstm"]["bias"], np.r_[zeros(5), ones(5), zeros(10)])
    # The recurrent kernel (h, 4h) is orthogonal (orthonormal rows); the input kernel random.
    u = np.asarray(params["lstm"]["recurrent_kernel"], np.float64)
    close(u @ u.T, np.eye(5), atol=1e-5)
    w = np.asarray(params["lstm"]["input_kernel"])
    assert np.unique(w).size == w.size


# --- gradients (finite differences through model.apply, float64) ---------------------


def grad_check(call, inputs, float64_layers=(), seed=2):
    """``check_grads`` (order 1, reverse mode) through ``model.apply`` of a one-layer
    graph, with respect to its params and its float inputs. In float64: the graph is
    built on float64 inputs and compiled with a float64 policy, its precision-sensitive
    layers overridden to float64 (the policy would run them in float32).
    ``inputs``: [(graph_shape, concrete_shape)]."""
    with jax.enable_x64(True):
        policy = mg.Policy(param_dtype="float64", compute_dtype="float64",
                           overrides={name: "float64" for name in float64_layers})
        model = one_layer(call, *[(g, "float64") for g, _ in inputs], policy=policy)
        params, state = random_init(model, seed=seed)
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        xs = [jnp.asarray(norm_input(s, seed=2 + i), jnp.float64) for i, (_, s) in enumerate(inputs)]
        flat, unravel = ravel_pytree((params, xs))      # one array: fewer eager ops

        @jax.jit
        def f(flat):
            p, xs = unravel(flat)
            out, _ = model.apply(p, state, *xs)
            for o in jax.tree.leaves(out):
                assert o.dtype == jnp.float64
            return out

        check_grads(f, (flat,), order=1, modes=["rev"], eps=1e-6)


# Layers of one kind share one graph (so one set of compilations): check_grads then
# checks the VJP of all their outputs together, w.r.t. all their params and inputs.


def test_grad_layer_norm_and_group_norm():
    grad_check(lambda x: [ops.LayerNorm(axis=1, name="ln")(x), ops.GroupNorm(num_groups=2, name="gn")(x)],
               [(("batch", 3, 4), (2, 3, 4))], float64_layers=("ln", "gn"))


def test_grad_multi_head_attention():
    def call(q, kv):
        mask = ops.causal_mask(q)
        return ops.MultiHeadAttention(2, head_dim=3, name="mha")(q, kv, mask=mask)

    grad_check(call, [(("batch", 4, 5), (2, 4, 5)), (("batch", 4, 3), (2, 4, 3))],
               float64_layers=("mha",))


def test_grad_lstm_and_gru():
    grad_check(lambda x: [*ops.LSTM(3, return_state=True, name="lstm")(x),
                          *ops.GRU(3, return_state=True, name="gru")(x)],
               [(("batch", 4, 2), (2, 4, 2))])


# --- the bfloat16 dtype guarantee ----------------------------------------------------


def _scoped_eqns(jaxpr, scope=None):
    """(layer scope, eqn) for every equation of a jaxpr and of its sub-jaxprs (scan
    bodies, pjit, custom_jvp...). The scope is the first part of the name stack: every
    layer's computation runs under ``jax.named_scope(node_name)``; the equations of a
    sub-jaxpr belong to the scope of the equation that holds it."""
    for eqn in jaxpr.eqns:
        own = str(eqn.source_info.name_stack).split("/")[0]
        where = scope if scope is not None else own
        yield where, eqn
        for param in eqn.params.values():
            for inner in (param if isinstance(param, (tuple, list)) else (param,)):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _scoped_eqns(inner, where)


def _out_dtypes(eqn):
    return {np.dtype(v.aval.dtype) for v in eqn.outvars if hasattr(v.aval, "dtype")}


# name -> (call building the case from one input, graph input (shape, dtype), concrete input)
BF16_CASES = {
    "ln": (lambda x: ops.Linear(6, name="ln_post")(ops.LayerNorm(name="ln")(ops.Linear(6, name="ln_pre")(x))),
           (("b0", 3, 6), "bfloat16"), (2, 3, 6)),
    "rms": (lambda x: ops.Linear(6, name="rms_post")(ops.RMSNorm(name="rms")(ops.Linear(6, name="rms_pre")(x))),
            (("b1", 3, 6), "bfloat16"), (2, 3, 6)),
    "gn": (lambda x: ops.Linear(4, name="gn_post")(ops.GroupNorm(2, name="gn")(ops.Linear(4, name="gn_pre")(x))),
           (("b2", 5, 4), "bfloat16"), (2, 5, 4)),
    "mha": (lambda x: ops.MultiHeadAttention(2, name="mha")(x, mask=ops.causal_mask(x)),
            (("b3", 5, 8), "bfloat16"), (2, 5, 8)),
    "lstm": (lambda x: list(ops.LSTM(4, return_state=True, name="lstm")(x)),
             (("b4", 5, 3), "bfloat16"), (2, 5, 3)),
    "gru": (lambda x: list(ops.GRU(4, return_state=True, name="gru")(x)),
            (("b5", 5, 3), "bfloat16"), (2, 5, 3)),
    "emb": (lambda ids: ops.Linear(3, name="emb_post")(ops.Embedding(9, 4, name="emb")(ids)),
            (("b6", 5), "int32"), None),
    "emb_bf16": (lambda ids: ops.Linear(3, name="emb_bf16_post")(
        ops.Embedding(9, 4, dtype="bfloat16", name="emb_bf16")(ids)), (("b7", 5), "int32"), None),
}
_BF16_IDS = np.array([[0, 8, 3, 3, 5], [1, 2, 7, 6, 4]], np.int32)


@functools.lru_cache(maxsize=None)
def bf16_family():
    policy = mg.Policy(compute_dtype="bfloat16")
    cases = {name: (call, [spec]) for name, (call, spec, _) in BF16_CASES.items()}
    model, params, state, index = family(cases, policy=policy, seed=3)
    xs = [(norm_input(shape, seed=i).astype(BF16) if shape is not None else _BF16_IDS)
          for i, (_, _, shape) in enumerate(BF16_CASES.values())]
    outs, _ = model.apply(params, state, *xs)
    jaxpr = jax.make_jaxpr(lambda p, s, *a: model.apply_fn(p, s, *a))(params, state, *xs).jaxpr
    by_scope = {}
    for scope, eqn in _scoped_eqns(jaxpr):
        by_scope.setdefault(scope, []).append(eqn)
    return model, params, xs, outs, by_scope, index


def _bf16_reference(name, params, x):
    """The float64 reference of the case on the (bfloat16-rounded) input, with the
    weights rounded to bfloat16 as the layers cast them."""
    P = jax.tree.map(lambda a: np.asarray(np.asarray(a).astype(BF16), np.float64), params)
    x = np.asarray(x, np.float64) if x.dtype != np.int32 else x

    def lin(h, n):
        return h @ P[n]["kernel"] + P[n]["bias"]

    if name == "ln":
        return [lin(lref.layer_norm(lin(x, "ln_pre"), **f64(params["ln"])), "ln_post")]
    if name == "rms":
        return [lin(lref.rms_norm(lin(x, "rms_pre"), params["rms"]["scale"]), "rms_post")]
    if name == "gn":
        return [lin(lref.group_norm(lin(x, "gn_pre"), 2, **f64(params["gn"])), "gn_post")]
    if name == "mha":
        return [lref.multi_head_attention(x, x, P["mha"], lref.causal(x.shape[1]))]
    if name == "lstm":
        return list(lref.lstm(x, **P["lstm"]))
    if name == "gru":
        return list(lref.gru(x, **P["gru"]))
    if name in ("emb", "emb_bf16"):
        return [lin(lref.embedding(x, P[name]["embedding"]), f"{name}_post")]
    raise AssertionError(name)


@pytest.mark.parametrize("name", list(BF16_CASES))
def test_bfloat16_policy_outputs_and_numbers(name):
    model, params, xs, outs, by_scope, index = bf16_family()
    (i,), outs_at = index[name]
    # Weights stay float32 (param_dtype); every output is in the compute dtype.
    assert all(a.dtype == F32 for a in jax.tree.leaves(params))
    want = _bf16_reference(name, params, xs[i])
    for o, w in zip(outs_at, want, strict=True):
        assert outs[o].dtype == BF16
        assert outs[o].shape == w.shape
        close(np.asarray(outs[o], np.float32), w, rtol=5e-2, atol=6e-2)


def _node(model, name):
    return model.graph.node(name)


def _casts_around(model, name):
    """The Cast nodes reading ``name``'s outputs and the ones feeding its inputs."""
    node = _node(model, name)
    before = [model.graph.node(v.node) for v in node.inputs]
    after = [n for n in model.graph.nodes if any(v.node == name for v in n.inputs)]
    return before, after


@pytest.mark.parametrize("name", ["ln", "rms", "gn"])
def test_bfloat16_policy_runs_norms_in_float32_islands(name):
    model, params, xs, outs, by_scope, index = bf16_family()
    node = _node(model, name)
    assert node.op.precision_sensitive
    assert [s.dtype for s in node.outputs] == [F32]
    before, after = _casts_around(model, name)
    # pre (bf16) -> Cast to f32 -> norm (f32) -> Cast to bf16 -> post (bf16)
    assert [(n.op.op_name, n.outputs[0].dtype) for n in before] == [("cast", F32)]
    assert model.graph.node(before[0].inputs[0].node).name == f"{name}_pre"
    assert [(n.op.op_name, n.outputs[0].dtype) for n in after] == [("cast", BF16)]
    assert [model.graph.node(v.node).name for v in _node(model, f"{name}_post").inputs] == [after[0].name]
    for n in (f"{name}_pre", f"{name}_post"):
        assert [s.dtype for s in _node(model, n).outputs] == [BF16]

    # The norm's math is float32; nothing outside the island (norm + its two casts) is.
    island = {name, before[0].name, after[0].name}
    assert any(F32 in _out_dtypes(e) and e.primitive.name == "rsqrt" for e in by_scope[name])
    for scope in (f"{name}_pre", f"{name}_post"):
        for eqn in by_scope[scope]:
            assert F32 not in _out_dtypes(eqn), (scope, eqn)
            if eqn.primitive.name == "dot_general":
                assert all(v.aval.dtype == BF16 for v in eqn.invars + eqn.outvars)
    assert island <= set(by_scope)


def test_bfloat16_policy_mha_softmax_in_float32_and_nothing_else():
    model, params, xs, outs, by_scope, index = bf16_family()
    node = _node(model, "mha")
    assert [s.dtype for s in node.outputs] == [BF16]
    assert [model.graph.node(v.node).outputs[v.index].dtype for v in node.inputs[:2]] == [BF16, BF16]
    eqns = by_scope["mha"]
    f32 = [e for e in eqns if F32 in _out_dtypes(e)]
    names = {e.primitive.name for e in f32}
    assert {"exp", "reduce_max"} <= names, names
    # Only the softmax (and the mask's select on its scores) is float32: every
    # projection and both attention contractions are bfloat16 in and out.
    assert names <= {"convert_element_type", "reduce_max", "max", "broadcast_in_dim",
                     "stop_gradient", "sub", "exp", "reduce_sum", "div", "select_n",
                     "jit", "pjit"}, names
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 6                 # q, k, v, scores, weights @ v, out
    for e in dots:
        assert all(v.aval.dtype == BF16 for v in e.invars + e.outvars), e


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_bfloat16_policy_recurrent_layers_stay_bfloat16(name):
    model, params, xs, outs, by_scope, index = bf16_family()
    node = _node(model, name)
    assert [s.dtype for s in node.outputs] == [BF16] * len(node.outputs)
    eqns = by_scope[name]
    assert any(e.primitive.name == "scan" for e in eqns)
    assert any(e.primitive.name == "logistic" for e in eqns)     # the scan body is included
    for eqn in eqns:
        assert F32 not in _out_dtypes(eqn), eqn


def test_bfloat16_policy_embedding():
    # Embedding's input is integer, so it has no dtype to follow: it returns its own
    # ``dtype`` (float32 by default, as its docstring says) and the policy casts that
    # for the next layer. With dtype="bfloat16" the lookup itself is bfloat16.
    model, params, xs, outs, by_scope, index = bf16_family()
    assert [s.dtype for s in _node(model, "emb").outputs] == [F32]
    _, after = _casts_around(model, "emb")
    assert [(n.op.op_name, n.outputs[0].dtype) for n in after] == [("cast", BF16)]
    for scope in ("emb_bf16", "emb_post", "emb_bf16_post"):
        for eqn in by_scope[scope]:
            assert F32 not in _out_dtypes(eqn), (scope, eqn)
    assert [s.dtype for s in _node(model, "emb_bf16").outputs] == [BF16]
    assert [n.name for n in _casts_around(model, "emb_bf16")[1]] == ["emb_bf16_post"]


def test_bfloat16_policy_no_float32_outside_the_islands():
    # Across the whole bfloat16 graph, float32 values are made only inside the
    # precision-sensitive norms and the casts around them, MHA's softmax, and the
    # default-dtype Embedding's lookup (and the cast of its result).
    model, params, xs, outs, by_scope, index = bf16_family()
    allowed = {"ln", "rms", "gn", "mha", "emb"}
    casts = set()
    for name in ("ln", "rms", "gn", "emb"):
        before, after = _casts_around(model, name)
        casts |= {n.name for n in before + after if n.op.op_name == "cast"}
    assert len(casts) == 7                    # two per norm, one after the Embedding
    for scope, eqns in by_scope.items():
        made = [e.primitive.name for e in eqns if F32 in _out_dtypes(e)]
        if scope in casts:
            assert set(made) <= {"convert_element_type"}, (scope, made)
        elif scope not in allowed:
            assert made == [], (scope, made)
    # Every float value the graph passes between layers is bfloat16 but for the islands'.
    for node in model.graph.nodes:
        if node.name not in allowed | casts and node.op.op_name != "causal_mask":
            assert all(s.dtype in (BF16, np.dtype(np.int32)) for s in node.outputs), node


# --- precision options of Linear and Conv --------------------------------------------


def test_preferred_element_type_float32_on_bfloat16_inputs():
    def call(x, img):
        return [ops.Linear(7, preferred_element_type="float32", name="fc")(x),
                ops.Linear(7, preferred_element_type="float32", precision="highest", name="fc_hi")(x),
                ops.Conv(4, (3, 3), padding="SAME", preferred_element_type="float32", name="conv")(img)]

    model = one_layer(call, (("batch", 64), "bfloat16"), (("n", 5, 5, 16), "bfloat16"))
    for n in ("fc", "fc_hi", "conv"):
        assert model.graph.node(n).op.preferred_element_type == F32
    assert model.graph.node("fc_hi").op.precision == "highest"
    params, state = random_init(model, seed=2)
    x = ref.rand((3, 64), seed=5).astype(BF16)
    img = ref.rand((2, 5, 5, 16), seed=6).astype(BF16)
    (fc, fc_hi, conv), _ = model.apply(params, state, x, img)

    # Outputs in the input dtype; the contraction itself accumulates in float32.
    assert fc.dtype == fc_hi.dtype == conv.dtype == BF16
    jaxpr = jax.make_jaxpr(lambda p, s, a, b: model.apply_fn(p, s, a, b))(params, state, x, img).jaxpr
    contractions = [(scope, e) for scope, e in _scoped_eqns(jaxpr)
                    if e.primitive.name in ("dot_general", "conv_general_dilated")]
    assert sorted(s for s, _ in contractions) == ["conv", "fc", "fc_hi"]
    for _, e in contractions:
        assert [v.aval.dtype for v in e.invars] == [BF16, BF16]
        assert [v.aval.dtype for v in e.outvars] == [F32]
        assert np.dtype(e.params["preferred_element_type"]) == F32

    # A float32 reference on the bfloat16 values, to bfloat16 tolerance (one rounding).
    P = jax.tree.map(lambda a: np.asarray(np.asarray(a).astype(BF16), np.float64), params)
    x64, img64 = np.asarray(x, np.float64), np.asarray(img, np.float64)
    tol = dict(rtol=2 ** -7, atol=1e-2)
    close(np.asarray(fc, np.float32), x64 @ P["fc"]["kernel"] + P["fc"]["bias"], **tol)
    close(np.asarray(fc_hi, np.float32), x64 @ P["fc_hi"]["kernel"] + P["fc_hi"]["bias"], **tol)
    close(np.asarray(conv, np.float32), ref.conv(img64, P["conv"]["kernel"], P["conv"]["bias"],
                                                 padding="SAME"), **tol)


# --- build-time errors name the layer and the user's line ----------------------------


def _check_error(info, layer, op, where, *fragments):
    message = str(info.value)
    assert f"layer '{layer}' (op {op})" in message, message
    assert where in message, (where, message)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("make, layer, op, fragment", [
    (lambda: ops.Linear(-3, name="bad"), "bad", "linear", "features"),
    (lambda: ops.Conv(-1, (3, 3), name="bad"), "bad", "conv", "features"),
    (lambda: ops.Embedding(10, -4, name="bad"), "bad", "embedding", "features"),
    (lambda: ops.Embedding(-10, 4, name="bad"), "bad", "embedding", "num_embeddings"),
    (lambda: ops.LSTM(-2, name="bad"), "bad", "lstm", "hidden"),
    (lambda: ops.GRU(-1, name="bad"), "bad", "gru", "hidden"),
    (lambda: ops.MultiHeadAttention(-2, name="bad"), "bad", "multi_head_attention", "num_heads"),
    (lambda: ops.MultiHeadAttention(2, head_dim=-4, name="bad"), "bad", "multi_head_attention", "head_dim"),
    (lambda: ops.GroupNorm(num_groups=-2, name="bad"), "bad", "group_norm", "num_groups"),
    (lambda: ops.Split(-3, name="bad"), "bad", "split", "sections"),
])
def test_negative_hyperparameters_raise_at_the_users_line(make, layer, op, fragment):
    with pytest.raises(mg.ConfigError) as info:
        make()
    # The user's line is the one in this file where the lambda made the layer.
    _check_error(info, layer, op, f"{__file__}:{make.__code__.co_firstlineno}", fragment)


def test_negative_features_names_the_exact_line():
    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        ops.LSTM(hidden=-5, name="rnn")
    _check_error(info, "rnn", "lstm", where, "hidden", "-5")
    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        ops.MultiHeadAttention(num_heads=-1, name="attn")
    _check_error(info, "attn", "multi_head_attention", where, "num_heads")
    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        ops.Embedding(5, features=0, name="emb")
    _check_error(info, "emb", "embedding", where, "features")


def test_kernel_larger_than_valid_input():
    x = mg.Input(("batch", 3, 3, 2), name="img")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.Conv(4, (5, 5), name="big_conv")(x)
    _check_error(info, "big_conv", "conv", where, "larger")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.AvgPool((4, 2), name="big_pool")(x)
    _check_error(info, "big_pool", "avg_pool", where, "larger", "f32[batch,3,3,2]")
    seq = mg.Input(("batch", 4, 2), name="seq")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.Conv(3, (5,), padding="VALID", name="big_conv1d")(seq)
    _check_error(info, "big_conv1d", "conv", where, "larger")


def test_num_heads_must_divide_features_without_head_dim():
    x = mg.Input(("batch", 5, 10), name="tokens")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.MultiHeadAttention(3, name="attn")(x)
    _check_error(info, "attn", "multi_head_attention", where, "num_heads=3", "f32[batch,5,10]")
    # With head_dim given, any num_heads works.
    assert ops.MultiHeadAttention(3, head_dim=4, name="attn")(x).shape[-1] == 10


@pytest.mark.parametrize("mask_shape", [(6, 5), (4, 4), ("batch", 5, 4, 4), ("batch", 3, 5, 6), (5,)])
def test_wrong_mask_shape(mask_shape):
    q = mg.Input(("batch", 5, 8), name="q")
    kv = mg.Input(("batch", 6, 8), name="kv")
    mask = mg.Input(mask_shape, "bool", name="mask")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.MultiHeadAttention(2, name="attn")(q, kv, mask=mask)
    _check_error(info, "attn", "multi_head_attention", where, "mask")


def test_non_bool_mask():
    q = mg.Input(("batch", 5, 8), name="q")
    # (An integer (batch, kv_len) mask is a key-padding mask, as Hugging Face passes it.)
    for dtype, shape in (("float32", (5, 5)), ("int32", (1, 5, 5))):
        mask = mg.Input(shape, dtype, name="mask")
        with pytest.raises(mg.DTypeError) as info:
            where = next_line()
            ops.MultiHeadAttention(2, name="attn")(q, mask=mask)
        _check_error(info, "attn", "multi_head_attention", where, "bool", dtype)


def test_integer_input_to_linear():
    ids = mg.Input(("batch", 3), "int32", name="ids")
    with pytest.raises(mg.DTypeError) as info:
        where = next_line()
        ops.Linear(4, name="proj")(ids)
    _check_error(info, "proj", "linear", where, "int32")


def test_float_input_to_embedding():
    x = mg.Input(("batch", 3), "float32", name="x")
    with pytest.raises(mg.DTypeError) as info:
        where = next_line()
        ops.Embedding(10, 4, name="emb")(x)
    _check_error(info, "emb", "embedding", where, "integer", "f32[batch,3]")


def test_group_norm_groups_must_divide_channels():
    x = mg.Input(("batch", 4, 4, 6), name="x")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.GroupNorm(num_groups=4, name="gn")(x)
    _check_error(info, "gn", "group_norm", where, "num_groups=4", "6")


def test_split_sections_must_divide():
    x = mg.Input(("batch", 3, 7), name="x")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.split(x, 2)
    _check_error(info, "split", "split", where, "7", "2")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.Split(4, axis=1, name="halves")(x)
    _check_error(info, "halves", "split", where, "3", "4")


def test_recurrent_layers_initialize_half_precision_weights():
    x = mg.Input(("batch", 5, 3))
    for layer in (ops.LSTM(4), ops.GRU(4)):
        model = mg.compile(mg.Graph(x, layer(x)), mg.Policy(param_dtype="bfloat16"))
        weights = model.init_fn(jax.random.key(0))[0][layer.op_name]
        assert weights["recurrent_kernel"].dtype == jnp.bfloat16
        kernel = np.asarray(weights["recurrent_kernel"], np.float32)  # (h, gates * h)
        np.testing.assert_allclose(kernel @ kernel.T, np.eye(4), atol=0.05)  # orthonormal rows
