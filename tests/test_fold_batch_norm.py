"""``mg.fold_batch_norm``: BatchNorm folded into the Conv, ConvTranspose or Linear before
it, checked against NumPy references of the layer followed by batch normalization at
inference (float64), on the zoo's ResNet-18, with scanned runs, and the BatchNorms it
keeps and the bad input it refuses."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ir.surgery import layer_paths

EPS32 = float(np.finfo(np.float32).eps)


# --- NumPy references (float64) --------------------------------------------------------


def np_conv_nhwc(x, w, stride, pads, groups):
    """``x (N, H, W, C)``, ``w (O, kh, kw, C // groups)`` (OHWI), explicit padding."""
    x = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    n, h, wd, _ = x.shape
    o, kh, kw, cg = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    og = o // groups
    out = np.zeros((n, oh, ow, o))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = x[:, i:i + stride * oh:stride, j:j + stride * ow:stride, g * cg:(g + 1) * cg]
                out[..., g * og:(g + 1) * og] += patch @ w[g * og:(g + 1) * og, i, j, :].T
    return out


def np_conv_transpose_nhwc(x, w, stride):
    """Each input position scatters ``w[:, i, j, :] @ x`` to ``stride * position + (i,
    j)`` ("VALID"); ``w (O, kh, kw, C)``."""
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    out = np.zeros((n, (h - 1) * stride + kh, (wd - 1) * stride + kw, o))
    for i in range(kh):
        for j in range(kw):
            out[:, i:i + stride * h:stride, j:j + stride * wd:stride, :] += x @ w[:, i, j, :].T
    return out


def np_batch_norm(y, scale, bias, mean, var, epsilon, axis):
    shape = [1] * y.ndim
    shape[axis] = -1
    r = lambda v: np.asarray(v, np.float64).reshape(shape)  # noqa: E731
    return (y - r(mean)) / np.sqrt(r(var) + epsilon) * r(scale) + r(bias)


def _assert_same_outputs(unfolded, folded, xs):
    """The folded model's inference outputs equal the unfolded one's, within float32
    rounding (1e-5 of the outputs' scale)."""
    want, _ = mg.compile(unfolded[0]).apply(*unfolded[1:], xs, inference_mode=True)
    got, _ = mg.compile(folded[0]).apply(*folded[1:], xs, inference_mode=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                               atol=1e-5 * float(jnp.abs(want).max()))


def _random_weights(model, seed):
    """Params as init draws them, but BatchNorm scale in [0.5, 1.5] and biases normal;
    running mean normal, running variance in [0.2, 2]: every term of the fold matters."""
    params, state = model.init(jax.random.key(seed))
    rng = np.random.default_rng(seed)

    def draw(path, w):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']") or name.endswith("['var']"):
            low, high = (0.5, 1.5) if name.endswith("['scale']") else (0.2, 2.0)
            return jnp.asarray(rng.uniform(low, high, w.shape), w.dtype)
        if name.endswith("['bias']") or name.endswith("['mean']"):
            return jnp.asarray(rng.normal(0.0, 0.5, w.shape), w.dtype)
        return w

    return (jax.tree_util.tree_map_with_path(draw, params),
            jax.tree_util.tree_map_with_path(draw, state))


def _check(y, ref, magnitude, fan_in):
    """``y`` (float32) within the forward error of a float32 sum of ``fan_in``
    products plus the folded bias: ``(fan_in + 4) eps`` times ``magnitude``, the same
    reference over absolute values."""
    bound = (fan_in + 4) * EPS32 * magnitude
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert np.all(err <= bound), (err.max(), bound.max())
    assert np.abs(ref).max() > 10 * bound.max()   # the check is not vacuous


# --- the fold against NumPy ------------------------------------------------------------

CASES = {
    # name: (input shape, layer, BatchNorm axis)
    "conv NHWC, groups 2, bias, stride 2": (
        (2, 9, 9, 4), ops.Conv(6, (3, 3), strides=2, padding=((1, 1), (1, 1)), groups=2,
                               name="layer"), -1),
    "conv NCHW, no bias": (
        (2, 4, 7, 7), ops.Conv(5, (3, 3), padding=((1, 1), (0, 0)), use_bias=False,
                               data_format="NCHW", name="layer"), 1),
    "conv_transpose NHWC, stride 2": (
        (2, 4, 4, 3), ops.ConvTranspose(5, (3, 3), strides=2, name="layer"), -1),
    "linear": ((6, 12), ops.Linear(7, name="layer"), -1),
    "linear, rank 3, no bias": ((2, 3, 12), ops.Linear(7, use_bias=False, name="layer"), -1),
}


def _reference(case, x, w, b):
    """The layer's output (float64) for input ``x``, kernel ``w``, bias ``b`` (or None)."""
    shape, layer, _ = CASES[case]
    if isinstance(layer, ops.ConvTranspose):
        y = np_conv_transpose_nhwc(x, w, 2)
    elif isinstance(layer, ops.Conv):
        pads = layer.padding
        if layer.data_format == "NCHW":
            y = np_conv_nhwc(x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), layer.strides[0],
                             pads, layer.groups).transpose(0, 3, 1, 2)
        else:
            y = np_conv_nhwc(x, w, layer.strides[0], pads, layer.groups)
    else:
        y = x @ w
    if b is not None:
        axis = 1 if getattr(layer, "data_format", "NHWC") == "NCHW" else -1
        shape = [1] * y.ndim
        shape[axis] = -1
        y = y + b.reshape(shape)
    return y


@pytest.mark.parametrize("case", sorted(CASES))
def test_folded_layer_equals_layer_then_batch_norm_in_numpy(case):
    shape, layer, axis = CASES[case]
    x = mg.Input(("batch",) + shape[1:], name="x")
    g = mg.Graph(x, ops.BatchNorm(axis=axis, epsilon=1e-3, name="bn")(layer(x)))
    params, state = _random_weights(mg.compile(g), 0)
    folded, fparams, fstate = mg.fold_batch_norm(g, params, state)

    assert [n.name for n in folded.nodes] == ["x", "layer"]
    assert folded.node("layer").op.use_bias
    assert fstate == {} and sorted(fparams) == ["layer"]
    assert sorted(fparams["layer"]) == ["bias", "kernel"]
    assert fparams["layer"]["kernel"].dtype == jnp.float32

    xs = np.asarray(jax.random.normal(jax.random.key(3), shape), np.float32)
    out, _ = mg.compile(folded).apply(fparams, fstate, xs, inference_mode=True)
    w = np.asarray(params["layer"]["kernel"], np.float64)
    b = params["layer"].get("bias")
    b = None if b is None else np.asarray(b, np.float64)
    bn, stats = params["bn"], state["bn"]
    ref = np_batch_norm(_reference(case, xs.astype(np.float64), w, b), bn["scale"], bn["bias"],
                        stats["mean"], stats["var"], 1e-3, axis)
    # The magnitude: the layer over |x| and |W s|, plus |b - mean| |s| and |bias|.
    s = np.asarray(bn["scale"], np.float64) / np.sqrt(np.asarray(stats["var"], np.float64) + 1e-3)
    kshape = [1] * w.ndim
    kshape[-1 if isinstance(layer, ops.Linear) else 0] = -1
    extra = np.abs((0 if b is None else b) - np.asarray(stats["mean"])) * s + np.abs(bn["bias"])
    magnitude = _reference(case, np.abs(xs.astype(np.float64)), np.abs(w * s.reshape(kshape)), extra)
    fan_in = int(np.prod(w.shape)) // w.shape[kshape.index(-1)]
    _check(out, ref, magnitude, fan_in)
    # The unfolded model agrees with the same reference (the test's reference is right).
    plain, _ = mg.compile(g).apply(params, state, xs, inference_mode=True)
    _check(plain, ref, magnitude, fan_in + 4)


def test_batch_norm_without_scale_or_bias_and_a_float16_layer():
    x = mg.Input(("batch", 10), name="x")
    h = ops.Linear(4, name="fc")(x)
    g = mg.Graph(x, ops.BatchNorm(use_scale=False, use_bias=False, name="bn")(h))
    params, state = _random_weights(mg.compile(g), 1)
    assert "bn" not in params   # no weights of its own: only the statistics
    half = jax.tree.map(lambda w: w.astype(jnp.float16), params)
    folded, fparams, fstate = mg.fold_batch_norm(g, half, state)
    assert fparams["fc"]["kernel"].dtype == jnp.float16 and fparams["fc"]["bias"].dtype == jnp.float16
    w = np.asarray(half["fc"]["kernel"], np.float64)
    b = np.asarray(half["fc"]["bias"], np.float64)
    s = 1 / np.sqrt(np.asarray(state["bn"]["var"], np.float64) + 1e-5)
    eps16 = float(np.finfo(np.float16).eps)
    np.testing.assert_allclose(np.asarray(fparams["fc"]["kernel"], np.float64), w * s,
                               rtol=eps16 / 2, atol=0)   # one rounding to float16
    np.testing.assert_allclose(np.asarray(fparams["fc"]["bias"], np.float64),
                               (b - np.asarray(state["bn"]["mean"], np.float64)) * s,
                               rtol=eps16 / 2, atol=0)


# --- the zoo's ResNet-18, blocks and scans ---------------------------------------------


@pytest.fixture(scope="module")
def resnet():
    g = mg.models.resnet18(num_classes=10, image_size=32, width=8)
    params, state = _random_weights(mg.compile(g), 0)
    images = jax.random.normal(jax.random.key(5), (2, 32, 32, 3))
    return g, params, state, images


def test_resnet18_folded_logits_equal_the_unfolded(resnet):
    g, params, state, images = resnet
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every BatchNorm of the ResNet folds
        folded, fparams, fstate = mg.fold_batch_norm(g, params, state)
    before, after = dict(layer_paths(g)), dict(layer_paths(folded))
    norms = [p for p, n in before.items() if n.op.op_name == "batch_norm"]
    assert len(norms) == 20 and len(after) == len(before) - 20
    assert not [p for p, n in after.items() if n.op.op_name == "batch_norm"]
    assert fstate == {}
    assert sorted(fparams["layer2.0"]) == ["conv1", "conv2", "downsample.0"]
    assert folded.node("layer1.0").op.subgraph().node("conv1").op.use_bias
    # The folded params are what init gives the folded graph, shapes and all.
    fresh, fresh_state = mg.compile(folded).init(jax.random.key(1))
    assert jax.tree.map(jnp.shape, fparams) == jax.tree.map(jnp.shape, fresh) and fresh_state == {}
    # Equal blocks stay equal (so they still scan together).
    assert folded.node("layer1.0").op.subgraph() == folded.node("layer1.1").op.subgraph()
    want, _ = mg.compile(g).apply(params, state, images, inference_mode=True)
    got, _ = mg.compile(folded).apply(fparams, fstate, images, inference_mode=True)
    # Float32 rounding of 18 layers in two orders: within 1e-5 of the logits' scale
    # (measured 2e-7 of it).
    scale = float(jnp.abs(want).max())
    assert scale > 0.1
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * scale)
    again = mg.fold_batch_norm(g, params, state)[0]
    assert again is folded   # the rewrite is memoised on the graph


def test_scanned_params_are_refused_then_folded_unstacked_and_stacked_again(resnet):
    g, params, state, images = resnet
    scanned = mg.compile(g, scan_blocks="always")
    sparams, sstate = scanned.stack_weights(params, state)
    assert "layer1.0..layer1.1" in sparams
    with pytest.raises(mg.GraphError, match=r"scanned model's, stacked under "
                                            r"'layer1.0..layer1.1'.*unstack_weights"):
        mg.fold_batch_norm(g, sparams, sstate)
    unstacked = scanned.unstack_weights(sparams, sstate)
    folded, fparams, fstate = mg.fold_batch_norm(g, *unstacked)
    # The compiled model's graph (its runs folded into scans) folds to the same graph.
    assert mg.fold_batch_norm(scanned.graph, *unstacked)[0] == folded
    again = mg.compile(folded, scan_blocks="always")
    stacked, stacked_state = again.stack_weights(fparams, fstate)
    assert "layer1.0..layer1.1" in stacked and stacked_state == {}
    want, _ = scanned.apply(sparams, sstate, images, inference_mode=True)
    got, _ = again.apply(stacked, stacked_state, images, inference_mode=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                               atol=1e-5 * float(jnp.abs(want).max()))


def test_a_block_called_twice_with_shared_weights_folds_once():
    x = mg.Input(("batch", 6, 6, 4), name="x")
    inner = mg.Graph(x, ops.relu(ops.BatchNorm(name="bn")(
        ops.Conv(4, (3, 3), padding=((1, 1), (1, 1)), name="conv")(x))), name="blk")
    block = inner.as_block("b")
    g = mg.Graph(x, block(block(x)))
    params, state = _random_weights(mg.compile(g), 2)
    folded, fparams, fstate = mg.fold_batch_norm(g, params, state)
    assert sorted(fparams) == ["b"] and sorted(fparams["b"]) == ["conv"] and fstate == {}
    _assert_same_outputs((g, params, state), (folded, fparams, fstate),
                         jax.random.normal(jax.random.key(3), (2, 6, 6, 4)))


# --- what stays, and bad input -----------------------------------------------------------


def _kept_graph():
    """One BatchNorm that folds and six that cannot."""
    x = mg.Input(("batch", 6, 6, 4), name="x")
    conv = ops.Conv(4, (1, 1), name="shared")
    a = ops.BatchNorm(name="bn_input")(x)                                   # a graph input
    b = ops.BatchNorm(name="bn_sum")(a + x)                                 # a sum
    c = ops.BatchNorm(name="bn_act")(ops.Conv(4, (1, 1), activation="relu", name="act")(b))
    d = ops.Conv(4, (1, 1), name="twice")(c)
    e = ops.BatchNorm(name="bn_twice")(d) + d                               # read twice
    f = ops.BatchNorm(name="bn_shared")(conv(e)) + conv(x)                  # shared weights
    t = ops.Linear(4, name="fc")(ops.transpose(f, (0, 3, 1, 2)))            # (b, 4, 6, 4)
    h = ops.BatchNorm(axis=1, name="bn_axis")(t)                            # axis 1 is not fc's
    y = ops.BatchNorm(name="bn_ok")(ops.Conv(4, (1, 1), name="ok")(h))
    return mg.Graph(x, y)


def test_batch_norms_that_cannot_fold_stay_and_are_listed_with_the_reason():
    g = _kept_graph()
    params, state = _random_weights(mg.compile(g), 4)
    with pytest.warns(mg.FoldWarning) as caught:
        folded, fparams, fstate = mg.fold_batch_norm(g, params, state)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert text.startswith("fold_batch_norm kept 6 BatchNorms it cannot fold: ")
    for part in ("bn_input (it reads the graph's input 'x', not a layer's output)",
                 "bn_sum (it reads add 'add', not a Conv, ConvTranspose or Linear)",
                 "bn_act (conv 'act' applies 'relu' before it)",
                 "bn_twice (the output of conv 'twice' is read by 'add_1' too)",
                 "bn_shared (the weights of conv 'shared' are used by another call too)",
                 "bn_axis (it normalizes axis 1, and the channels of linear 'fc' are axis 3)"):
        assert part in text, (part, text)
    assert "bn_ok" not in folded and "bn_ok" not in fparams and "bn_ok" not in fstate
    assert sorted(fstate) == ["bn_act", "bn_axis", "bn_input", "bn_shared", "bn_sum", "bn_twice"]
    _assert_same_outputs((g, params, state), (folded, fparams, fstate),
                         jax.random.normal(jax.random.key(3), (2, 6, 6, 4)))


def test_nothing_to_fold_gives_the_graph_back():
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.Linear(3, name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no BatchNorm: no warning
        same, p2, s2 = mg.fold_batch_norm(g, params, state)
    assert same is g and p2 == params and s2 == state == {}
    # Only BatchNorms that cannot fold: the graph back, and the warning.
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.BatchNorm(name="bn")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    with pytest.warns(mg.FoldWarning, match="kept 1 BatchNorm it cannot fold: bn "):
        same, _, s2 = mg.fold_batch_norm(g, params, state)
    assert same is g and sorted(s2) == ["bn"]
    # after a quantized layer: fold the float graph first, then quantize
    x = mg.Input(("batch", 6, 6, 3), name="x")
    g = mg.Graph(x, ops.BatchNorm(name="bn")(ops.Conv(4, (3, 3), use_bias=False, name="conv")(x)))
    params, state = mg.compile(g).init(jax.random.key(0))
    for scheme, reads in (("int8", "dequantize 'conv.dequantize'"), ("int8_weight_only",
                                                                    "quantized_conv 'conv'")):
        qg = mg.quantize(g, scheme)
        with pytest.warns(mg.FoldWarning, match=f"bn \\(it reads {reads}, a quantized layer's: "
                                                f"fold the float graph, then quantize"):
            mg.fold_batch_norm(qg, *mg.quantize_weights(qg, params, state))


def test_bad_input_is_a_graph_error_naming_the_layer(resnet):
    g, params, state, _ = resnet
    with pytest.raises(mg.GraphError, match="fold_batch_norm works on a Graph, got dict"):
        mg.fold_batch_norm({}, params, state)
    with pytest.raises(mg.GraphError, match="takes state .* got NoneType"):
        mg.fold_batch_norm(g, params, None)
    wider = dict(params, conv1={"kernel": jnp.zeros((16, 7, 7, 3))})   # another graph's
    with pytest.raises(mg.GraphError, match=r"params conv1/kernel has shape \(16, 7, 7, 3\), "
                                            r"and the graph makes \(8, 7, 7, 3\): these weights "
                                            r"are another graph's"):
        mg.fold_batch_norm(g, wider, state)
    no_stats = dict(state, **{"layer2.1": {"bn1": state["layer2.1"]["bn1"]}})
    with pytest.raises(mg.GraphError, match=r"state has no entry for layer 'layer2.1/bn2'; "
                                            r"give the graph's own params and state"):
        mg.fold_batch_norm(g, params, no_stats)
    no_block = {k: v for k, v in params.items() if k != "layer3.0"}
    with pytest.raises(mg.GraphError, match="params have no entry for block 'layer3.0'"):
        mg.fold_batch_norm(g, no_block, state)
    no_scale = dict(params, bn1={"bias": params["bn1"]["bias"]})
    with pytest.raises(mg.GraphError, match="params of layer 'bn1' have no 'scale'"):
        mg.fold_batch_norm(g, no_scale, state)
