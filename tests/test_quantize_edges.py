"""Quantized models at the edges of the other features: compiled with a mesh (the
attention's matrices and the int8 layers' extra outputs named for sharding), a
Linear's accumulation dtype, and quantize_weights's bad input (non-array weights,
calibration batches that nothing would read)."""

import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.core.axes import weight_axes

LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2}


def np_int8_columns(w):
    """int8 values and per-column scale of absmax over the rows of a (in, out) matrix."""
    amax = np.abs(w).max(axis=0)
    s = np.where(amax == 0, np.float32(1), amax * np.float32(1 / 127)).astype(np.float32)
    return np.clip(np.round(w / s), -127, 127).astype(np.int8), s


@pytest.fixture(scope="module")
def llama():
    g = mg.models.llama(LLAMA)
    params, state = mg.compile(g).init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)
    return g, params, state, ids


@pytest.mark.parametrize("scheme", ["int8", "int8_weight_only", "int4_weight_only"])
def test_a_quantized_llama_compiles_with_a_mesh_and_gives_the_unsharded_numbers(llama, scheme):
    """Llama's attention names its key and value kernels ``(d, kv_heads, head_dim)``
    by ``param_axes``; the quantized layer's kernels are matrices, so the override
    names their two dims (the merged columns by the heads' name), and the int8
    layers' accumulator, scales and bias outputs each get names."""
    g, params, state, ids = llama
    qg = mg.quantize(g, scheme, **({"group_size": 8} if scheme.startswith("int4") else {}))
    qp, qs = mg.quantize_weights(qg, params, state)
    mesh = jax.make_mesh((1,), ("model",))
    sharded = mg.compile(qg, mesh=mesh, rules={"mlp": "model", "kv_heads": "model"})
    sp, ss = sharded.init(jax.random.key(0), reuse=(qp, qs))
    out, _ = sharded.apply(sp, ss, ids, inference_mode=True)
    ref, _ = mg.compile(qg).apply(qp, qs, ids, inference_mode=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    block = qg.node("model.layers.0").op.subgraph()
    attention = block.node("self_attn")
    axes, _ = weight_axes(attention.op, block.input_specs_of(attention))
    assert axes["key/kernel"][1] == ("embed", "kv_heads")
    assert axes["value/kernel"][1] == ("embed", "kv_heads")
    assert axes["key/kernel_scale"][1][-1] == "kv_heads"   # the columns' scales follow
    down = block.node("mlp.down_proj")   # ROW_PARALLEL: kernel ("mlp", "embed")
    axes, _ = weight_axes(down.op, block.input_specs_of(down))
    assert axes["kernel_scale"][1][-1] == axes["kernel"][1][-1] == "embed"


def test_the_quantized_decoder_cache_keeps_the_kv_heads_name():
    cached = ops.QuantizedCachedAttention(
        4, 8, 32, max_length=16, batch=2, num_kv_heads=2, scheme="int8",
        param_axes={"key/kernel": ("embed", "kv_heads"), "value/kernel": ("embed", "kv_heads")})
    x = mg.Input((2, "seq", 32))
    specs = cached.state_specs([x, mg.Input((2, "seq"), "int32")])
    assert specs["key"].axes == ("batch", "cache_length", "kv_heads", "kv")


def test_a_weight_only_linear_accumulates_in_its_preferred_dtype():
    """``preferred_element_type=float32`` on a bfloat16 Linear: the quantized layer's
    product accumulates in float32 as the float layer's does (not in bfloat16)."""
    x = mg.Input(("batch", 64), dtype="bfloat16", name="x")
    g = mg.Graph(x, ops.Linear(16, preferred_element_type="float32", name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (4, 64)).astype(jnp.bfloat16)
    qg = mg.quantize(g, "int8_weight_only")
    qp, qs = mg.quantize_weights(qg, params, state)
    model = mg.compile(qg)
    jaxpr = jax.make_jaxpr(lambda p, s, v: model.apply(p, s, v, inference_mode=True))(qp, qs, xs)
    dots = re.findall(r"(\w+)\[[\d,]*\] = dot_general", str(jaxpr))
    assert dots == ["f32"]
    out, _ = model.apply(qp, qs, xs, inference_mode=True)
    q, s = np_int8_columns(np.asarray(params["fc"]["kernel"], np.float32))
    ref = (np.asarray(xs, np.float32) @ q.astype(np.float32)) * s \
        + np.asarray(params["fc"]["bias"], np.float32)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32),
                               ref.astype(ml_dtypes.bfloat16).astype(np.float32),
                               rtol=2 ** -7, atol=1e-6)


def test_calibration_that_nothing_reads_is_refused():
    x = mg.Input(("batch", 8), name="x")
    g = mg.Graph(x, ops.Linear(4, name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    batch = [jnp.ones((2, 8))]
    for scheme in ("int8", "int8_weight_only"):
        qg = mg.quantize(g, scheme)
        with pytest.raises(mg.ConfigError, match="would be ignored"):
            mg.quantize_weights(qg, params, state, calibration=batch, static_scales=False)


@pytest.mark.parametrize("layer,weight", [("fc", "kernel"), ("fc", "bias"), ("ln", "scale")])
def test_weights_that_are_not_arrays_are_named(layer, weight):
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.LayerNorm(name="ln")(ops.Linear(2, name="fc")(x)))
    params, state = mg.compile(g).init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    bad = {name: dict(group) for name, group in params.items()}
    bad[layer][weight] = np.asarray(bad[layer][weight]).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(mg.GraphError, match=f"'{layer}/{weight}'.*a list, not an array"):
            mg.quantize_weights(qg, bad, state)
