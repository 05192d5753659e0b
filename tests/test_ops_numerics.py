"""Forward numerics, parameter layouts (api.md section 5), gradients and the dtype
guarantee of the user-facing ops of the first layer set (Linear, Conv, BatchNorm,
Dropout, MaxPool, Flatten, Reshape, Concat, Add/Sub/Mul, the activations, Cast, F), each
through the public path: ``mg.Input`` -> ``mg.compile`` -> ``model.init`` ->
``model.apply``. To keep XLA compilations few, cases of one op are built side by side in
one graph (``family``): each case is still its own one-layer subgraph with its own input.

References are independent NumPy code in ``_reference.py`` (float64)."""

from __future__ import annotations

import functools

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
from _helpers import family, one_layer, random_init, shapes

RTOL = 1e-5
ATOL = 1e-5
BF16 = np.dtype(ml_dtypes.bfloat16)


# --- helpers ------------------------------------------------------------------------

close = functools.partial(_helpers.close, rtol=RTOL, atol=ATOL)


# --- Linear -------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def initialized_layers():
    """Linear, and Conv in both layouts, initialized by ``model.init`` (one compilation).

    An "rbg" key: init takes any key implementation, and XLA on CPU compiles the rbg
    generator for a rank-4 kernel in a fraction of the time threefry takes (seconds)."""
    x = mg.Input(("batch", 50), name="x")
    last = mg.Input(("batch", 6, 6, 8), name="last")
    first = mg.Input(("batch", 8, 6, 6), name="first")
    outs = [ops.Linear(40, name="fc")(x),
            ops.Conv(32, (3, 3), groups=2, name="conv_nhwc")(last),
            ops.Conv(32, (3, 3), groups=2, data_format="NCHW", name="conv_nchw")(first)]
    model = mg.compile(mg.Graph([x, last, first], outs, name="initialized"))
    return model.init(jax.random.key(0, impl="rbg"))


def test_linear_param_layout():
    params, state = initialized_layers()
    assert shapes(params["fc"]) == {"kernel": (50, 40), "bias": (40,)}
    assert state == {}
    assert params["fc"]["kernel"].dtype == np.float32
    np.testing.assert_array_equal(params["fc"]["bias"], np.zeros(40, np.float32))
    # LeCun normal over the fan in (the first axis): std 1/sqrt(50).
    np.testing.assert_allclose(float(jnp.std(params["fc"]["kernel"])), 50 ** -0.5, rtol=0.15)

    model = one_layer(ops.Linear(3, use_bias=False, name="fc"), (("batch", 5), "float32"))
    params, _ = jax.eval_shape(model.init, jax.random.key(0))
    assert shapes(params) == {"fc": {"kernel": (5, 3)}}


LINEAR_CASES = {
    "rank1": ((5,), (5,)),                 # no batch axis at all
    "rank2": (("b2", 5), (4, 5)),
    "rank3": (("b3", 3, 5), (2, 3, 5)),
    "inner_symbolic": ((2, "n", 5), (2, 6, 5)),
}


@functools.lru_cache(maxsize=None)
def linear_family():
    cases = {name: (lambda x, name=name: [ops.Linear(7, name=f"fc_{name}")(x),
                                          ops.Linear(2, use_bias=False, name=f"nb_{name}")(x)],
                    [(graph_shape, "float32")])
             for name, (graph_shape, _) in LINEAR_CASES.items()}
    model, params, state, index = family(cases, seed=3)
    xs = [ref.rand(shape, seed=11 + i) for i, (_, shape) in enumerate(LINEAR_CASES.values())]
    outs, new_state = model.apply(params, state, *xs)
    return params, xs, outs, new_state, index


@pytest.mark.parametrize("name", list(LINEAR_CASES))
def test_linear_forward(name):
    params, xs, outs, new_state, index = linear_family()
    (i,), (o, o_nb) = index[name]
    shape = LINEAR_CASES[name][1]
    assert shapes(params[f"fc_{name}"]) == {"kernel": (5, 7), "bias": (7,)}
    assert shapes(params[f"nb_{name}"]) == {"kernel": (5, 2)}
    x64 = np.asarray(xs[i], np.float64)
    p = {k: np.asarray(v, np.float64) for k, v in params[f"fc_{name}"].items()}
    assert outs[o].shape == shape[:-1] + (7,) and outs[o].dtype == np.float32
    close(outs[o], x64 @ p["kernel"] + p["bias"])
    close(outs[o_nb], x64 @ np.asarray(params[f"nb_{name}"]["kernel"], np.float64))
    assert new_state == {}


# --- Conv ---------------------------------------------------------------------------

# (kwargs for ops.Conv, concrete input shape incl. batch)
CONV_CASES = {
    "2d_valid": (dict(features=4, kernel_size=(3, 3)), (2, 7, 6, 3)),
    "2d_same_stride2": (dict(features=5, kernel_size=(3, 3), strides=2, padding="SAME"), (2, 7, 8, 3)),
    "2d_same_even_kernel": (dict(features=3, kernel_size=(2, 4), padding="SAME"), (2, 5, 7, 2)),
    "2d_explicit_pad_dilated": (dict(features=4, kernel_size=(3, 2), strides=(2, 1),
                                     padding=((1, 2), (0, 1)), dilation=(2, 1)), (2, 9, 6, 3)),
    "2d_groups_same_dilation": (dict(features=6, kernel_size=(3, 3), padding="SAME", dilation=2,
                                     groups=2), (2, 8, 8, 4)),
    "2d_depthwise": (dict(features=8, kernel_size=(3, 3), padding="SAME", groups=4), (2, 6, 6, 4)),
    "2d_no_bias": (dict(features=4, kernel_size=(1, 1), use_bias=False), (2, 3, 3, 5)),
    "2d_nchw_same_stride_groups": (dict(features=6, kernel_size=(3, 3), strides=2, padding="SAME",
                                        groups=3, data_format="NCHW"), (2, 6, 7, 5)),
    "2d_nchw_explicit_dilated": (dict(features=4, kernel_size=(2, 3), padding=((0, 1), (2, 0)),
                                      dilation=(1, 2), data_format="NCHW"), (2, 3, 6, 7)),
    "1d_same_stride2": (dict(features=4, kernel_size=(3,), strides=2, padding="SAME"), (2, 9, 3)),
    "1d_ncw_dilated": (dict(features=3, kernel_size=(3,), dilation=2, data_format="NCHW"), (2, 2, 10)),
    "3d_same_strided": (dict(features=3, kernel_size=(2, 3, 2), strides=(1, 2, 1), padding="SAME"),
                        (2, 4, 5, 4, 2)),
    "3d_ncdhw_groups_explicit": (dict(features=4, kernel_size=(2, 2, 2), groups=2,
                                      padding=((1, 0), (0, 0), (1, 1)), data_format="NCDHW"),
                                 (2, 4, 3, 4, 3)),
}


@functools.lru_cache(maxsize=None)
def conv_family():
    cases = {name: (ops.Conv(**kwargs, name=f"conv_{name}"), [(("batch",) + shape[1:], "float32")])
             for name, (kwargs, shape) in CONV_CASES.items()}
    model, params, state, index = family(cases, seed=5)
    xs = [ref.rand(shape, seed=7 + i) for i, (_, shape) in enumerate(CONV_CASES.values())]
    outs, _ = model.apply(params, state, *xs)
    shaped = jax.eval_shape(model.init, jax.random.key(0))       # the names and shapes init makes
    return model, shaped, params, state, xs, outs, index


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv_forward_and_layout(name):
    model, (shaped_params, shaped_state), params, state, xs, outs, index = conv_family()
    kwargs, shape = CONV_CASES[name]
    (i,), (o,) = index[name]
    layer = model.graph.node(f"conv_{name}").op
    channels_last = kwargs.get("data_format", "NHWC").upper().endswith("C")

    k = tuple(kwargs["kernel_size"])
    features, groups = kwargs["features"], kwargs.get("groups", 1)
    cin = shape[-1] if channels_last else shape[1]
    want_kernel = (features, *k, cin // groups) if channels_last else (features, cin // groups, *k)
    want_params = {"kernel": want_kernel}
    if kwargs.get("use_bias", True):
        want_params["bias"] = (features,)
    assert shapes(shaped_params[f"conv_{name}"]) == want_params
    assert shaped_state == {}

    want = ref.conv(xs[i], params[f"conv_{name}"]["kernel"], params[f"conv_{name}"].get("bias"),
                    strides=layer.strides, padding=kwargs.get("padding", "VALID"),
                    dilation=layer.dilation, groups=groups, channels_last=channels_last)
    assert outs[o].shape == want.shape and outs[o].dtype == np.float32
    close(outs[o], want)


@pytest.mark.parametrize("name, kernel", [
    ("conv_nhwc", (32, 3, 3, 4)),     # OHWI, 8 input channels in 2 groups
    ("conv_nchw", (32, 4, 3, 3)),     # OIHW
])
def test_conv_init_layout_and_scale(name, kernel):
    params, state = initialized_layers()
    assert shapes(params[name]) == {"kernel": kernel, "bias": (32,)}
    assert name not in state
    np.testing.assert_array_equal(params[name]["bias"], np.zeros(32, np.float32))
    # LeCun normal over the fan in: (input channels per group) * kernel taps = 4 * 9.
    np.testing.assert_allclose(float(jnp.std(params[name]["kernel"])), 36 ** -0.5, rtol=0.15)


def test_conv_two_batch_sizes_one_model():
    model = one_layer(ops.Conv(4, (3, 3), padding="SAME", name="conv"), (("batch", 5, 5, 2), "float32"))
    params, state = random_init(model, seed=1)
    for batch in (1, 3):
        x = ref.rand((batch, 5, 5, 2), seed=batch)
        out, _ = model.apply(params, state, x)
        close(out, ref.conv(x, params["conv"]["kernel"], params["conv"]["bias"], padding="SAME"))


# --- BatchNorm ----------------------------------------------------------------------


def test_batch_norm_param_and_state_layout():
    model = one_layer(ops.BatchNorm(name="bn"), (("batch", 4, 4, 6), "float32"))
    params, state = model.init(jax.random.key(0))
    assert shapes(params) == {"bn": {"scale": (6,), "bias": (6,)}}
    assert shapes(state) == {"bn": {"mean": (6,), "var": (6,)}}
    np.testing.assert_array_equal(params["bn"]["scale"], np.ones(6, np.float32))
    np.testing.assert_array_equal(params["bn"]["bias"], np.zeros(6, np.float32))
    np.testing.assert_array_equal(state["bn"]["mean"], np.zeros(6, np.float32))
    np.testing.assert_array_equal(state["bn"]["var"], np.ones(6, np.float32))

    model = one_layer(ops.BatchNorm(axis=1, use_scale=False, name="bn"), (("batch", 3, 5), "float32"))
    params, state = model.init(jax.random.key(0))
    assert shapes(params) == {"bn": {"bias": (3,)}}
    assert shapes(state) == {"bn": {"mean": (3,), "var": (3,)}}

    # No weights at all: absent from params, present in state.
    model = one_layer(ops.BatchNorm(use_scale=False, use_bias=False, name="bn"), (("batch", 3), "float32"))
    params, state = model.init(jax.random.key(0))
    assert params == {}
    assert shapes(state) == {"bn": {"mean": (3,), "var": (3,)}}


BN_CASES = {
    # name: (kwargs, graph shape, concrete shape)
    "defaults_rank2": (dict(), ("b0", 4), (16, 4)),
    "momentum_eps_rank4": (dict(momentum=0.8, epsilon=1e-3), ("b1", 3, 3, 5), (4, 3, 3, 5)),
    "channel_first": (dict(momentum=0.5, axis=1), ("b2", 4, 3, 3), (5, 4, 3, 3)),
    "no_scale": (dict(momentum=0.7, use_scale=False), ("b3", 6, 2), (3, 6, 2)),
}


@functools.lru_cache(maxsize=None)
def bn_family(inference_mode):
    cases = {name: (ops.BatchNorm(**kwargs, name=f"bn_{name}"), [(graph_shape, "float32")])
             for name, (kwargs, graph_shape, _) in BN_CASES.items()}
    model, params, state, index = family(cases, seed=2)
    xs = [ref.rand(shape, seed=4 + i) * 3.0 + 1.0 for i, (_, _, shape) in enumerate(BN_CASES.values())]
    outs, new_state = model.apply(params, state, *xs, inference_mode=inference_mode)
    return params, state, xs, outs, new_state, index


def _bn_reference(name, params, state, x, training):
    kwargs = BN_CASES[name][0]
    p, s = params[f"bn_{name}"], state[f"bn_{name}"]
    return ref.batch_norm(x, p.get("scale"), p.get("bias"), s["mean"], s["var"],
                          momentum=kwargs.get("momentum", 0.9), epsilon=kwargs.get("epsilon", 1e-5),
                          axis=kwargs.get("axis", -1), training=training)


@pytest.mark.parametrize("name", list(BN_CASES))
def test_batch_norm_training(name):
    params, state, xs, outs, new_state, index = bn_family(False)
    (i,), (o,) = index[name]
    want, want_mean, want_var = _bn_reference(name, params, state, xs[i], training=True)
    close(outs[o], want)
    close(new_state[f"bn_{name}"]["mean"], want_mean)
    close(new_state[f"bn_{name}"]["var"], want_var)
    assert new_state[f"bn_{name}"]["mean"].dtype == np.float32
    assert new_state[f"bn_{name}"]["var"].dtype == np.float32


@pytest.mark.parametrize("name", list(BN_CASES))
def test_batch_norm_inference_uses_running_stats(name):
    params, state, xs, outs, new_state, index = bn_family(True)
    (i,), (o,) = index[name]
    want, _, _ = _bn_reference(name, params, state, xs[i], training=False)
    close(outs[o], want)
    np.testing.assert_array_equal(new_state[f"bn_{name}"]["mean"], state[f"bn_{name}"]["mean"])
    np.testing.assert_array_equal(new_state[f"bn_{name}"]["var"], state[f"bn_{name}"]["var"])


# --- Dropout ------------------------------------------------------------------------


def test_dropout_inference_is_identity_and_needs_no_rng():
    model = one_layer(ops.Dropout(0.5, name="drop"), (("batch", 10), "float32"))
    params, state = random_init(model)
    assert params == {} and state == {}
    x = ref.rand((3, 10), seed=1)
    out, _ = model.apply(params, state, x, inference_mode=True)
    np.testing.assert_array_equal(out, x)


def test_dropout_training_statistics_and_scaling():
    rate = 0.3
    model = one_layer(ops.Dropout(rate, name="drop"), (("batch", 1000), "float32"))
    params, state = model.init(jax.random.key(0))
    x = ref.rand((20, 1000), seed=2, low=0.5, high=2.0)   # no zeros: a zero means dropped
    out, _ = model.apply(params, state, x, rng=jax.random.key(42))
    out = np.asarray(out)
    kept = out != 0
    n = kept.size
    tolerance = 6 * np.sqrt(rate * (1 - rate) / n)        # six standard deviations
    assert abs(kept.mean() - (1 - rate)) < tolerance
    np.testing.assert_allclose(out[kept], (x[kept] / np.float32(1 - rate)), rtol=1e-6)

    again, _ = model.apply(params, state, x, rng=jax.random.key(42))
    np.testing.assert_array_equal(again, out)            # same key, same mask
    other, _ = model.apply(params, state, x, rng=jax.random.key(43))
    assert not np.array_equal(np.asarray(other) != 0, kept)


def test_dropout_without_rng_raises_graph_error():
    model = one_layer(ops.Dropout(0.2, name="drop"), (("batch", 4), "float32"))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match="rng"):
        model.apply(params, state, np.ones((2, 4), np.float32))


# --- MaxPool ------------------------------------------------------------------------

MAXPOOL_CASES = {
    "2d_default_strides": (dict(window=(2, 2)), (2, 6, 7, 3)),
    "2d_same_overlapping": (dict(window=(3, 3), strides=(2, 2), padding="SAME"), (2, 7, 8, 2)),
    "2d_explicit": (dict(window=(2, 3), strides=(1, 2), padding=((1, 1), (0, 1))), (1, 5, 6, 2)),
    "1d": (dict(window=(3,), strides=(2,)), (2, 9, 3)),
    "3d_same": (dict(window=(2, 2, 2), padding="SAME"), (1, 3, 4, 5, 2)),
}


@functools.lru_cache(maxsize=None)
def max_pool_family():
    cases = {name: (ops.MaxPool(**kwargs, name=f"pool_{name}"), [((f"b{i}",) + shape[1:], "float32")])
             for i, (name, (kwargs, shape)) in enumerate(MAXPOOL_CASES.items())}
    model, params, state, index = family(cases)
    xs = [ref.rand(shape, seed=3 + i) for i, (_, shape) in enumerate(MAXPOOL_CASES.values())]
    outs, _ = model.apply(params, state, *xs)
    return params, state, xs, outs, index


@pytest.mark.parametrize("name", list(MAXPOOL_CASES))
def test_max_pool_forward(name):
    params, state, xs, outs, index = max_pool_family()
    assert params == {} and state == {}
    kwargs, _ = MAXPOOL_CASES[name]
    (i,), (o,) = index[name]
    want = ref.max_pool(xs[i], kwargs["window"], kwargs.get("strides"), kwargs.get("padding", "VALID"))
    assert outs[o].shape == want.shape
    np.testing.assert_array_equal(np.asarray(outs[o], np.float64), want)


def test_max_pool_integer_input():
    model = one_layer(ops.MaxPool((2, 2), strides=1, padding="SAME"), (("batch", 4, 4, 1), "int32"))
    params, state = model.init(jax.random.key(0))
    x = np.random.default_rng(0).integers(-100, 100, size=(2, 4, 4, 1)).astype(np.int32)
    out, _ = model.apply(params, state, x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, ref.max_pool(x, (2, 2), (1, 1), "SAME"))


# --- shape ops ----------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: ops.Flatten(), lambda: ops.flatten])
def test_flatten(make):
    model = one_layer(make(), (("batch", 2, 3, 4), "float32"))
    params, state = model.init(jax.random.key(0))
    x = ref.rand((5, 2, 3, 4))
    out, _ = model.apply(params, state, x)
    np.testing.assert_array_equal(out, x.reshape(5, 24))


@pytest.mark.parametrize("call, target", [
    (lambda x: ops.Reshape((4, -1))(x), (4, 6)),
    (lambda x: ops.reshape(x, (3, 2, 4)), (3, 2, 4)),
    (lambda x: ops.Reshape((24,))(x), (24,)),
])
def test_reshape(call, target):
    model = one_layer(call, (("batch", 2, 3, 4), "float32"))
    params, state = model.init(jax.random.key(0))
    for batch in (1, 3):
        x = ref.rand((batch, 2, 3, 4), seed=batch)
        out, _ = model.apply(params, state, x)
        np.testing.assert_array_equal(out, x.reshape((batch,) + target))


def test_concat_last_axis_functional():
    model = one_layer(lambda a, b, c: ops.concat([a, b, c]),
                      (("batch", 2), "float32"), (("batch", 3), "float32"), (("batch", 1), "float32"))
    params, state = model.init(jax.random.key(0))
    a, b, c = ref.rand((4, 2), 1), ref.rand((4, 3), 2), ref.rand((4, 1), 3)
    out, _ = model.apply(params, state, a, b, c)
    np.testing.assert_array_equal(out, np.concatenate([a, b, c], axis=-1))


def test_concat_layer_middle_axis():
    model = one_layer(lambda a, b: ops.Concat(axis=1, name="cat")(a, b),
                      (("batch", 2, 5), "float32"), (("batch", 4, 5), "float32"))
    params, state = model.init(jax.random.key(0))
    a, b = ref.rand((3, 2, 5), 1), ref.rand((3, 4, 5), 2)
    out, _ = model.apply(params, state, a, b)
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


def test_concat_symbolic_axis():
    model = one_layer(lambda a, b: ops.concat([a, b], axis=0),
                      (("batch", 3), "float32"), (("n", 3), "float32"))
    params, state = model.init(jax.random.key(0))
    a, b = ref.rand((2, 3), 1), ref.rand((5, 3), 2)
    out, _ = model.apply(params, state, a, b)
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=0))


# --- elementwise --------------------------------------------------------------------

BINARY = [
    ("add", ops.Add, ops.add, np.add),
    ("sub", ops.Sub, ops.sub, np.subtract),
    ("mul", ops.Mul, ops.mul, np.multiply),
]


BINARY_SHAPES = {
    "same": ((("batch", 4, 5), (3, 4, 5)), (("batch", 4, 5), (3, 4, 5))),
    "lower_rank": ((("batch", 4, 5), (3, 4, 5)), ((5,), (5,))),        # like a bias
    "outer": ((("batch", 1, 5), (3, 1, 5)), (("batch", 4, 1), (3, 4, 1))),   # both broadcast
}


@functools.lru_cache(maxsize=None)
def binary_family(op):
    name, cls, fn, _ = next(b for b in BINARY if b[0] == op)
    # The layer form and the functional form of each case, as two outputs.
    cases = {case: (lambda a, b, case=case: [cls(name=f"{name}_{case}")(a, b), fn(a, b)],
                    [(ga, "float32"), (gb, "float32")])
             for case, ((ga, _), (gb, _)) in BINARY_SHAPES.items()}
    model, params, state, index = family(cases)
    xs = [ref.rand(shape, seed=len(shape) + k) for k, ((_, sa), (_, sb)) in enumerate(BINARY_SHAPES.values())
          for shape in (sa, sb)]
    outs, _ = model.apply(params, state, *xs)
    return params, state, xs, outs, index


@pytest.mark.parametrize("op", [b[0] for b in BINARY])
@pytest.mark.parametrize("case", list(BINARY_SHAPES))
def test_binary(op, case):
    np_fn = next(b for b in BINARY if b[0] == op)[3]
    params, state, xs, outs, index = binary_family(op)
    assert params == {} and state == {}
    (ia, ib), (o_layer, o_fn) = index[case]
    want = np_fn(xs[ia].astype(np.float64), xs[ib].astype(np.float64))
    for out in (outs[o_layer], outs[o_fn]):
        assert out.shape == want.shape and out.dtype == np.float32
        close(out, want, rtol=1e-6, atol=1e-6)


# --- activations --------------------------------------------------------------------

ACTIVATIONS = {
    "relu": (ops.Relu, ops.relu, ref.relu),
    "gelu": (ops.Gelu, ops.gelu, ref.gelu),
    "gelu_tanh": (lambda **kw: ops.Gelu(approximate=True, **kw),
                  lambda x: ops.gelu(x, approximate=True), lambda x: ref.gelu(x, True)),
    "silu": (ops.Silu, ops.silu, ref.silu),
    "tanh": (ops.Tanh, ops.tanh, lambda x: np.tanh(np.asarray(x, np.float64))),
    "sigmoid": (ops.Sigmoid, ops.sigmoid, ref.sigmoid),
    "softmax": (ops.Softmax, ops.softmax, ref.softmax),
    "softmax_axis1": (lambda **kw: ops.Softmax(axis=1, **kw),
                      lambda x: ops.softmax(x, axis=1), lambda x: ref.softmax(x, axis=1)),
    "log_softmax": (ops.LogSoftmax, ops.log_softmax, ref.log_softmax),
    "log_softmax_axis1": (lambda **kw: ops.LogSoftmax(axis=1, **kw),
                          lambda x: ops.log_softmax(x, axis=1), lambda x: ref.log_softmax(x, axis=1)),
}


@functools.lru_cache(maxsize=None)
def activation_family():
    # The layer form and the functional form of every activation, as outputs of one graph.
    outputs = []

    def all_of_them(x):
        for name, (cls, fn, _) in ACTIVATIONS.items():
            outputs.append(name)
            yield cls(name=f"act_{name}")(x)
            yield fn(x)

    model, params, state, _ = family({"x": (lambda x: list(all_of_them(x)), [(("batch", 3, 7), "float32")])})
    x = ref.rand((4, 3, 7), seed=6) * 3.0
    outs, _ = model.apply(params, state, x)
    return params, state, x, {name: (outs[2 * k], outs[2 * k + 1]) for k, name in enumerate(outputs)}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation(name):
    params, state, x, outs = activation_family()
    assert params == {} and state == {}
    for out in outs[name]:
        assert out.dtype == np.float32 and out.shape == x.shape
        close(out, ACTIVATIONS[name][2](x))


# --- Cast ---------------------------------------------------------------------------


def test_cast_to_int32_truncates():
    model = one_layer(lambda x: ops.cast(x, "int32"), (("batch", 6), "float32"))
    params, state = model.init(jax.random.key(0))
    x = np.array([[-2.7, -0.5, 0.0, 0.5, 1.9, 3.2]], np.float32)
    out, _ = model.apply(params, state, x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, x.astype(np.int32))


def test_cast_int_to_float():
    model = one_layer(lambda x: ops.Cast("float32", name="to_f32")(x), (("batch", 3), "int32"))
    params, state = model.init(jax.random.key(0))
    x = np.array([[-3, 0, 7]], np.int32)
    out, _ = model.apply(params, state, x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float32))


def test_cast_to_bfloat16_rounds_like_ml_dtypes():
    policy = mg.Policy(compute_dtype="bfloat16")       # output stays bfloat16
    model = one_layer(lambda x: ops.cast(x, "bfloat16"), (("batch", 50), "float32"), policy=policy)
    params, state = model.init(jax.random.key(0))
    x = ref.rand((3, 50), seed=8) * 100
    out, _ = model.apply(params, state, x)
    assert out.dtype == BF16
    np.testing.assert_array_equal(np.asarray(out).view(np.uint16), x.astype(BF16).view(np.uint16))


def test_cast_float16_kept_without_policy_and_cast_back_under_a_float32_policy():
    x = ref.rand((2, 20), seed=3) * 1000
    # Without a policy no casts are inserted: the user's cast decides the output dtype.
    model = one_layer(lambda t: ops.cast(t, "float16"), (("batch", 20), "float32"))
    out, _ = model.apply({}, {}, x)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, x.astype(np.float16))
    # A float32 policy keeps the user's cast and casts the float output back.
    model = one_layer(lambda t: ops.cast(t, "float16"), (("batch", 20), "float32"),
                      policy=mg.Policy())
    out, _ = model.apply({}, {}, x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float16).astype(np.float32))


# --- F ------------------------------------------------------------------------------


def test_function_layer():
    def scaled_sin(x):
        return jnp.sin(x) * jnp.asarray(2.0, x.dtype)

    model = one_layer(ops.F(scaled_sin), (("batch", 5), "float32"))
    params, state = random_init(model)
    assert params == {} and state == {}
    x = ref.rand((3, 5), seed=1)
    out, _ = model.apply(params, state, x)
    close(out, 2.0 * np.sin(x.astype(np.float64)))


def test_function_layer_two_inputs_two_outputs():
    def both(a, b):
        return a @ b, jnp.sum(a, axis=-1)

    def call(a, b):
        p, s = ops.F(both, name="both")(a, b)
        return [p, s]

    model = one_layer(call, (("batch", 4), "float32"), ((4, 3), "float32"))
    params, state = model.init(jax.random.key(0))
    a, b = ref.rand((2, 4), 1), ref.rand((4, 3), 2)
    (prod, total), _ = model.apply(params, state, a, b)
    close(prod, a.astype(np.float64) @ b.astype(np.float64))
    close(total, a.astype(np.float64).sum(-1))


def test_function_layer_with_rng():
    seen = []

    def noisy(x, rng):
        seen.append(rng)
        if rng is None:
            return x
        bump = jax.random.key_data(rng).ravel()[0].astype(jnp.float32)   # depends on the key
        return x + bump

    model = one_layer(ops.F(noisy, needs_rng=True, name="noise"), (("batch", 6), "float32"))
    params, state = model.init(jax.random.key(0))
    x = ref.rand((2, 6), seed=1)
    seen.clear()
    out, _ = model.apply(params, state, x, inference_mode=True)
    np.testing.assert_array_equal(out, x)
    assert seen == [None]
    out1, _ = model.apply(params, state, x, rng=jax.random.key(1))
    out2, _ = model.apply(params, state, x, rng=jax.random.key(2))
    assert seen[1] is not None
    assert not np.array_equal(out1, out2)            # the key reaches the function
    with pytest.raises(mg.GraphError):
        model.apply(params, state, x)


# --- gradients (finite differences through model.apply) -----------------------------


def grad_check(call, graph_shape, shape, float64_layers=()):
    """``check_grads`` (order 1, reverse mode) through ``model.apply`` of a one-layer graph,
    with respect to its params and its input.

    The check compares the VJP with a central difference along one random direction. In
    float32 a step small enough for the difference to be accurate drowns in rounding, and
    one large enough does not see the function as linear (BatchNorm over a small batch):
    so the graph is built on a float64 input and compiled with a float64 policy, whose
    precision-sensitive layers (``float64_layers``) are overridden to float64 too."""
    with jax.enable_x64(True):
        policy = mg.Policy(param_dtype="float64", compute_dtype="float64",
                           overrides={name: "float64" for name in float64_layers})
        model = one_layer(call, (graph_shape, "float64"), policy=policy)
        params, state = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), random_init(model, seed=1))
        x = jnp.asarray(ref.rand(shape, seed=2), jnp.float64)

        flat, unravel = ravel_pytree((params, x))     # one array: fewer eager ops in check_grads

        @jax.jit
        def f(flat):
            p, xs = unravel(flat)
            out, _ = model.apply(p, state, xs)
            assert out.dtype == jnp.float64
            return out

        check_grads(f, (flat,), order=1, modes=["rev"], eps=1e-6)


def test_grad_linear():
    grad_check(ops.Linear(3, name="fc"), ("batch", 4), (2, 4))


def test_grad_conv():
    conv = ops.Conv(4, (2, 3), strides=(2, 1), padding="SAME", groups=2, dilation=(1, 2),
                    data_format="NCHW", name="conv")
    grad_check(conv, ("batch", 4, 5, 5), (2, 4, 5, 5))


def test_grad_max_pool():
    # Reverse mode through MaxPool under jit (model.apply): any CNN with pooling needs it.
    # Random inputs: no ties within a window.
    grad_check(ops.MaxPool((3, 3), strides=(2, 2), padding="SAME", name="pool"),
               ("batch", 5, 5, 2), (2, 5, 5, 2))


def test_grad_batch_norm_training():
    grad_check(ops.BatchNorm(name="bn"), ("batch", 3, 4), (5, 3, 4), float64_layers=("bn",))


def test_grad_composite():
    def net(x):
        h = ops.BatchNorm(name="bn")(ops.gelu(ops.Linear(6, name="fc1")(x)))
        h = ops.concat([ops.tanh(h), ops.mul(h, h)])
        return ops.LogSoftmax(name="log_softmax")(ops.Linear(3, name="fc2")(h))

    grad_check(net, ("batch", 4), (6, 4), float64_layers=("bn", "log_softmax"))


# --- the dtype guarantee in bfloat16 ------------------------------------------------


def _all_eqns(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (pjit, custom_jvp...) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for inner in (param if isinstance(param, (tuple, list)) else (param,)):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def _float32_outputs(jaxpr):
    """Primitive names of the equations (sub-jaxprs included) with a float32 output."""
    return [eqn.primitive.name for eqn in _all_eqns(jaxpr)
            if any(getattr(v.aval, "dtype", None) == np.float32 for v in eqn.outvars)]


def _bf16_reference(name, params, state, x, training):
    p = {k: np.asarray(v, np.float64) for k, v in params.get("layer", {}).items()}
    if name == "linear":
        return x @ p["kernel"] + p["bias"]
    if name == "conv_nhwc":
        return ref.conv(x, p["kernel"], p["bias"], padding="SAME")
    if name == "conv_ncw":
        return ref.conv(x, p["kernel"], p["bias"], strides=(2,), channels_last=False)
    y, _, _ = ref.batch_norm(x, p["scale"], p["bias"], state["layer"]["mean"], state["layer"]["var"],
                             momentum=0.9, epsilon=1e-5, training=training)
    return y


BF16_LAYERS = {
    "linear": (lambda: ops.Linear(5, name="layer"), ("batch", 3, 4), (2, 3, 4)),
    "conv_nhwc": (lambda: ops.Conv(4, (3, 3), padding="SAME", name="layer"), ("batch", 5, 5, 3), (2, 5, 5, 3)),
    "conv_ncw": (lambda: ops.Conv(4, (3,), strides=2, data_format="NCHW", name="layer"), ("batch", 2, 9), (2, 2, 9)),
    "batch_norm": (lambda: ops.BatchNorm(name="layer"), ("batch", 3, 4), (8, 3, 4)),
}


@pytest.mark.parametrize("name, inference_mode", [
    ("linear", False), ("conv_nhwc", False), ("conv_ncw", False),
    ("batch_norm", False), ("batch_norm", True),
])
def test_bfloat16_dtype_guarantee(name, inference_mode):
    make, graph_shape, shape = BF16_LAYERS[name]
    # compute dtype bfloat16; the override makes BatchNorm (precision-sensitive) compute in
    # its input dtype too, so this tests the layer's own guarantee, not the policy's casts.
    policy = mg.Policy(compute_dtype="bfloat16", overrides={"layer": "bfloat16"})
    model = one_layer(make(), (graph_shape, "bfloat16"), policy=policy)
    assert not [n for n in model.graph.nodes if n.op.op_name == "cast"]
    shaped = jax.eval_shape(model.init, jax.random.key(0))
    assert all(p.dtype == np.float32 for p in jax.tree.leaves(shaped))
    params, state = random_init(model, seed=1)
    x = ref.rand(shape, seed=3).astype(BF16)
    out, new_state = model.apply(params, state, x, inference_mode=inference_mode)
    assert out.dtype == BF16
    assert jax.tree.map(lambda a: a.dtype, new_state) == jax.tree.map(lambda a: a.dtype, state)

    # Loosely the exact numbers (bfloat16 keeps 8 significant bits).
    want = _bf16_reference(name, params, state, x.astype(np.float64), not inference_mode)
    close(np.asarray(out, np.float32), want, rtol=5e-2, atol=5e-2)

    # No float32 leaks: the layer's math runs in bfloat16. The only float32 values are the
    # float32 weights being read and, in training, the float32 state update (and jnp.mean's
    # internal float32 accumulation of bfloat16 sums, which JAX does on purpose).
    jaxpr = jax.make_jaxpr(lambda p, s, xs: model.apply_fn(p, s, xs, inference_mode=inference_mode))(
        params, state, x).jaxpr
    f32 = _float32_outputs(jaxpr)
    if name == "batch_norm" and not inference_mode:
        assert set(f32) <= {"convert_element_type", "reduce_sum", "div", "mul", "add"}, f32
    else:
        assert f32 == [], f32
    for eqn in _all_eqns(jaxpr):
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            assert all(v.aval.dtype == BF16 for v in eqn.invars + eqn.outvars)


def test_bfloat16_policy_runs_batch_norm_in_float32():
    # Under a bfloat16 policy a precision-sensitive layer gets explicit casts around it.
    policy = mg.Policy(compute_dtype="bfloat16")
    model = one_layer(lambda x: ops.BatchNorm(name="bn")(ops.Linear(4, name="fc")(x)),
                      (("batch", 3), "bfloat16"), policy=policy)
    by_name = {n.name: n for n in model.graph.nodes}
    assert by_name["fc"].outputs[0].dtype == BF16
    assert by_name["bn"].outputs[0].dtype == np.float32
    params, state = random_init(model)
    out, new_state = model.apply(params, state, ref.rand((6, 3)).astype(BF16))
    assert out.dtype == BF16
    assert new_state["bn"]["mean"].dtype == np.float32
