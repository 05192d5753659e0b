"""BatchNorm's training formulation against a float64 NumPy reference: the batch variance
in one shifted pass (``variance="shifted"``, what ``"auto"`` picks for float32 on CPU) and in
two passes (``"two_pass"``), both normalizing as ``x * m + (bias - mean * m)`` on CPU; on
other backends two passes normalizing as ``(x - mean) * m + bias``.

The bound, for float32 inputs whose channels have mean ``mu`` and standard deviation
``sigma`` (``R = |mu| / sigma``; eps = float32's machine epsilon), with the shift ``k`` (the
batch's first value of each channel) ``D = |k - mu| / sigma`` standard deviations from the
mean (0 for two passes) and ``Z = max |x - mu| / sigma``, both at most ``sqrt(N - 1)`` for
``N`` values a channel (Samuelson's inequality) and about 1 and 3 in typical batches:

- output: ``|y - y64| <= 32 eps (1 + R + D^2 Z) max(1, |scale|)``: representing the mean
  in float32 alone moves every output by up to ``eps R |scale|``; the one pass's
  cancellation costs the variance ``D^2`` times the sums' rounding, which the output
  ``x_hat`` (at most ``Z``) carries at half that relative error;
- new running variance (relative to the batch variance): ``<= 64 eps (1 + R + D^2)``;
- gradients (of ``sum(g * y)`` w.r.t. x, scale and bias, relative to their largest
  magnitude): ``<= 64 eps (1 + R + D^2)``.

Flax's one-pass ``mean(x^2) - mean^2`` (computed here in jnp, float32) breaks the bound
by orders of magnitude once ``R`` is large: that is where the two-pass or the shifted
form matters.
"""

import pathlib
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import mlaxgraph as mg
from mlaxgraph import ops

EPS = float(np.finfo(np.float32).eps)
SHAPE = (16, 4, 4, 3)          # 16 examples of 4x4 with 3 channels: 256 values a channel
MOMENTUM, EPSILON = 0.9, 1e-5


def reference(x, scale, bias, g):
    """float64: output, batch mean and variance, and the gradients of sum(g * y)."""
    x = np.asarray(x, np.float64)
    axes = (0, 1, 2)
    n = x.size // x.shape[-1]
    mean = x.mean(axes)
    var = ((x - mean) ** 2).mean(axes)
    inv = 1.0 / np.sqrt(var + EPSILON)
    xhat = (x - mean) * inv
    gs = g * scale
    dx = inv / n * (n * gs - gs.sum(axes) - xhat * (gs * xhat).sum(axes))
    return xhat * scale + bias, mean, var, dx, (g * xhat).sum(axes), g.sum(axes)


def data(ratio, outlier, seed=0):
    """Channels of mean ``ratio * std`` (std 0.5); ``outlier``: the batch's first value of
    each channel is 15 std from the mean (the shift's worst place: about 11 standard
    deviations of the batch, ``D^2 = 120``)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE)
    if outlier:
        x[0, 0, 0] = 15.0
    x = (0.5 * x + 0.5 * ratio).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, SHAPE[-1])
    bias = rng.standard_normal(SHAPE[-1])
    return x, scale, bias, rng.standard_normal(SHAPE)


_STEPS = {}


def train_step(variance):
    """Jitted ``(params, x, g) -> (y, new_state, grads w.r.t. params and x)``, one compile
    per formulation."""
    if variance not in _STEPS:
        xin = mg.Input(("batch",) + SHAPE[1:], name="x")
        model = mg.compile(mg.Graph(xin, ops.BatchNorm(momentum=MOMENTUM, epsilon=EPSILON,
                                                       variance=variance, name="bn")(xin)))
        _, state = model.init(jax.random.key(0))

        def f(params, x, g):
            y, new_state = model.apply(params, state, x)
            return jnp.sum(y * g), (y, new_state)

        _STEPS[variance] = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
    return _STEPS[variance]


CASES = [(0.0, False), (0.0, True), (1e2, False), (1e4, False), (1e4, True), (1e5, False)]


@pytest.mark.parametrize("variance", ["shifted", "two_pass"])
@pytest.mark.parametrize("ratio,outlier", CASES)
def test_outputs_statistics_and_gradients_within_the_bound(variance, ratio, outlier):
    x, scale, bias, g = data(ratio, outlier)
    y64, _, var64, dx64, dscale64, dbias64 = reference(x, scale, bias, g)
    params = {"bn": {"scale": jnp.asarray(scale, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}}
    (_, (y, new_state)), (gp, gx) = train_step(variance)(params, x, jnp.asarray(g, jnp.float32))
    assert y.dtype == jnp.float32 and gx.dtype == jnp.float32
    x64 = x.astype(np.float64)
    z = (np.abs(x64 - x64.mean((0, 1, 2))) / np.sqrt(var64)).max()
    d2 = ((x64[0, 0, 0] - x64.mean((0, 1, 2))) ** 2 / var64).max() if variance == "shifted" else 0.0
    bound = EPS * (1.0 + ratio + d2)
    err_y = np.abs(np.asarray(y, np.float64) - y64).max()
    assert err_y <= 32 * EPS * (1.0 + ratio + d2 * z) * max(1.0, scale.max()), err_y / bound
    # The running variance after one step from ones: 0.9 + 0.1 * var.
    err_var = np.abs(np.asarray(new_state["bn"]["var"], np.float64) - (MOMENTUM + (1 - MOMENTUM) * var64))
    assert (err_var / ((1 - MOMENTUM) * var64)).max() <= 64 * bound
    for got, want in ((gx, dx64), (gp["bn"]["scale"], dscale64), (gp["bn"]["bias"], dbias64)):
        err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
        assert err <= 64 * bound, err / bound


def test_unshifted_one_pass_breaks_the_bound_where_the_mean_is_large():
    """What the shift is for: ``mean(x^2) - mean^2`` in float32 (Flax linen's default
    ``use_fast_variance``) at ``R = 1e4``, against the same bound."""
    ratio = 1e4
    x, scale, bias, _ = data(ratio, False)
    y64 = reference(x, scale, bias, np.zeros(SHAPE))[0]
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.maximum(jnp.mean(jnp.square(x), axis=(0, 1, 2)) - jnp.square(mean), 0.0)
    y = (x - mean) * jax.lax.rsqrt(var + EPSILON) * scale.astype(np.float32) + bias.astype(np.float32)
    err_y = np.abs(np.asarray(y, np.float64) - y64).max()
    assert err_y > 1000 * 32 * EPS * (1.0 + ratio) * scale.max()


def test_auto_is_shifted_for_32_and_64_bit_floats_and_two_pass_for_16_bit():
    bn = ops.BatchNorm()
    assert bn.variance == "auto"
    assert bn.one_pass(jnp.float32) and bn.one_pass(jnp.float64)
    assert not bn.one_pass(jnp.bfloat16) and not bn.one_pass(jnp.float16)
    assert not ops.BatchNorm(variance="two_pass").one_pass(jnp.float32)
    assert ops.BatchNorm(variance="shifted").one_pass(jnp.float16)


@pytest.mark.parametrize("ratio,outlier", CASES)
def test_other_backends_compute_two_passes_and_normalize_centered(monkeypatch, ratio, outlier):
    """Off CPU, ``"auto"`` is two passes and training normalizes as ``(x - mean) * m +
    bias`` (faster and smaller on GPU: benchmarks/RESULTS.md): the same bound, with no
    shift's cancellation, and no slice of the shift in the program."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not ops.BatchNorm().one_pass(jnp.float32)
    x, scale, bias, g = data(ratio, outlier)
    y64, _, var64, dx64, dscale64, dbias64 = reference(x, scale, bias, g)
    xin = mg.Input(("batch",) + SHAPE[1:], name="x")
    model = mg.compile(mg.Graph(xin, ops.BatchNorm(momentum=MOMENTUM, epsilon=EPSILON, name="bn")(xin)))
    _, state = model.init(jax.random.key(0))
    params = {"bn": {"scale": jnp.asarray(scale, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}}

    def f(params, x, g):
        y, new_state = model.apply(params, state, x)
        return jnp.sum(y * g), (y, new_state)

    step = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)
    assert "slice" not in str(jax.make_jaxpr(step)(params, x, jnp.asarray(g, jnp.float32)))
    (_, (y, new_state)), (gp, gx) = jax.jit(step)(params, x, jnp.asarray(g, jnp.float32))
    x64 = x.astype(np.float64)
    z = (np.abs(x64 - x64.mean((0, 1, 2))) / np.sqrt(var64)).max()
    bound = EPS * (1.0 + ratio)
    assert np.abs(np.asarray(y, np.float64) - y64).max() <= 32 * bound * z * max(1.0, scale.max())
    err_var = np.abs(np.asarray(new_state["bn"]["var"], np.float64) - (MOMENTUM + (1 - MOMENTUM) * var64))
    assert (err_var / ((1 - MOMENTUM) * var64)).max() <= 64 * bound
    for got, want in ((gx, dx64), (gp["bn"]["scale"], dscale64), (gp["bn"]["bias"], dbias64)):
        assert np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max() <= 64 * bound
    # inference keeps the affine form (the statistics are constants there)
    y_inf, _ = model.apply(params, state, x, inference_mode=True)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    np.testing.assert_array_equal(np.asarray(y_inf),
                                  np.asarray(model.apply(params, state, x, inference_mode=True)[0]))


def test_a_float16_input_under_auto_computes_as_two_pass():
    """A float16 graph with a float16 policy override: ``auto`` keeps two passes, so its
    outputs are those of ``variance="two_pass"`` exactly."""
    outs = []
    x = np.asarray(data(0.0, False)[0], np.float16)
    for variance in ("auto", "two_pass"):
        xin = mg.Input(("batch",) + SHAPE[1:], "float16", name="x")
        policy = mg.Policy(compute_dtype="float16", overrides={"bn": "float16"})
        model = mg.compile(mg.Graph(xin, ops.BatchNorm(variance=variance, name="bn")(xin)), policy)
        params, state = model.init(jax.random.key(0))
        y, _ = model.apply(params, state, x)
        assert y.dtype == jnp.float16
        outs.append(np.asarray(y))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_an_unknown_variance_is_a_config_error_naming_the_layer():
    with pytest.raises(mg.ConfigError, match=r"(?s)bn.*variance must be one of 'auto', 'shifted', 'two_pass'"):
        ops.BatchNorm(variance="fast", name="bn")


@pytest.mark.parametrize("inference_mode", [False, True])
def test_the_release_fixture_within_the_bound_of_a_float64_run(inference_mode):
    """The release fixture (a BatchNorm after two Transformer blocks), its float32
    outputs and new running variance against the same graph and weights in float64."""
    fixture = pathlib.Path(__file__).parent / "fixtures" / "release_0_1_0.mlg"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mg.UnverifiedFileWarning)  # a file of 0.1.0
        graph, params, state = mg.load(fixture)
    x = np.random.default_rng(3).standard_normal((4, 8, 16)).astype(np.float32)
    out32, st32 = mg.compile(graph).apply(params, state, x, inference_mode=inference_mode)
    with jax.enable_x64(True):
        names = {node.layer for _, node in graph.walk() if node.op.precision_sensitive}
        policy = mg.Policy(param_dtype="float64", compute_dtype="float64",
                           overrides={name: "float64" for name in names})
        p64, s64 = jax.tree.map(lambda a: np.asarray(a, np.float64), (params, state))
        out64, st64 = mg.compile(graph, policy).apply(p64, s64, x,
                                                       inference_mode=inference_mode)
        out64, var64 = np.asarray(out64), np.asarray(st64["bn"]["var"])
    assert np.abs(np.asarray(out32, np.float64) - out64).max() <= 1e-4 * np.abs(out64).max()
    np.testing.assert_allclose(np.asarray(st32["bn"]["var"], np.float64), var64, rtol=1e-5)
