"""GPTQ rounding (``quantize_weights(..., calibration=batches, method="gptq")``): the
weights equal an independent NumPy GPTQ written here (the optimal-brain-surgeon form:
the inverse Hessian shrunk by one row and column after each rounding, no blocks, no
Cholesky factor), keep absmax's scales and format, and give smaller output errors than
round-to-nearest on inputs the calibration did not see."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops


def np_gptq(w, h, scale, low, high, damp=0.01):
    """The integers GPTQ rounds ``w`` (in, out) to: rows in decreasing order of the
    Hessian's diagonal, each row's error spread over the rows after it by the inverse
    Hessian of the rows not rounded yet."""
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    d = np.diag(h).copy()
    d[d <= 0] = 1.0
    np.fill_diagonal(h, d + damp * d.mean())
    order = np.argsort(-d, kind="stable")
    inv = np.linalg.inv(h)[order][:, order]
    s = np.broadcast_to(scale, w.shape)
    q = np.zeros_like(w)
    for k, i in enumerate(order):
        q[i] = np.clip(np.round(w[i] / s[i]), low, high)
        err = (w[i] - q[i] * s[i]) / inv[0, 0]
        w[order[k + 1:]] -= np.outer(inv[1:, 0], err)
        inv = inv[1:, 1:] - np.outer(inv[1:, 0], inv[0, 1:]) / inv[0, 0]
    return q


def correlated(key, rows, n):
    """Inputs with correlated features (what GPTQ's compensation uses): 24 factors
    mixed into ``n``, a little noise of their own, a mean."""
    mix = jax.random.normal(jax.random.key(7), (24, n)) / np.sqrt(24)
    a, b = jax.random.split(key)
    return jax.random.normal(a, (rows, 24)) @ mix + 0.1 * jax.random.normal(b, (rows, n)) + 0.3


N_IN, N_OUT = 160, 24  # more than one block of 128 rows


@pytest.fixture(scope="module")
def linear():
    x = mg.Input(("batch", N_IN), name="x")
    g = mg.Graph(x, ops.Linear(N_OUT, name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    batches = [correlated(jax.random.key(10 + i), 128, N_IN) for i in range(3)]
    return g, params, state, batches


@pytest.mark.parametrize("scheme,group", [("int8_weight_only", None), ("int8", None),
                                          ("int4_weight_only", 32)])
def test_weights_equal_numpy_gptq_with_absmax_scales(linear, scheme, group):
    g, params, state, batches = linear
    qg = mg.quantize(g, scheme, **({"group_size": group} if group else {}))
    qp, qs = mg.quantize_weights(qg, params, state, calibration=batches, method="gptq")
    plain, _ = mg.quantize_weights(qg, params, state)
    w = np.asarray(params["fc"]["kernel"], np.float64)
    x = np.concatenate([np.asarray(b, np.float64) for b in batches])
    if group:
        low, high = -8, 7
        scale = np.asarray(plain["fc"]["kernel_scale"])  # (in / group, out)
        rows = np.repeat(scale, group, axis=0)
        packed = np.asarray(qp["fc"]["kernel"])
        got = np.empty((N_IN, N_OUT), np.int64)  # unpack: low nibble even rows
        got[0::2] = ((packed & 0x0F).astype(np.int64) ^ 8) - 8
        got[1::2] = ((packed >> 4).astype(np.int64) ^ 8) - 8
    else:
        low, high = -127, 127
        rows = np.asarray(plain["fc"]["kernel_scale"])[None]
        got = np.asarray(qp["fc"]["kernel"]).astype(np.int64)
    want = np_gptq(w, x.T @ x, rows, low, high)
    np.testing.assert_array_equal(got, want)
    # the same format, scales and bias as absmax; only the integers differ
    np.testing.assert_array_equal(qp["fc"]["kernel_scale"], plain["fc"]["kernel_scale"])
    assert qp["fc"]["kernel"].dtype == plain["fc"]["kernel"].dtype
    np.testing.assert_array_equal(qp["fc"]["bias"], params["fc"]["bias"])
    assert np.mean(np.asarray(qp["fc"]["kernel"]) != np.asarray(plain["fc"]["kernel"])) > 0.05
    if scheme == "int8":  # per-call activation scales unless asked for static ones
        assert float(qs["fc.quantize"]["scale"]) == 0.0
        _, static = mg.quantize_weights(qg, params, state, calibration=batches, method="gptq",
                                        static_scales=True)
        assert float(static["fc.quantize"]["scale"]) > 0.0


@pytest.mark.parametrize("scheme", ["int8", "int8_weight_only", "int4_weight_only"])
def test_held_out_output_error_below_round_to_nearest(linear, scheme):
    g, params, state, batches = linear
    qg = mg.quantize(g, scheme, **({"group_size": 32} if scheme.startswith("int4") else {}))
    held_out = correlated(jax.random.key(99), 256, N_IN)
    ref = np.asarray(held_out, np.float64) @ np.asarray(params["fc"]["kernel"], np.float64)
    ref = ref + np.asarray(params["fc"]["bias"])
    model = mg.compile(qg)
    errors = {}
    for method in ("absmax", "gptq"):
        qp, qs = mg.quantize_weights(qg, params, state, method=method, static_scales=False,
                                     calibration=batches if method == "gptq" else None)
        y = np.asarray(model.apply(qp, qs, held_out, inference_mode=True)[0], np.float64)
        errors[method] = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert errors["gptq"] < 0.85 * errors["absmax"], errors


def test_gpt2_attention_and_tied_head_rounded_from_their_inputs():
    cfg = dict(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    g = mg.models.gpt2(cfg)
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8_weight_only")
    batches = [jax.random.randint(jax.random.key(i), (8, 16), 0, 96) for i in range(3)]
    qp, qs = mg.quantize_weights(qg, params, state, calibration=batches, method="gptq")
    plain, _ = mg.quantize_weights(qg, params, state)
    # the out projection's Hessian is its input's: the heads' values, written here
    _, _, cap = mg.compile(qg).apply(plain, qs, jnp.concatenate(batches), inference_mode=True,
                                     capture=["h.1/ln_1", "ln_f"])
    x = np.asarray(cap["h.1/ln_1"], np.float64)
    a = {k: np.asarray(v["kernel"], np.float64).astype(np.float64) * (
        np.asarray(v["kernel_scale"], np.float64)) for k, v in plain["h.1"]["attn"].items()}
    b = {k: np.asarray(v["bias"], np.float64).reshape(-1) for k, v in plain["h.1"]["attn"].items()
         if "bias" in v and k != "out"}
    q, k, v = (x @ a[n] + b[n] for n in ("query", "key", "value"))
    heads = lambda t: t.reshape(t.shape[0], t.shape[1], 4, 8)  # noqa: E731
    scores = np.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(8)
    scores = np.where(np.tril(np.ones((16, 16), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", weights, heads(v)).reshape(-1, 32)
    w_out = np.asarray(params["h.1"]["attn"]["out"]["kernel"], np.float64).reshape(32, 32)
    scale = np.asarray(plain["h.1"]["attn"]["out"]["kernel_scale"])[None]
    want = np_gptq(w_out, context.T @ context, scale, -127, 127)
    got = np.asarray(qp["h.1"]["attn"]["out"]["kernel"]).astype(np.int64)
    assert np.mean(got == want) > 0.99  # float32 context here and there: a rare tie may flip
    # the tied head from the final LayerNorm's output; its lookup reads the same table
    f = np.asarray(cap["ln_f"], np.float64).reshape(-1, 32)
    table = np.asarray(params["wte"]["embedding"], np.float64)
    rows = np.asarray(plain["wte"]["embedding_scale"])[None]
    want = np_gptq(table.T, f.T @ f, rows, -127, 127).T
    got = np.asarray(qp["wte"]["embedding"]).astype(np.int64)
    assert np.mean(got == want) > 0.99
    # embeddings read by lookup only keep round-to-nearest
    np.testing.assert_array_equal(qp["wpe"]["embedding"], plain["wpe"]["embedding"])


def test_bad_input_is_named(linear):
    g, params, state, batches = linear
    qg = mg.quantize(g, "int8")
    with pytest.raises(mg.ConfigError, match="needs calibration"):
        mg.quantize_weights(qg, params, state, method="gptq")
    with pytest.raises(mg.ConfigError, match="method must be"):
        mg.quantize_weights(qg, params, state, calibration=batches, method="hqq")
    with pytest.raises(mg.ConfigError, match="needs calibration"):
        mg.quantize_weights(qg, params, state, static_scales=True)
    with pytest.raises(mg.ConfigError, match="no batch"):
        mg.quantize_weights(qg, params, state, calibration=[], method="gptq")
    x = mg.Input(("batch", 8, 8, 3), name="x")
    conv = mg.Graph(x, ops.Conv(4, (3, 3), name="conv")(x))
    cp, cs = mg.compile(conv).init(jax.random.key(0))
    with pytest.raises(mg.ConfigError, match="rounds Linear, attention"):
        mg.quantize_weights(mg.quantize(conv, "int8"), cp, cs,
                            calibration=[jnp.ones((2, 8, 8, 3))], method="gptq")


def test_fewer_calibration_tokens_than_inputs_warns_naming_the_layer(linear):
    g, params, state, batches = linear
    qg = mg.quantize(g, "int8_weight_only")
    few = [batches[0][:64], batches[1][:64]]  # 128 tokens for 160 inputs
    with pytest.warns(UserWarning, match=r"layer 'fc' reads 160 inputs and the calibration "
                                         r"batches give it 128 tokens.*at least 160"):
        mg.quantize_weights(qg, params, state, calibration=few, method="gptq")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough tokens: no warning
        mg.quantize_weights(qg, params, state, calibration=batches[:2], method="gptq")
