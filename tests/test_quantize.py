"""Quantization as a graph rewrite: each scheme's weights and outputs against NumPy
references written here; the graph's visible casts, bytes as stored, the int8 dot in
the optimized HLO; QLoRA; files; bad input."""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler.program import leaf_paths
from mlaxgraph.ir.surgery import layer_paths

F8 = jnp.float8_e4m3fn  # ml_dtypes' type, which NumPy arrays take


# --- NumPy references of the schemes ---------------------------------------------------


def np_absmax(w, axes, bound):
    amax = np.max(np.abs(w.astype(np.float32)), axis=axes, keepdims=True)
    return np.where(amax == 0, np.float32(1), amax * np.float32(1.0 / bound)).astype(np.float32)


def np_int8(w, axes):
    """(int8 values, scale keepdims) of absmax int8 over ``axes``."""
    s = np_absmax(w, axes, 127)
    return np.clip(np.round(w.astype(np.float32) / s), -127, 127).astype(np.int8), s


def np_range(x, axes):
    """(scale, zero) of asymmetric int8 over ``axes`` (keepdims): [min(x, 0), max(x, 0)]
    over 255 steps, zero the integer 0.0 maps to."""
    x = x.astype(np.float32)
    low = np.minimum(x.min(axis=axes, keepdims=True), 0)
    high = np.maximum(x.max(axis=axes, keepdims=True), 0)
    span = high - low
    scale = np.where(span == 0, np.float32(1), span * np.float32(1 / 255)).astype(np.float32)
    zero = np.clip(np.round(-low / scale).astype(np.int32) - 128, -128, 127)
    return scale, zero


def np_asymmetric(x, scale, zero):
    """int8 values of x with a zero point: round(x / scale) + zero within [-128, 127]."""
    q = np.clip(np.round(x.astype(np.float32) / scale), -128 - zero, 127 - zero) + zero
    return q.astype(np.int8)


def np_float8(w, axes):
    s = np_absmax(w, axes, 448)
    return np.clip(w.astype(np.float32) / s, -448, 448).astype(F8), s


def np_int4(w, group):
    """int4 by groups of ``group`` along axis 0 of a (in, out) matrix: (packed uint8
    (in/2, out), scale (in/group, out), the int values (in, out))."""
    n, m = w.shape
    g = w.reshape(n // group, group, m).astype(np.float32)
    s = np_absmax(g, (1,), 7)
    q = np.clip(np.round(g / s), -8, 7).astype(np.int8).reshape(n, m)
    nibbles = q.astype(np.uint8) & 0x0F
    packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
    return packed, s[:, 0, :], q


def _linear(features=24, n_in=64, **kw):
    x = mg.Input(("batch", n_in), name="x")
    return mg.Graph(x, ops.Linear(features, name="fc", **kw)(x), name="one")


@pytest.fixture(scope="module")
def linear():
    g = _linear()
    params, state = mg.compile(g).init(jax.random.key(0))
    params = {"fc": {"kernel": params["fc"]["kernel"],
                     "bias": jax.random.normal(jax.random.key(3), (24,))}}
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, 64)))
    return g, params, state, x


def test_int8_weights_and_outputs_equal_numpy(linear):
    g, params, state, x = linear
    qg = mg.quantize(g, "int8")
    assert [(n.name, n.op.op_name) for n in qg.nodes] == [
        ("x", "input"), ("fc.quantize", "quantize"), ("fc", "quantized_linear"),
        ("fc.dequantize", "dequantize")]
    assert [str(s) for s in qg.node("fc.quantize").outputs] == ["i8[batch,64]", "f32[batch,1]"]
    # The int32 product, and the per-channel scales and bias it passes on, visible.
    assert [str(s) for s in qg.node("fc").outputs] == ["i32[batch,24]", "f32[24]", "f32[24]"]
    assert [str(v) for v in qg.node("fc.dequantize").inputs] == [
        "%fc", "%fc.quantize#1", "%fc#1", "%fc#2"]
    qp, qs = mg.quantize_weights(qg, params, state)
    w = np.asarray(params["fc"]["kernel"])
    q, s = np_int8(w, (0,))
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel"]), q)
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel_scale"]), s[0])
    out, _ = mg.compile(qg).apply(qp, qs, x)
    xq, xs = np_int8(x, (1,))
    acc = xq.astype(np.int32) @ q.astype(np.int32)
    ref = acc.astype(np.float32) * xs * s[0] + np.asarray(params["fc"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)


def test_layers_reading_one_value_read_one_quantize_node_and_equal_numpy():
    """Llama's gate and up projections read one input: it is quantized once, and each
    layer's output is NumPy's int8 product of that one int8 input; GPTQ rounds both with
    the Hessian of the input they share."""
    x = mg.Input(("batch", 64), name="x")
    h = ops.RMSNorm(name="norm")(x)
    gate, up = ops.Linear(32, name="gate")(h), ops.Linear(32, name="up")(h)
    g = mg.Graph(x, [gate, up], name="two")
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    assert [(n.name, [str(v) for v in n.inputs][:1]) for n in qg.nodes if n.op.op_name in (
        "quantize", "quantized_linear")] == [("gate.quantize", ["%norm"]),
                                             ("gate", ["%gate.quantize"]), ("up", ["%gate.quantize"])]
    qp, qs = mg.quantize_weights(qg, params, state)
    xs_ = np.asarray(jax.random.normal(jax.random.key(1), (6, 64)))
    outs, _ = mg.compile(qg).apply(qp, qs, xs_)
    normed = xs_ / np.sqrt(np.mean(xs_ ** 2, axis=-1, keepdims=True) + 1e-6)
    normed = normed * np.asarray(params["norm"]["scale"])
    xq, xscale = np_int8(normed.astype(np.float32), (1,))
    for name, out in zip(("gate", "up"), outs):
        q, s = np_int8(np.asarray(params[name]["kernel"]), (0,))
        ref = (xq.astype(np.int32) @ q.astype(np.int32)).astype(np.float32) * xscale * s[0] \
            + np.asarray(params[name]["bias"])
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    calib = [np.asarray(jax.random.normal(jax.random.key(k), (96, 64))) for k in (2, 3)]
    gp, _ = mg.quantize_weights(qg, params, state, calibration=calib, method="gptq")
    for name in ("gate", "up"):   # both rounded by GPTQ, not left to absmax
        assert not np.array_equal(np.asarray(gp[name]["kernel"]), np.asarray(qp[name]["kernel"]))


def test_int8_after_gelu_is_asymmetric_with_a_zero_point_equal_to_numpy(linear):
    _, params, state, x = linear
    inp = mg.Input(("batch", 64), name="x")
    g = mg.Graph(inp, ops.Linear(24, name="fc")(ops.Gelu(name="act")(inp)))
    qg = mg.quantize(g, "int8")
    cast = qg.node("fc.quantize")
    assert cast.op.zero_point and [str(s) for s in cast.outputs] == [
        "i8[batch,64]", "f32[batch,1]", "i32[batch,1]"]
    qp, qs = mg.quantize_weights(qg, params, state)
    assert int(qs["fc.quantize"]["zero"]) == 0 and float(qs["fc.quantize"]["scale"]) == 0
    out, _, captured = mg.compile(qg).apply(qp, qs, x * 3, capture=["act", "fc.quantize"])
    h = np.asarray(captured["act"])  # (5, 64), GELU's: most of its range above zero
    assert h.min() > -0.2 and h.max() > 5
    hs, hz = np_range(h, (1,))
    hq = np_asymmetric(h, hs, hz)
    got_q, got_s, got_z = (np.asarray(v) for v in captured["fc.quantize"])
    np.testing.assert_array_equal(got_z, hz)
    np.testing.assert_array_equal(got_s, hs)
    np.testing.assert_array_equal(got_q, hq)
    w, ws = np_int8(np.asarray(params["fc"]["kernel"]), (0,))
    acc = (hq.astype(np.int64) - hz) @ w.astype(np.int64)
    ref = acc.astype(np.float32) * hs * ws[0] + np.asarray(params["fc"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    # Finer than the symmetric int8 of the same values: half the step.
    sq, ss = np_int8(h, (1,))
    assert np.abs((hq.astype(np.float32) - hz) * hs - h).mean() < \
        0.7 * np.abs(sq.astype(np.float32) * ss - h).mean()
    row = [r for r in mg.compile(qg).cost_table(batch=5, inference_mode=True)
           if r.op.startswith("quantize")]
    assert all(r.flops == r.xla_flops for r in row) and len(row) == 2, row


def test_calibration_gives_static_scales_equal_to_numpy():
    x = mg.Input(("batch", 16), name="x")
    h = ops.Linear(32, activation="relu", name="fc1")(x)
    g = mg.Graph(x, ops.Linear(8, name="fc2")(h), name="two")
    params, state = mg.compile(g).init(jax.random.key(0))
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, 16)).astype(np.float32) * k for k in (1.0, 3.0, 0.5)]
    qg = mg.quantize(g, "int8")
    qp, dynamic = mg.quantize_weights(qg, params, state)
    assert float(dynamic["fc1.quantize"]["scale"]) == 0.0  # per-call scales
    qp2, qs = mg.quantize_weights(qg, params, state, calibration=batches)
    jax.tree.map(np.testing.assert_array_equal, qp2, qp)
    w1, s1 = np_int8(np.asarray(params["fc1"]["kernel"]), (0,))
    w2, s2 = np_int8(np.asarray(params["fc2"]["kernel"]), (0,))
    b1, b2 = np.asarray(params["fc1"]["bias"]), np.asarray(params["fc2"]["bias"])

    # fc2 reads a ReLU's output: asymmetric, with a zero point.
    assert (qg.node("fc1.quantize").op.zero_point, qg.node("fc2.quantize").op.zero_point) == \
        (False, True)

    def np_model(v, scale1=None, static2=None):
        """The int8 model in NumPy: static scales where given, per-token ones else."""
        if scale1 is None:
            vq, vs = np_int8(v, (1,))
        else:
            vs = np.float32(scale1)
            vq = np.clip(np.round(v / vs), -127, 127).astype(np.int8)
        acc = vq.astype(np.int32) @ w1.astype(np.int32)
        hidden = np.maximum(acc.astype(np.float32) * vs * s1[0] + b1, 0)
        hs, hz = np_range(hidden, (1,)) if static2 is None else static2
        hq = np_asymmetric(hidden, hs, hz)
        acc = (hq.astype(np.int32) - hz) @ w2.astype(np.int32)
        return hidden, acc.astype(np.float32) * hs * s2[0] + b2

    want1 = max(np.abs(b).max() for b in batches) * np.float32(1 / 127)
    ranges = [np_range(np_model(b)[0], (1,)) for b in batches]
    high = max(((127 - z) * s).max() for s, z in ranges)
    low = min(((-128 - z) * s).min() for s, z in ranges)
    want2 = np_range(np.array([low, high], np.float32), (0,))
    np.testing.assert_allclose(float(qs["fc1.quantize"]["scale"]), want1, rtol=1e-7)
    np.testing.assert_allclose(float(qs["fc2.quantize"]["scale"]), want2[0][0], rtol=1e-6)
    assert int(qs["fc2.quantize"]["zero"]) == int(want2[1][0]) == -128  # ReLU: low is 0
    test = rng.normal(size=(3, 16)).astype(np.float32) * 4  # beyond the range: clips
    out, _ = mg.compile(qg).apply(qp2, qs, test, inference_mode=True)
    ref = np_model(test, float(qs["fc1.quantize"]["scale"]),
                   (np.float32(qs["fc2.quantize"]["scale"]), np.int32(qs["fc2.quantize"]["zero"])))[1]
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    per_call, _ = mg.compile(qg).apply(qp, dynamic, test, inference_mode=True)
    assert not np.allclose(np.asarray(per_call), ref, atol=1e-3)  # the static scale is used


def test_float8_calibration_equals_numpy(linear):
    g, params, state, x = linear
    qg = mg.quantize(g, "float8")
    qp, qs = mg.quantize_weights(qg, params, state, calibration=[(x[:2],), (x[2:],)])
    scale = np.abs(x).max() * np.float32(1 / 448)
    assert float(qs["fc.quantize"]["scale"]) == pytest.approx(scale, rel=1e-7)
    out, _ = mg.compile(qg).apply(qp, qs, x)
    q, s = np_float8(np.asarray(params["fc"]["kernel"]), (0,))
    xs = np.float32(qs["fc.quantize"]["scale"])
    xq = np.clip(x / xs, -448, 448).astype(F8)
    acc = xq.astype(np.float32) @ q.astype(np.float32)
    ref = acc * xs * s[0] + np.asarray(params["fc"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


def test_calibration_bad_input_is_named(linear):
    g, params, state, x = linear
    with pytest.raises(mg.ConfigError, match="no batch"):
        mg.quantize_weights(mg.quantize(g, "int8"), params, state, calibration=[])
    with pytest.raises(mg.ConfigError, match="iterable of input batches"):
        mg.quantize_weights(mg.quantize(g, "int8"), params, state, calibration=x[0, 0])
    with pytest.raises(mg.ConfigError, match="has none"):
        mg.quantize_weights(mg.quantize(g, "int8_weight_only"), params, state, calibration=[x])
    for bad in (np.full_like(x, np.nan), np.where(x > 1, np.inf, x)):
        with pytest.raises(mg.ConfigError, match="calibration batch 1 holds NaN or inf values"):
            mg.quantize_weights(mg.quantize(g, "int8"), params, state, calibration=[x, bad])
    for method in ("absmax", "gptq"):  # a batch of another width: which batch, and which input
        with pytest.raises(mg.ShapeError, match="calibration batch 1: .*'x'"):
            mg.quantize_weights(mg.quantize(g, "int8"), params, state, calibration=[x, x[:, :32]],
                                method=method)


def test_calibration_ignores_zero_tokens_and_keeps_per_call_scales_where_all_are_zero(linear):
    """An all-zero token's per-call scale is 1 by convention (its values are 0 whatever
    the scale): it says nothing of the range, so the static scale is the other tokens'
    largest |x| / 127 (NumPy), and a node that saw only zeros keeps per-call scales."""
    g, params, state, x = linear
    qg = mg.quantize(g, "int8")
    small = x * 0.01
    small[2] = 0.0
    _, qs = mg.quantize_weights(qg, params, state, calibration=[small])
    np.testing.assert_allclose(float(qs["fc.quantize"]["scale"]), np.abs(small).max() / 127,
                               rtol=1e-6)
    with pytest.warns(mg.QuantizeWarning, match=r"only zeros at Quantize node\(s\) 'fc.quantize', "
                                                r"so they keep per-call scales"):
        _, qs = mg.quantize_weights(qg, params, state, calibration=[np.zeros_like(x)])
    assert float(qs["fc.quantize"]["scale"]) == 0.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights_quantize_as_their_float32_values(linear, dtype):
    """A bfloat16 or float16 checkpoint: the quantized weights are those of its values
    in float32, and the weights kept float (the bias) come out in float32, as the
    quantized graph's init makes them."""
    g, params, state, x = linear
    half = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
    wide = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), half)
    for scheme in ("int8_weight_only", "int8"):
        qg = mg.quantize(g, scheme)
        got, _ = mg.quantize_weights(qg, half, state)
        want, _ = mg.quantize_weights(qg, wide, state)
        q, _ = np_int8(np.asarray(wide["fc"]["kernel"]), (0,))
        np.testing.assert_array_equal(np.asarray(got["fc"]["kernel"]), q)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    int8 = mg.quantize_weights(mg.quantize(g, "int8"), params, state)
    with pytest.raises(mg.GraphError, match=r"no float 'kernel' for this layer to quantize \(it is "
                                            r"int8: weights another quantization made\?"):
        mg.quantize_weights(mg.quantize(g, "int4_weight_only", group_size=16), *int8)
    with pytest.raises(mg.GraphError, match=r"quantize_weights: graph 'one': state holds "
                                            r"\['fc.quantize'\], which the quantized graph does not "
                                            r"have \(weights another quantization made\?"):
        mg.quantize_weights(mg.quantize(g, "int8_weight_only"), *int8)


def test_int8_weight_only_equals_numpy(linear):
    g, params, state, x = linear
    qg = mg.quantize(g, "int8_weight_only")
    assert [n.op.op_name for n in qg.nodes] == ["input", "quantized_linear"]
    qp, qs = mg.quantize_weights(qg, params, state)
    q, s = np_int8(np.asarray(params["fc"]["kernel"]), (0,))
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel"]), q)
    out, _ = mg.compile(qg).apply(qp, qs, x)
    ref = (x @ q.astype(np.float32)) * s[0] + np.asarray(params["fc"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 16])
def test_int4_packs_two_values_a_byte_and_equals_numpy(linear, group):
    g, params, state, x = linear
    qg = mg.quantize(g, "int4_weight_only", group_size=group)
    qp, qs = mg.quantize_weights(qg, params, state)
    packed, s, q = np_int4(np.asarray(params["fc"]["kernel"]), group)
    assert qp["fc"]["kernel"].dtype == jnp.uint8 and qp["fc"]["kernel"].shape == (32, 24)
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel"]), packed)
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel_scale"]), s)
    out, _ = mg.compile(qg).apply(qp, qs, x)
    w = (q.reshape(-1, group, 24).astype(np.float32) * s[:, None, :]).reshape(64, 24)
    np.testing.assert_allclose(np.asarray(out), x @ w + np.asarray(params["fc"]["bias"]),
                               rtol=1e-5, atol=1e-5)


def test_float8_equals_numpy(linear):
    g, params, state, x = linear
    qg = mg.quantize(g, "float8")
    assert str(qg.node("fc.quantize").outputs[0]) == "f8e4m3[batch,64]"
    qp, qs = mg.quantize_weights(qg, params, state)
    q, s = np_float8(np.asarray(params["fc"]["kernel"]), (0,))
    assert qp["fc"]["kernel"].dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(qp["fc"]["kernel"]).astype(np.float32),
                                  q.astype(np.float32))
    out, _ = mg.compile(qg).apply(qp, qs, x)
    xq, xs = np_float8(x, (1,))
    acc = xq.astype(np.float32) @ q.astype(np.float32)
    ref = acc * xs * s[0] + np.asarray(params["fc"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


def test_int8_conv_equals_numpy():
    x_in = mg.Input(("batch", 6, 6, 8), name="x")
    g = mg.Graph(x_in, ops.Conv(4, (3, 3), padding="VALID", name="conv")(x_in))
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    assert qg.node("conv.quantize").op.axes == (1, 2, 3)  # one scale per example
    qp, qs = mg.quantize_weights(qg, params, state)
    w = np.asarray(params["conv"]["kernel"])                 # OHWI (4, 3, 3, 8)
    q, s = np_int8(w, (1, 2, 3))
    np.testing.assert_array_equal(np.asarray(qp["conv"]["kernel"]), q)
    x = np.asarray(jax.random.normal(jax.random.key(1), (2, 6, 6, 8)))
    out, _ = mg.compile(qg).apply(qp, qs, x)
    xq, xs = np_int8(x, (1, 2, 3))
    windows = np.lib.stride_tricks.sliding_window_view(xq.astype(np.int32), (3, 3), axis=(1, 2))
    acc = np.einsum("bhwcij,oijc->bhwo", windows, q.astype(np.int32))
    ref = acc.astype(np.float32) * xs * s.reshape(-1) + np.asarray(params["conv"]["bias"])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("data_format, strides, padding, dilation, groups", [
    ("NHWC", (2, 1), "SAME", (1, 1), 1),
    ("NHWC", (1, 1), ((2, 0), (1, 3)), (2, 1), 2),
    ("NCHW", (2, 2), "SAME", (1, 2), 4),
])
def test_int8_conv_is_an_int8_dot_equal_to_the_int32_convolution(data_format, strides, padding,
                                                                 dilation, groups):
    # The int8 convolution is one s8 x s8 -> s32 dot over patches; its sums equal an
    # int32 convolution's (plain lax) exactly, for strides, padding, dilation, groups
    # and channel-first data, and the optimized HLO has the dot and no convolution.
    shape = ("batch", 7, 6, 8) if data_format == "NHWC" else ("batch", 8, 7, 6)
    x_in = mg.Input(shape, name="x")
    conv = ops.Conv(8, (3, 2), strides=strides, padding=padding, dilation=dilation,
                    groups=groups, data_format=data_format, name="conv")
    g = mg.Graph(x_in, conv(x_in))
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    qp, qs = mg.quantize_weights(qg, params, state)
    x = np.asarray(jax.random.normal(jax.random.key(1), (2,) + shape[1:]))
    model = mg.compile(qg)
    out, _ = model.apply(qp, qs, x)
    xq, xs = np_int8(x, (1, 2, 3))
    spec = (data_format, "OHWI" if data_format == "NHWC" else "OIHW", data_format)
    acc = jax.lax.conv_general_dilated(
        jnp.asarray(xq, jnp.int32), jnp.asarray(qp["conv"]["kernel"], jnp.int32), strides,
        padding, rhs_dilation=dilation, dimension_numbers=spec, feature_group_count=groups)
    scale = np.asarray(qp["conv"]["kernel_scale"]) * np.ones((1, 1, 1, 1), np.float32)
    bias = np.asarray(params["conv"]["bias"]) * np.ones((1, 1, 1, 1), np.float32)
    if data_format == "NCHW":
        scale, bias = scale.reshape(1, -1, 1, 1), bias.reshape(1, -1, 1, 1)
    ref = np.asarray(acc).astype(np.float32) * xs * scale + bias
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)
    lines = [str(o) for o in model.hlo_by_layer(x, inference_mode=True)["conv"]]
    assert any("s32[" in line and "dot" in line for line in lines), lines
    assert not any(" convolution(" in line for line in lines), lines

def _tied():
    ids = mg.Input(("batch", 5), "int32", name="ids")
    emb = ops.Embedding(40, 32, name="emb")
    h = emb(ids)
    return mg.Graph(ids, emb.attend(ops.Linear(32, name="mix")(h)), name="tied")


@pytest.mark.parametrize("scheme", ["int8", "int4_weight_only"])
def test_embedding_lookup_and_tied_head_equal_numpy(scheme):
    g = _tied()
    params, state = mg.compile(g).init(jax.random.key(0))
    kw = {"group_size": 16} if scheme.startswith("int4") else {}
    qg = mg.quantize(g, scheme, **kw)
    ops_by_name = {n.name: n.op.op_name for n in qg.nodes}
    head = qg.outputs[0].node
    if scheme == "int8":  # the head's int32 product, then its Dequantize node
        assert ops_by_name[head] == "dequantize"
        head = qg.node(head).inputs[0].node
    assert ops_by_name["emb"] == ops_by_name[head] == "quantized_embedding"
    qp, qs = mg.quantize_weights(qg, params, state)
    table = np.asarray(params["emb"]["embedding"])
    if scheme == "int8":
        q, s = np_int8(table, (1,))
        np.testing.assert_array_equal(np.asarray(qp["emb"]["embedding"]), q)
        dequantized = q.astype(np.float32) * s
    else:
        packed, s, q = np_int4(table.T, 16)   # groups along the features of each row
        np.testing.assert_array_equal(np.asarray(qp["emb"]["embedding"]), packed.T)
        dequantized = (q.reshape(2, 16, 40).astype(np.float32) * s[:, None, :]).reshape(32, 40).T
    ids = np.asarray(jax.random.randint(jax.random.key(1), (3, 5), 0, 40))
    out, _ = mg.compile(qg).apply(qp, qs, ids)
    k, b = (np.asarray(params["mix"][n]) for n in ("kernel", "bias"))
    rows = dequantized[ids]
    if scheme == "int8":  # mix and the head read int8 inputs: int32 products
        kq, ks = np_int8(k, (0,))
        hq, hs = np_int8(rows, (2,))
        h = (hq.astype(np.int32) @ kq.astype(np.int32)).astype(np.float32) * hs * ks[0] + b
        hq, hs = np_int8(h, (2,))
        ref = (hq.astype(np.int32) @ q.T.astype(np.int32)).astype(np.float32) * hs * s[:, 0]
    else:
        kq = np_int4(k, 16)
        kw_ = (kq[2].reshape(2, 16, 32).astype(np.float32) * kq[1][:, None, :]).reshape(32, 32)
        ref = (rows @ kw_ + b) @ dequantized.T
    np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-5, atol=2e-5)


@pytest.fixture(scope="module")
def gpt2():
    g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64,
                        "n_positions": 16})
    params, state = mg.compile(g).init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, 64)
    return g, params, state, ids


def test_attention_projections_equal_the_float_attention_with_numpy_dequantized_weights(gpt2):
    g, params, state, ids = gpt2
    qg = mg.quantize(g, "int8_weight_only", targets="h.0/attn")
    assert qg.node("h.0").op.subgraph().node("attn").op.op_name == "quantized_multi_head_attention"
    qp, qs = mg.quantize_weights(qg, params, state)
    attn = params["h.0"]["attn"]
    deq = {}
    for name in ("query", "key", "value", "out"):
        w = np.asarray(attn[name]["kernel"])
        matrix = w.reshape(w.shape[0], -1) if name != "out" else w.reshape(-1, w.shape[-1])
        q, s = np_int8(matrix, (0,))
        np.testing.assert_array_equal(np.asarray(qp["h.0"]["attn"][name]["kernel"]), q)
        deq[name] = {**attn[name], "kernel": (q.astype(np.float32) * s).reshape(w.shape)}
    reference = jax.tree.map(lambda v: v, params)
    reference["h.0"] = {**params["h.0"], "attn": deq}
    want, _ = mg.compile(g).apply(reference, state, ids, inference_mode=True)
    got, _ = mg.compile(qg).apply(qp, qs, ids, inference_mode=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def np_int8_dot(x, q, s):
    """x (float, (..., in)) quantized per token, times int8 q (in, out) in int64, scaled
    by the token's scale and the columns' s."""
    xq, xs = np_int8(x, (-1,))
    return (xq.astype(np.int64) @ q.astype(np.int64)).astype(np.float32) * xs * s


def test_int8_attention_projections_are_int8_dots_equal_to_numpy(gpt2):
    g, params, state, ids = gpt2
    qg = mg.quantize(g, "int8", targets="h.0/attn")
    qp, qs = mg.quantize_weights(qg, params, state)
    model = mg.compile(qg)
    _, _, got = model.apply(qp, qs, ids, inference_mode=True, capture=["h.0/ln_1", "h.0/attn"])
    x = np.asarray(got["h.0/ln_1"], np.float32)  # (b, l, d), the attention's input
    attn = params["h.0"]["attn"]
    heads, head_dim = attn["query"]["kernel"].shape[1:]
    proj = {}
    for name in ("query", "key", "value", "out"):
        w = np.asarray(attn[name]["kernel"])
        matrix = w.reshape(w.shape[0], -1) if name != "out" else w.reshape(-1, w.shape[-1])
        proj[name] = np_int8(matrix, (0,))
        np.testing.assert_array_equal(np.asarray(qp["h.0"]["attn"][name]["kernel"]),
                                      proj[name][0])
    b, n = x.shape[:2]
    qkv = {}
    for name in ("query", "key", "value"):
        y = np_int8_dot(x, *proj[name]).reshape(b, n, heads, head_dim)
        qkv[name] = y + np.asarray(attn[name]["bias"])
    scores = np.einsum("bqhk,bshk->bhqs", qkv["query"] / np.sqrt(head_dim), qkv["key"])
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = np.einsum("bhqs,bshk->bqhk", weights, qkv["value"]).reshape(b, n, -1)
    want = np_int8_dot(attended, *proj["out"]) + np.asarray(attn["out"]["bias"])
    np.testing.assert_allclose(np.asarray(got["h.0/attn"]), want, rtol=1e-4, atol=1e-5)
    # The optimized HLO multiplies s8 x s8 -> s32 inside the attention.
    dots = [str(o) for o in model.hlo_by_layer(ids, inference_mode=True)["h.0/attn"]]
    assert sum("s32[" in line and ("dot" in line or "fusion" in line) for line in dots) >= 2, dots
    (row,) = [row for row in model.cost_table(batch=2, seq=8, inference_mode=True)
              if row.op == "quantized_multi_head_attention"]
    assert row.flops == row.xla_flops, row


def test_gpt2_default_targets_bytes_as_stored_and_int8_dot_in_hlo(gpt2):
    g, params, state, ids = gpt2
    qg = mg.quantize(g, "int8")
    ops_used = {path: node.op.op_name for path, node in layer_paths(qg)}
    assert ops_used["h.0/attn"] == "quantized_multi_head_attention"
    assert ops_used["wte"] == ops_used["wpe"] == "quantized_embedding"
    assert ops_used["h.1/mlp.c_fc.quantize"] == "quantize"
    model = mg.compile(qg)
    qp, qs = mg.quantize_weights(qg, params, state)
    stored = sum(np.asarray(a).nbytes for a in jax.tree.leaves((qp, qs)))  # static scales too
    table = model.cost_table(batch=2, seq=8, xla=False)
    assert table.weight_bytes == stored
    # the summary: stored int8 values and int32 kernel sums non-trainable, with the state;
    # float scales and biases trainable
    values = [np.asarray(a) for a in jax.tree.leaves(qp)]
    trains = [a.size for a in values if a.dtype.kind == "f" and a.dtype.itemsize > 1]
    frozen = sum(a.size for a in values) - sum(trains)
    assert any(a.dtype == np.int32 for a in values)  # the kernel sums of zero points
    frozen += sum(np.asarray(a).size for a in jax.tree.leaves(qs))
    summary = model.summary()
    assert f"trainable params: {sum(trains):,} (" in summary
    assert f"non-trainable params: {frozen:,} (" in summary
    float_bytes = sum(np.asarray(a).nbytes for a in jax.tree.leaves(params))
    assert mg.compile(g).cost_table(batch=2, seq=8, xla=False).weight_bytes == float_bytes
    hlo = model.hlo_by_layer(ids, inference_mode=True)
    dots = [str(o) for o in hlo["h.0/mlp.c_fc"]]
    assert any("s32[" in line and "dot" in line for line in dots), dots
    logits, _ = model.apply(qp, qs, ids, inference_mode=True)
    ref, _ = mg.compile(g).apply(params, state, ids, inference_mode=True)
    assert float(jnp.linalg.norm(logits - ref) / jnp.linalg.norm(ref)) < 0.05


def test_integer_sums_are_not_trainable():
    """A zero point's ``kernel_sum`` is int32: four bytes, yet no gradient. It counts with
    the stored int8 values, and naming it as trainable is the Trainer's error, not jax's."""
    x = mg.Input(("batch", 16), name="x")
    g = mg.Graph(x, ops.Linear(4, name="fc2")(ops.gelu(ops.Linear(32, name="fc1")(x))))
    q = mg.quantize(g, "int8")
    from mlaxgraph.render.summary import count_params
    counts = count_params(q)
    # fc2: bias 4 and kernel_scale 4 train; kernel 32 x 4 int8 and kernel_sum 4 int32 do not
    assert counts["fc2"] == (8, 132)
    assert counts["fc1"] == (64, 512)  # fc1 quantizes symmetrically: no kernel_sum
    model = mg.compile(q)
    with pytest.raises(mg.GraphError, match="fc2/kernel_sum is stored in int32.*cannot train"):
        mg.train.Trainer(model, optax.adam(1e-2), trainable="fc2/kernel_sum")
    # fc1's bias is upstream of fc2's Quantize: rounding to int8 passes it no gradient
    with pytest.raises(mg.GraphError, match=r"weight fc1/bias/? ?.*would train on a wrong gradient: "
                                            r"it passes through 'fc2.quantize' \(op quantize\)"):
        mg.train.Trainer(model, optax.adam(1e-2), trainable="**/bias")
    trainer = mg.train.Trainer(model, optax.adam(1e-2), loss="mean_squared_error",
                               trainable="fc2/bias")
    params, state = mg.quantize_weights(q, *mg.compile(g).init(jax.random.key(1)))
    ts = trainer.init(jax.random.key(0), reuse=(params, state))
    _, metrics = trainer.train_step(ts, jnp.ones((8, 16)), jnp.ones((8, 4)))
    assert np.isfinite(float(metrics["loss"]))


def test_qlora_trains_only_the_adapters(gpt2, tmp_path):
    g, params, state, ids = gpt2
    int8 = mg.lora(mg.quantize(g, "int8"), ["h.0/mlp.c_fc", "h.1/attn"], rank=2)
    c_fc = int8.node("h.0").op.subgraph()
    assert c_fc.node("mlp.c_fc.lora_A").inputs == c_fc.node("mlp.c_fc.quantize").inputs
    # int8 activations: the adapters' gradients would pass through roundings to int8
    with pytest.raises(mg.GraphError, match=r"weight h.0/mlp.c_fc.lora_A/kernel would train on a "
                                            r"wrong gradient: it passes through 'h.0/mlp.c_proj.quantize'.*"
                                            r"mg.quantize\(graph, \"int8_weight_only\"\)"):
        mg.train.Trainer(mg.compile(int8), optax.adam(1e-2), trainable="**/*.lora_*")
    # a tied embedding: its lookup is upstream of the cast even though its head is not
    partial = mg.compile(mg.quantize(g, "int8", targets="h.0/mlp.c_fc"))
    with pytest.raises(mg.GraphError, match=r"weight wte/embedding would train on a wrong gradient"):
        mg.train.Trainer(partial, optax.adam(1e-2), trainable="wte")
    mg.train.Trainer(partial, optax.adam(1e-2), trainable="ln_f")   # after every cast: trains
    qg = mg.quantize(g, "int8_weight_only")   # QLoRA's form: activations float
    qp, qs = mg.quantize_weights(qg, params, state)
    ag = mg.lora(qg, ["h.0/mlp.c_fc", "h.1/attn"], rank=2)
    model = mg.compile(ag)
    with pytest.raises(mg.GraphError, match="stored in int8.*cannot train"):
        mg.train.Trainer(model, optax.adam(1e-2))
    ap, as_ = model.init(jax.random.key(1), reuse=(qp, qs))
    base, _ = mg.compile(qg).apply(qp, qs, ids, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(model.apply(ap, as_, ids, inference_mode=True)[0]),
                                  np.asarray(base))  # B = 0
    trainer = mg.train.Trainer(model, optax.adam(1e-2), trainable="**/*.lora_*")
    # B = 0 would leave A's gradient zero in the first step.
    ap = jax.tree_util.tree_map_with_path(
        lambda p, w: w + 0.1 if ".lora_B" in jax.tree_util.keystr(p) else w, ap)
    ts = trainer.init(jax.random.key(0), reuse=(ap, as_))
    before = jax.tree.map(np.asarray, ap)
    ts, metrics = trainer.train_step(ts, ids, ids)
    assert np.isfinite(float(metrics["loss"]))
    # Adam's moments (the weights differentiated) are the adapters' alone.
    assert set(leaf_paths(ts.opt_state[0].mu)) == set(leaf_paths(mg.lora_params(ap)))
    np.testing.assert_array_equal(np.asarray(ts.params["h.0"]["mlp.c_fc"]["kernel"]),
                                  before["h.0"]["mlp.c_fc"]["kernel"])
    assert not np.array_equal(np.asarray(ts.params["h.0"]["mlp.c_fc.lora_A"]["kernel"]),
                              before["h.0"]["mlp.c_fc.lora_A"]["kernel"])
    path = os.path.join(tmp_path, "qlora.mlg")   # an adapted quantized model's file
    mg.save(path, ag, ts.params, ts.state)
    loaded_graph, loaded, _ = mg.load(path)
    assert loaded_graph == ag
    for a, b in zip(jax.tree.leaves(ts.params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(mg.GraphError, match="'h.0/mlp.c_fc' is quantized"):
        mg.merge_lora(ag, ap)
    with pytest.raises(mg.GraphError, match="'h.1/attn' is quantized"):
        mg.merge_lora(mg.lora(qg, "h.1/attn", rank=2), ap)


def test_qlora_weight_only_adapter_gradients_follow_the_float_ones(gpt2):
    """On a weight-only quantization the adapters' gradients are the float LoRA's up to
    the weights' rounding (a cosine near 1): what QLoRA trains on."""
    from mlaxgraph.train.selection import combine

    g, params, state, ids = gpt2
    targets = ["h.0/mlp.c_fc", "h.1/attn"]

    def adapter_grads(graph, base):
        model = mg.compile(graph)
        p, s = model.init(jax.random.key(1), reuse=base)
        p = jax.tree_util.tree_map_with_path(
            lambda k, w: w + 0.1 if ".lora_B" in jax.tree_util.keystr(k) else w, p)

        def loss(adapters):
            logits, _ = model.apply(combine(p, adapters), s, ids, inference_mode=True)
            return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

        return jax.grad(loss)(mg.lora_params(p))

    want = adapter_grads(mg.lora(g, targets, rank=2), (params, state))
    for scheme in ("int8_weight_only", "int4_weight_only"):
        qg = mg.quantize(g, scheme, group_size=16) if scheme == "int4_weight_only" else mg.quantize(g, scheme)
        got = adapter_grads(mg.lora(qg, targets, rank=2), mg.quantize_weights(qg, params, state))
        for path, a in leaf_paths(want).items():
            b = leaf_paths(got)[path]
            cosine = float(jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
            assert cosine > (0.999 if scheme == "int8_weight_only" else 0.97), (scheme, path, cosine)


@pytest.mark.parametrize("scheme", ["int4_weight_only", "float8"])
def test_save_load_and_export_round_trip(gpt2, tmp_path, scheme):
    g, params, state, ids = gpt2
    qg = mg.quantize(g, scheme, **({"group_size": 32} if scheme.startswith("int4") else {}))
    qp, qs = mg.quantize_weights(qg, params, state)
    path = os.path.join(tmp_path, "q.mlg")
    mg.save(path, qg, qp, qs)
    g2, p2, s2 = mg.load(path)
    assert g2 == qg
    for a, b in zip(jax.tree.leaves(qp), jax.tree.leaves(p2)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    want, _ = mg.compile(qg).apply(qp, qs, ids, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(mg.compile(g2).apply(p2, s2, ids, inference_mode=True)[0]),
                                  np.asarray(want))
    if scheme == "float8":
        return  # one export is enough: the artifact holds the program, not the scheme
    folder = os.path.join(tmp_path, "exported")
    mg.compile(qg).save_hlo(folder, ids, params=qp, state=qs)
    np.testing.assert_array_equal(np.asarray(mg.load_exported(folder)(ids)[0]), np.asarray(want))


def test_int8_file_round_trip_and_a_damaged_file_is_refused(linear, tmp_path):
    g, params, state, x = linear
    q8 = mg.quantize(g, "int8")
    p8, s8 = mg.quantize_weights(q8, params, state, calibration=[x])  # static scales saved
    mg.save(os.path.join(tmp_path, "q8.mlg"), q8, p8, s8)
    g8, loaded, loaded_state = mg.load(os.path.join(tmp_path, "q8.mlg"))
    assert g8 == q8 and loaded["fc"]["kernel"].dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(loaded["fc"]["kernel"]), np.asarray(p8["fc"]["kernel"]))
    assert float(loaded_state["fc.quantize"]["scale"]) == float(s8["fc.quantize"]["scale"]) > 0
    qg = mg.quantize(g, "int4_weight_only", group_size=32)
    qp, qs = mg.quantize_weights(qg, params, state)
    path = os.path.join(tmp_path, "q.mlg")
    mg.save(path, qg, qp, qs)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(mg.SerializationError, match="checksum"):
        mg.load(path)


def test_float8_under_a_bfloat16_policy_keeps_its_float8_input(linear):
    g, params, state, x = linear
    qg = mg.quantize(g, "float8")
    model = mg.compile(qg, mg.Policy(compute_dtype="bfloat16"))
    qp, qs = mg.quantize_weights(qg, params, state)
    out, _ = model.apply(qp, qs, x)
    assert out.dtype == jnp.bfloat16
    assert model.graph.node("fc").inputs[0].node == "fc.quantize"


@pytest.mark.parametrize("scheme", ["int8", "float8"])
def test_half_precision_policies_dequantize_in_float32(linear, scheme):
    """Under a float16 policy the scales and the product stay float32 until the
    Dequantize node's result: float8's accumulator passes float16's maximum (65504), and
    a per-token scale of small inputs is below its smallest value."""
    g, params, state, x = linear
    qg = mg.quantize(g, scheme)
    qp, qs = mg.quantize_weights(qg, params, state)
    model = mg.compile(qg, mg.Policy(compute_dtype="float16"))
    assert str(model.graph.node("fc.quantize").outputs[1]) == "f32[batch,1]"
    assert [str(model.graph.spec(v)) for v in model.graph.node("fc.dequantize").inputs[1:]] == [
        "f32[batch,1]", "f32[24]", "f32[24]"]
    w = np.asarray(params["fc"]["kernel"])
    bias = np.asarray(params["fc"]["bias"])
    for inputs in (x * 64, x * 1e-6):
        half = inputs.astype(np.float16).astype(np.float32)  # the policy's cast of x
        if scheme == "int8":
            (q, s), (xq, xs) = np_int8(w, (0,)), np_int8(half, (1,))
            acc = (xq.astype(np.int32) @ q.astype(np.int32)).astype(np.float32)
        else:
            (q, s), (xq, xs) = np_float8(w, (0,)), np_float8(half, (1,))
            acc = xq.astype(np.float32) @ q.astype(np.float32)
            assert np.abs(acc).max() > 65504  # what float16 cannot hold
        ref = (acc * xs * s[0] + bias).astype(np.float16)
        out, _ = model.apply(qp, qs, inputs)
        assert out.dtype == jnp.float16 and np.isfinite(np.asarray(out, np.float32)).all()
        np.testing.assert_allclose(np.asarray(out, np.float32), ref.astype(np.float32),
                                   rtol=2e-3, atol=float(np.abs(ref).max()) * 1e-3)


@pytest.mark.parametrize("scheme", ["int8", "int8_weight_only", "float8"])
def test_nan_inputs_and_ids_out_of_the_table_give_nan_as_the_float_model(scheme):
    ids = mg.Input(("batch", 3), "int32", name="ids")
    h = ops.Embedding(10, 16, name="wte")(ids)
    g = mg.Graph(ids, ops.Linear(4, name="fc")(ops.gelu(ops.Linear(16, name="up")(h))))
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, scheme)
    qp, qs = mg.quantize_weights(qg, params, state)
    out = np.asarray(mg.compile(qg).apply(qp, qs, np.array([[1, 12, 2], [3, 4, -3]]))[0])
    float_out = np.asarray(mg.compile(g).apply(params, state, np.array([[1, 12, 2], [3, 4, -3]]))[0])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(float_out))
    assert np.isnan(out[0, 1]).all() and np.isfinite(out[0, 0]).all()
    x = mg.Input(("batch", 8), name="x")
    lin = mg.Graph(x, ops.Linear(4, name="fc")(x))
    params, state = mg.compile(lin).init(jax.random.key(1))
    qlin = mg.quantize(lin, scheme)
    qp, qs = mg.quantize_weights(qlin, params, state)
    bad = np.ones((2, 8), np.float32)
    bad[0, 5] = np.nan
    out = np.asarray(mg.compile(qlin).apply(qp, qs, bad)[0])
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


# --- bad input ----------------------------------------------------------------------


def test_bad_input_is_named():
    g = _linear()
    with pytest.raises(mg.ConfigError, match="scheme must be one of"):
        mg.quantize(g, "int3")
    # a misspelt scheme names the one it most likely meant
    # (the peers' names too: torchao's, the W<bits>A<bits> shorthand)
    for given, meant in (("int4", "int4_weight_only"), ("INT8", "int8"), ("fp8", "float8"),
                         ("int8_weights_only", "int8_weight_only"), ("int8_wo", "int8_weight_only"),
                         ("W8A8", "int8"), ("w4a16", "int4_weight_only"),
                         ("int8_dynamic_activation_int8_weight", "int8")):
        with pytest.raises(mg.ConfigError, match=f"got '{given}' \\(did you mean '{meant}'\\?\\)"):
            mg.quantize(g, given)
    with pytest.raises(mg.ConfigError, match="group_size is for 'int4_weight_only'"):
        mg.quantize(g, "int8", group_size=32)
    with pytest.raises(mg.GraphError, match="matches no layer"):
        mg.quantize(g, "int8", targets="nothing*")
    with pytest.raises(mg.ConfigError, match=r"layer 'fc.lora_A' \(op linear\): this is a LoRA "
                                             r"adapter's layer: adapters stay float.*quantize the "
                                             r"layer it adapts \('fc'\)"):
        mg.quantize(mg.lora(g, "fc", rank=2), "int8", targets="fc.lora_A")
    x = mg.Input(("batch", 6, 6, 3), name="x")
    conv = mg.Graph(x, ops.LayerNorm(name="norm")(ops.Conv(4, (3, 3), name="conv")(x)))
    with pytest.raises(mg.ConfigError, match="layer 'conv' \\(op conv\\).*'float8' does not quantize"):
        mg.quantize(conv, "float8", targets="conv")
    with pytest.raises(mg.ConfigError, match="layer 'norm' \\(op layer_norm\\)"):
        mg.quantize(conv, "int8", targets="norm")
    with pytest.raises(mg.ConfigError, match="no layer 'float8' quantizes"):
        mg.quantize(mg.Graph(x, ops.relu(x)), "float8")
    q = mg.quantize(g, "int8")
    with pytest.raises(mg.ConfigError, match="quantized already"):
        mg.quantize(q, "int8", targets="fc")
    params, state = mg.compile(_linear(features=12)).init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match=r"layer 'fc/kernel'.*the float weight is "
                                            r"float32\[64, 12\].*needs int8\[64, 24\]"):
        mg.quantize_weights(q, params, state)
    with pytest.raises(mg.ConfigError, match="graph 'one' is quantized already \\(quantized "
                                             "layers: fc\\)"):
        mg.quantize(q, "int8")
    # the float graph given to quantize_weights: its weights would stay float
    float_params, float_state = mg.compile(g).init(jax.random.key(0))
    with pytest.raises(mg.ConfigError, match="has no quantized layer.*mg.quantize"):
        mg.quantize_weights(g, float_params, float_state)
    # one array given as the calibration batches: its rows would be taken for batches
    with pytest.raises(mg.ConfigError, match=r"got one array \[2, 64\]: pass calibration=\[batch\]"):
        mg.quantize_weights(q, float_params, float_state, calibration=jnp.ones((2, 64)))
    # int4 on a layer of 3 inputs: no even group divides them, whatever group_size
    x3 = mg.Input(("batch", 3), name="x")
    narrow = mg.Graph(x3, ops.Linear(4, name="first")(x3))
    for group in (None, 32):
        with pytest.raises(mg.ConfigError, match="layer 'first'.*no even group size divides 3: "
                                                 "leave this layer out of targets"):
            mg.quantize(narrow, "int4_weight_only", group_size=group)
    with pytest.raises(mg.ConfigError, match=r"layer 'fc'.*by 128.*pass group_size=64 \(even "
                                             r"sizes dividing 64: 2, 4, 8, 16, 32, 64\)"):
        mg.quantize(g, "int4_weight_only")
    # an adapted model's weights given for the base graph: its adapters would be dropped
    adapted = mg.lora(g, "fc", rank=2)
    ap, astate = mg.compile(adapted).init(jax.random.key(1))
    with pytest.raises(mg.GraphError, match=r"no layer of graph .* reads: 'fc\.lora_A/kernel', "
                                            r"'fc\.lora_B/kernel'.*mg\.merge_lora"):
        mg.quantize_weights(q, ap, astate)


def test_float_weights_given_to_the_quantized_model_name_quantize_weights(linear):
    g, params, state, x = linear
    qmodel = mg.compile(mg.quantize(g, "int8"))
    with pytest.raises(mg.GraphError, match=r"state has no entry 'fc\.quantize'.*"
                                            r"mg\.quantize_weights\(qgraph, params, state\)"):
        qmodel.apply(params, state, x)
    # init draws the stored int8 weights as zeros, and says so
    with pytest.warns(mg.QuantizeWarning, match=r"init draws the quantized weights of model 'one' "
                                                r"\(fc/kernel\) as zeros.*mg.quantize_weights"):
        zeros, qstate = qmodel.init(jax.random.key(0))
    assert not np.asarray(zeros["fc"]["kernel"]).any()
    with pytest.raises(mg.DTypeError, match=r"fc/kernel is stored in int8 by this layer; .*"
                                            r"mg\.quantize_weights"):
        qmodel.apply(params, qstate, x)


def test_calibration_ids_out_of_the_vocabulary_are_refused_by_name(gpt2):
    g, params, state, ids = gpt2
    qg = mg.quantize(g, "int8")
    with pytest.raises(mg.ShapeError, match=r"calibration batch 1, input 'input_ids' \(read by "
                                            r"layer 'wte'\): token id 10[0-9]+ is out of the "
                                            r"vocabulary: ids must be in \[0, 64\)"):
        mg.quantize_weights(qg, params, state, calibration=[ids, ids + 1000])


def test_params_and_state_swapped_are_named(gpt2):
    g, params, state, _ = gpt2
    qg = mg.quantize(g, "int8")
    with pytest.raises(mg.GraphError, match=r"layer 'wpe' \(op quantized_embedding\): params have "
                                            r"no weights for this layer but state has them: "
                                            r"params and state are swapped"):
        mg.quantize_weights(qg, state, params)
    with pytest.raises(mg.GraphError, match=r"params have no weights for this layer \(give the "
                                            r"float model's params"):
        mg.quantize_weights(qg, {}, {})


def test_to_onnx_of_a_quantized_graph_is_refused_naming_the_layer_path(gpt2, tmp_path):
    g, params, state, _ = gpt2
    fg = mg.quantize(g, "float8")
    fp, fs = mg.quantize_weights(fg, params, state)
    with pytest.raises(mg.SerializationError, match=r"layer 'h\.0/attn' \(op quantized_multi_head_"
                                                    r"attention\) is a quantized layer, which "
                                                    r"to_onnx does not write"):
        fg.to_onnx(tmp_path / "q.onnx", fp, fs)


@pytest.mark.parametrize("scheme", ["int8", "int8_weight_only", "int4_weight_only", "float8"])
def test_flop_rules_match_xla_count(scheme):
    x = mg.Input(("batch", 6, 6, 8), name="x")
    ids = mg.Input(("batch", 5), "int32", name="ids")
    emb = ops.Embedding(40, 8, name="emb")
    conv = ops.Conv(4, (3, 3), padding="SAME", name="conv")(x)
    out = ops.Linear(8, name="fc")(ops.Flatten()(conv)) + ops.Flatten()(emb.attend(emb(ids)))[:, :8]
    g = mg.Graph([x, ids], out)
    targets = ["fc"] if scheme == "float8" else None
    qg = mg.quantize(g, scheme, targets=targets, **({"group_size": 4} if "int4" in scheme else {}))
    table = mg.compile(qg).cost_table(batch=3, inference_mode=True)
    quantized = [row for row in table if row.op.startswith(("quantize", "dequantize"))]
    assert len(quantized) >= (2 if scheme == "float8" else 4)
    if scheme in ("int8", "float8"):
        assert sum(row.op == "dequantize" for row in quantized) == (1 if scheme == "float8" else 3)
    for row in quantized:
        assert row.flops == row.xla_flops, row


@pytest.mark.parametrize("scheme, category, stored", [
    ("int8", "int", "i8"), ("float8", "float8", "f8e4m3"), ("int4_weight_only", "int", "u8"),
    ("int8_weight_only", "int", "i8")])
def test_explorer_colours_the_casts_and_layers_by_stored_dtype(scheme, category, stored):
    from mlaxgraph.render.dot_style import DTYPE_COLORS
    from mlaxgraph.render.html.payload import scope_of

    qg = mg.quantize(_linear(), scheme, **({"group_size": 32} if "int4" in scheme else {}))
    root, _ = scope_of(qg)
    nodes = {node["name"]: node for node in root["n"]}
    assert nodes["x"]["cat"] == "float32" and nodes["fc"]["cat"] == category
    assert nodes["fc"]["weights"][0][:3] == ["kernel", "[64,24]" if "int4" not in scheme else "[32,24]",
                                              stored]
    if "weight_only" not in scheme:
        assert nodes["fc.quantize"]["cat"] == category
        assert nodes["fc.dequantize"]["cat"] == "float32"  # back to float, drawn as such
    # the DOT picture by the same rule: a weight-only layer, whose output is float, too
    line = next(line for line in qg.to_dot().splitlines() if "<B>fc</B>" in line)
    assert f'BGCOLOR="{DTYPE_COLORS[category][0]}"' in line


def test_int4_default_targets_leave_layers_the_group_does_not_divide_float_and_say_so():
    # a CNN's first convolution reads 3 channels and its next 16: group 32 divides
    # neither, the Linear's 64 inputs it does
    x = mg.Input(("batch", 8, 8, 3), name="x")
    h = ops.Conv(16, 3, padding="SAME", name="first")(x)
    h = ops.Conv(32, 3, padding="SAME", name="second")(ops.relu(h))
    h = ops.Linear(64, name="wide")(ops.Flatten()(h))
    g = mg.Graph(x, ops.Linear(4, name="head")(ops.relu(h)))
    with pytest.warns(mg.QuantizeWarning, match=r"group_size=32, which does not divide the "
                      r"inputs of 2 layers: first \(3 inputs\), second \(16 inputs\); "
                      r"group_size=16 divides the even ones\. They stay float") as caught:
        qg = mg.quantize(g, "int4_weight_only", group_size=32)
    assert len(caught) == 1
    kinds = {n.name: n.op.op_name for n in qg.nodes}
    assert kinds["first"] == "conv" and kinds["second"] == "conv"
    assert kinds["wide"] == "quantized_linear" and kinds["head"] == "quantized_linear"
    # the float layers keep their float weights; the quantized model runs and is close
    params, state = mg.compile(g).init(jax.random.key(0))
    qparams, qstate = mg.quantize_weights(qg, params, state)
    np.testing.assert_array_equal(qparams["first"]["kernel"], params["first"]["kernel"])
    xs = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    want, _ = mg.compile(g).apply(params, state, xs, inference_mode=True)
    got, _ = mg.compile(qg).apply(qparams, qstate, xs, inference_mode=True)
    assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 0.5
    # named explicitly, such a layer is an error, as before
    with pytest.raises(mg.ConfigError, match=r"layer 'second'.*groups the 16 inputs by 32.*"
                                             r"pass group_size=16"):
        mg.quantize(g, "int4_weight_only", group_size=32, targets=["second", "head"])
    # the warning can be made an error
    with warnings.catch_warnings():
        warnings.simplefilter("error", mg.QuantizeWarning)
        with pytest.raises(mg.QuantizeWarning):
            mg.quantize(g, "int4_weight_only", group_size=32)
    # when the group divides no layer's inputs, nothing is quantized: an error
    with pytest.raises(mg.ConfigError, match=r"group_size=4096.*inputs of 4 layers.*no layer of "
                                             r"graph .* is left to quantize"):
        mg.quantize(g, "int4_weight_only", group_size=4096)


def test_extra_weights_a_partly_quantized_graph_and_the_tanh_gelu_zero_point():
    x = mg.Input(("batch", 64), name="x")
    h = ops.Linear(32, activation="gelu_tanh", name="fc1")(x)
    g = mg.Graph(x, ops.Linear(10, name="fc2")(h))
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    assert qg.node("fc2.quantize").op.zero_point  # the tanh GELU's output is one-signed too
    with pytest.raises(mg.GraphError, match="params hold fc1/extra, a weight this layer does not"):
        mg.quantize_weights(qg, {**params, "fc1": {**params["fc1"], "extra": jnp.ones(3)}}, state)
    partly = mg.quantize(g, "int8", targets="fc1")
    with pytest.raises(mg.ConfigError, match="quantized already .*name the layers to quantize "
                                             "further in targets="):
        mg.quantize(partly, "int4_weight_only")
    mixed = mg.quantize(partly, "int8_weight_only", targets="fc2")  # a mix, asked by name
    assert mixed.node("fc2").op.scheme == "int8_weight_only"


def test_a_pattern_spelt_near_nothing_lists_the_layers_there():
    x = mg.Input(("batch", 8, 8, 3), name="x")
    g = mg.Graph(x, ops.Conv(4, (3, 3), name="c2")(ops.Conv(4, (3, 3), name="c1")(x)))
    with pytest.raises(mg.GraphError, match=r"pattern 'conv\*' matches no layer of graph 'graph'; "
                                            r"its layers: c1, c2"):
        mg.quantize(g, "int8", targets="conv*")
