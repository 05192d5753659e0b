"""The per-layer cost table: the ops' FLOP rules against XLA's cost analysis of the
unoptimized lowering (CPU), and against counts written out by hand in the test.

XLA's count of a layer is read from ``jax.jit(...).lower(...).cost_analysis()`` of
code written here (plain ``jax.lax``/``jnp``), or of the layer's own apply where the
test says so. Layers whose rule and XLA's number cannot agree are named with the
reason:

- dropout in training: XLA counts the integer ops that hash the random bits
  (threefry), which the rule leaves out;
- LSTM and GRU: XLA counts the body of the scan's while loop once, not per step; the
  test checks the rule against an unrolled loop instead;
- exact GELU: XLA expands erfc into polynomials (about 60 flops per element).
"""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import lstm_classifier, mlp, residual_cnn
from mlaxgraph.ops.flops import window_taps
from mlaxgraph.core.specs import bind_dims


def xla_flops(fn, *args) -> int:
    """XLA's flop count of ``fn`` lowered (not optimized) for ``args``."""
    analysis = jax.jit(fn).lower(*args).cost_analysis()
    return int(analysis.get("flops", 0.0))


def plain_cnn() -> mg.Graph:
    """conv-relu-pool twice, then a classifier: a CNN without blocks or dropout."""
    x = mg.Input(("batch", 28, 28, 1), name="image")
    h = ops.MaxPool((2, 2))(ops.relu(ops.Conv(8, (3, 3), padding="SAME", name="conv1")(x)))
    h = ops.MaxPool((2, 2))(ops.relu(ops.Conv(16, (3, 3), strides=2, name="conv2")(h)))
    return mg.Graph(x, ops.Linear(10, name="logits")(ops.Flatten()(h)), name="plain_cnn")


MODELS = {"mlp": mlp, "residual_cnn": residual_cnn, "plain_cnn": plain_cnn}
POLICIES = {"float32": None,
            "bfloat16": mg.Policy(compute_dtype="bfloat16", output_dtype="float32")}


# --- the whole model against XLA ------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_forward_flops_match_xla_unoptimized_cost_in_inference(name, policy):
    model = mg.compile(MODELS[name](), POLICIES[policy])
    for batch in (1, 8):
        table = model.cost_table(batch=batch, inference_mode=True)
        lowered = model.apply.lower(*_abstract(model, batch), inference_mode=True)
        xla = lowered.cost_analysis()["flops"]
        assert table.flops == pytest.approx(xla, rel=0.05), str(table)
        assert table.xla_total == int(xla)
        for row in table:
            assert row.xla_flops is not None, row
            assert row.flops == pytest.approx(row.xla_flops, rel=0.05), row


@pytest.mark.parametrize("name", MODELS)
def test_forward_flops_match_xla_per_layer_in_training(name):
    """In training every layer agrees with XLA's count of it but dropout, whose note says
    why; without dropout the whole apply agrees too."""
    model = mg.compile(MODELS[name]())
    table = model.cost_table(batch=8)
    for row in table:
        if row.op == "dropout":
            assert row.xla_flops is None and "threefry" in row.note
            continue
        assert row.flops == pytest.approx(row.xla_flops, rel=0.05), row
    if not any(row.op == "dropout" and row.flops for row in table):
        assert table.flops == pytest.approx(table.xla_total, rel=0.05)
    else:
        assert "not comparable" in table.xla_total_note


@pytest.mark.parametrize("name", ["mlp", "plain_cnn"])
def test_forward_backward_flops_match_xla_count_of_the_gradient(name):
    """The backward estimate (forward once per input gradient, once more for weight
    gradients, no input gradient where only data flows in) against XLA's count of
    ``jax.value_and_grad`` of the summed outputs."""
    model = mg.compile(MODELS[name]())
    table = model.cost_table(batch=8, xla=False)
    params, state, x = _abstract(model, 8)

    def loss(params, state, x):
        out, _ = model.apply_fn(params, state, x)
        return jnp.sum(out)

    counted = xla_flops(jax.value_and_grad(loss), params, state, x)
    assert table.training_flops == pytest.approx(counted, rel=0.05)


def test_dropout_in_training_is_where_xla_counts_the_random_bits():
    x = mg.Input(("batch", 256))
    model = mg.compile(mg.Graph(x, ops.Dropout(0.1, name="drop")(x)))
    (row,) = model.cost_table(batch=8)
    assert row.flops == 3 * 8 * 256  # compare, divide, select
    assert row.note.startswith("XLA n/a")
    # What XLA would have printed: the hashing of the bits dwarfs the dropout itself.
    counted = xla_flops(lambda key, v: jnp.where(jax.random.bernoulli(key, 0.9, v.shape),
                                                 v / 0.9, 0.0),
                        jax.random.key(0), jnp.zeros((8, 256)))
    assert counted > 2 * row.flops


def _abstract(model, batch):
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    inputs = [s.bind({"batch": batch}) for s in model.graph.input_specs]
    return (params, state, *inputs)


# --- formulas and numbers written out by hand -------------------------------------------


def test_mlp_formulas_are_those_of_the_layer_sizes():
    table = mg.compile(mlp()).cost_table(batch=8, xla=False)
    dense, relu, dense_1, relu_1, logits = table.rows
    assert str(dense.flops_formula) == f"{2 * 784 * 128 + 128}*batch"
    assert str(relu.flops_formula) == "128*batch"
    assert str(logits.flops_formula) == f"{2 * 64 * 10 + 10}*batch"
    assert dense.params == 784 * 128 + 128 and logits.params == 64 * 10 + 10
    assert dense.activation_bytes == 8 * 128 * 4
    total = (2 * 784 * 128 + 128) + 128 + (2 * 128 * 64 + 64) + 64 + (2 * 64 * 10 + 10)
    assert str(table.flops_formula) == f"{total}*batch"
    assert table.flops == 8 * total
    # forward + backward: a linear layer 3x (input and weight gradients), relu 2x; the
    # first layer reads the data, which needs no gradient: 2x.
    assert dense.training_flops == 2 * dense.flops
    assert dense_1.training_flops == 3 * dense_1.flops and relu.training_flops == 2 * relu.flops
    assert table.params == sum(r.params for r in table)


def test_formula_evaluates_to_the_rule_at_any_batch():
    model = mg.compile(residual_cnn())
    eight = model.cost_table(batch=8, xla=False)
    for batch in (1, 3, 64):
        other = model.cost_table(batch=batch, xla=False)
        for a, b in zip(eight, other):
            assert a.flops_formula == b.flops_formula
            assert bind_dims((a.flops_formula,), {"batch": batch}) == (b.flops,)


def test_policy_dtypes_set_activation_bytes_and_add_cast_converts():
    f32 = mg.compile(mlp()).cost_table(batch=4, xla=False)
    bf16 = mg.compile(mlp(), mg.Policy(compute_dtype="bfloat16")).cost_table(batch=4, xla=False)
    assert f32["dense"].activation_bytes == 4 * 128 * 4
    assert bf16["dense"].activation_bytes == 4 * 128 * 2
    # Under bfloat16 the float32 weights are converted inside the layer: one per weight.
    assert bf16["dense"].flops == f32["dense"].flops + 784 * 128 + 128
    assert bf16["x_bf16"].flops == 4 * 784 and bf16["x_bf16"].op == "cast"


def test_shared_weights_count_params_once_and_flops_per_call():
    x = mg.Input(("batch", 4))
    layer = ops.Linear(4, name="fc")
    model = mg.compile(mg.Graph(x, layer(layer(x))))
    first, second = model.cost_table(batch=2, xla=False).rows
    assert first.params == 20 and second.params == 0
    assert first.flops == second.flops == 2 * (2 * 4 * 4 + 4)
    assert "shares the weights of fc" in second.note


def test_nested_block_dims_are_bound_to_the_call():
    """The residual block is built on (batch, height, width, 16); called on 8x8 its
    layers' formulas are in the outer batch only."""
    table = mg.compile(residual_cnn()).cost_table(batch=2, xla=False)
    conv_a = table["res1/conv_a"]
    # 3x3 SAME on 8x8: 22 of 24 taps per axis land on the input.
    assert str(conv_a.flops_formula) == f"{2 * 22 * 22 * 16 * 16}*batch"


def test_example_arrays_and_missing_dims():
    model = mg.compile(mlp(8, (4,), 2))
    assert model.cost_table(jnp.zeros((5, 8)), xla=False).dims == {"batch": 5}
    with pytest.raises(mg.ShapeError, match="batch=..."):
        model.cost_table()


def test_table_prints_formulas_values_and_notes():
    text = str(mg.compile(residual_cnn()).cost_table(batch=8))
    assert 'cost of "residual_cnn" at batch=8, training forward' in text
    assert "16512*batch" in text and "132,096" in text  # stem: formula and value
    assert "XLA n/a" in text and "not comparable: it includes dropout" in text
    assert text.splitlines()[-3].startswith("XLA's count of the whole apply")


# --- convolution taps: the rule against a brute-force count and against XLA ------------


def brute_force_taps(n, k, s, d, pad_low, out):
    return sum(1 for o in range(out) for j in range(k) if 0 <= o * s + j * d - pad_low < n)


@pytest.mark.parametrize("n,k,s,d,pad_low,out", [
    (8, 3, 1, 1, 1, 8), (9, 3, 2, 1, 1, 5), (10, 5, 3, 1, 2, 4), (9, 3, 1, 2, 2, 9),
    (7, 4, 1, 1, 0, 4), (6, 3, 1, 1, 3, 7)])
def test_window_taps_match_a_brute_force_count(n, k, s, d, pad_low, out):
    assert window_taps(n, out, k, s, pad_low, d) == brute_force_taps(n, k, s, d, pad_low, out)


def test_window_taps_stay_symbolic():
    size = mg.TensorSpec.of(("h",), "float32").shape[0]
    assert str(window_taps(size, size, 3, 1, 1)) == "3*h - 2"


CONVS = [dict(strides=1, padding="SAME"), dict(strides=2, padding="SAME"),
         dict(strides=(2, 3), padding="SAME", kernel_size=(5, 4)),
         dict(dilation=2, padding="SAME"), dict(padding=((2, 0), (1, 3))),
         dict(padding="VALID"), dict(groups=3, padding="SAME", features=6)]


@pytest.mark.parametrize("config", CONVS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_conv_rule_matches_xla_on_plain_lax(config):
    config = dict(config)
    features = config.pop("features", 8)
    kernel_size = config.pop("kernel_size", (3, 3))
    x = mg.Input(("batch", 9, 10, 6))
    layer = ops.Conv(features, kernel_size, use_bias=False, **config, name="conv")
    (row,) = mg.compile(mg.Graph(x, layer(x))).cost_table(batch=2, xla=False)
    kernel = jnp.zeros((features, *kernel_size, 6 // layer.groups))
    counted = xla_flops(lambda v, k: lax.conv_general_dilated(
        v, k, layer.strides, layer.padding, rhs_dilation=layer.dilation,
        dimension_numbers=("NHWC", "OHWI", "NHWC"), feature_group_count=layer.groups),
        jnp.zeros((2, 9, 10, 6)), kernel)
    assert row.flops == counted


# --- every op's rule against XLA's count of the op's apply ------------------------------


def _graph(make, shape=("batch", 9, 10, 6), extra=()):
    x = mg.Input(shape, name="x")
    inputs = [x] + [mg.Input(s, name=f"e{i}") for i, s in enumerate(extra)]
    return mg.Graph(inputs, make(*inputs))


SEQUENCE = ("batch", 7, 12)
OP_CASES = {
    "linear": lambda x: ops.Linear(5)(x),
    "linear_accumulate_f32": lambda x: ops.Linear(5, preferred_element_type="float32")(
        ops.cast(x, "bfloat16")),
    "conv_nchw": lambda x: ops.Conv(8, (3, 3), padding="SAME", data_format="NCHW")(
        ops.transpose(x, (0, 3, 1, 2))),
    "conv_accumulate_f32": lambda x: ops.Conv(8, (3, 3), padding="SAME",
                                              preferred_element_type="float32")(ops.cast(x, "bfloat16")),
    "batch_norm": lambda x: ops.BatchNorm(axis=1, use_bias=False)(x),
    "layer_norm": lambda x: ops.LayerNorm()(x),
    "layer_norm_axis1": lambda x: ops.LayerNorm(axis=1, use_scale=False)(x),
    "rms_norm": lambda x: ops.RMSNorm()(x),
    "group_norm": lambda x: ops.GroupNorm(num_groups=3)(x),
    "max_pool": lambda x: ops.MaxPool((3, 3), strides=2, padding="SAME")(x),
    "avg_pool": lambda x: ops.AvgPool((2, 2))(x),
    "avg_pool_same": lambda x: ops.AvgPool((3, 3), strides=2, padding="SAME")(x),
    "avg_pool_exclude_pad": lambda x: ops.AvgPool((3, 3), strides=2, padding="SAME",
                                                  count_include_pad=False)(x),
    "global_avg_pool": lambda x: ops.GlobalAvgPool()(x),
    "global_max_pool": lambda x: ops.GlobalMaxPool(keepdims=True)(x),
    "relu": ops.relu, "gelu_tanh": lambda x: ops.gelu(x, approximate=True),
    "silu": ops.silu, "tanh": ops.tanh, "sigmoid": ops.sigmoid,
    "softmax": lambda x: ops.softmax(x, axis=1), "log_softmax": ops.log_softmax,
    "add_sub_mul": lambda x: ops.mul(ops.sub(x, ops.Linear(6)(x)), ops.add(x, x)),
    # a multiply by the constant 1 (LoRA's scale at alpha == rank), which XLA drops
    "mul_by_one": lambda x: ops.Mul(constant=1.0)(ops.Linear(6)(x)),
    "mul_by_two": lambda x: ops.Mul(constant=2.0)(ops.Linear(6)(x)),
    "concat_split_reshape_flatten": lambda x: ops.Flatten()(ops.reshape(
        ops.split(ops.concat([x, x], axis=2), 2, axis=-1)[0], (-1,))),
    "cast": lambda x: ops.cast(x, "bfloat16"),
    "dropout_inference": lambda x: ops.Dropout(0.5)(x),
    "conv_int_kernel_activation": lambda x: ops.Conv(4, 3, padding="SAME", activation="silu")(x),
    "linear_activation": lambda x: ops.Linear(5, activation="relu")(x),
    "conv_transpose_same": lambda x: ops.ConvTranspose(4, (3, 3), strides=2, padding="SAME")(x),
    "conv_transpose_valid": lambda x: ops.ConvTranspose(3, (2, 3), strides=(3, 2))(x),
    "conv_transpose_pairs_nchw": lambda x: ops.ConvTranspose(
        5, (3, 3), strides=2, padding=((1, 0), (2, 1)), dilation=(1, 2), data_format="NCHW")(
        ops.transpose(x, (0, 3, 1, 2))),
    "upsample_nearest": lambda x: ops.Upsample(2)(x),
    "upsample_bilinear": lambda x: ops.Upsample((2, 3), method="bilinear")(x),
    "resize_bilinear_nchw": lambda x: ops.resize(ops.transpose(x, (0, 3, 1, 2)), (4, 13),
                                                 data_format="NCHW"),
    "max_pool_nchw": lambda x: ops.MaxPool((2, 2), data_format="NCHW")(ops.transpose(x, (0, 3, 1, 2))),
    "global_avg_pool_nchw": lambda x: ops.GlobalAvgPool(data_format="NCHW")(x),
    "operators": lambda x: -((x * 2.0 + 1.0) / (x - 3.0)) ** 2 - (1.0 - x) ** 3,
    "compare_where": lambda x: ops.where(x > 0.5, x, 0.0) + ops.where(x <= x * x, 1.0, x),
    "maximum_minimum": lambda x: ops.Maximum()(x, x * 3.0) + ops.Minimum(constant=0.5)(x),
    "matmul_getitem": lambda x: x[:, 0, :, ::2] @ ops.transpose(x[:, 1, :, ::2], (0, 2, 1)),
    "reductions": lambda x: ops.sum(x, axis=(1, 2)) + ops.mean(x, axis=1)[:, 0] + ops.max(x, 2)[:, 0],
    "squeeze_expand_pad_identity": lambda x: ops.identity(ops.squeeze(ops.expand_dims(
        ops.pad(x, ((0, 0), (1, 1), (0, 2), (0, 0))), 1), 1)),
    "broadcast_param": lambda x: x + ops.broadcast_to(ops.Param((1, 1, 1, 6))(), (x.shape[0], 9, 10, 6)),
}
SEQUENCE_CASES = {
    "attention": (lambda x: ops.MultiHeadAttention(3, 5)(x), ()),
    "attention_causal": (lambda x: ops.MultiHeadAttention(3, 5, out_features=4)(
        x, mask=ops.causal_mask(x)), ()),
    "attention_cross": (lambda x, kv: ops.MultiHeadAttention(2)(x, kv), (("batch", 5, 8),)),
    "attention_gqa_rope_causal": (lambda x: ops.MultiHeadAttention(4, 4, num_kv_heads=2, rope=True,
                                                                   causal=True)(x), ()),
    "attention_yarn_rope": (lambda x: ops.MultiHeadAttention(4, 4, rope=100.0, causal=True, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4})(x), ()),
    "attention_key_padding_causal": (lambda x, m: ops.MultiHeadAttention(2, 6, causal=True)(
        x, mask=ops.cast(m, "int32")), (("batch", 7),)),
    "rotary_embedding": (lambda x: ops.rotary_embedding(x), ()),
    "embedding_attend": (lambda x: _attend(x), ()),
}


def _attend(x):
    emb = ops.Embedding(20, 12)
    emb(ops.arange(x.shape[1]))
    return emb.attend(x)


def _cases():
    for (name, make), policy in itertools.product(OP_CASES.items(), POLICIES):
        yield pytest.param(make, (), ("batch", 9, 10, 6), policy, id=f"{name}-{policy}")
    for (name, (make, extra)), policy in itertools.product(SEQUENCE_CASES.items(), POLICIES):
        yield pytest.param(make, extra, SEQUENCE, policy, id=f"{name}-{policy}")
    # bfloat16 inputs without a policy: jnp.sum and jnp.mean sum them in float32.
    for name in ("batch_norm", "layer_norm", "rms_norm", "group_norm", "global_avg_pool",
                 "softmax", "log_softmax", "avg_pool", "max_pool", "silu"):
        make = OP_CASES[name]
        yield pytest.param(lambda x, make=make: make(ops.cast(x, "bfloat16")), (),
                           ("batch", 9, 10, 6), "float32", id=f"{name}-bfloat16-input")
    for param_dtype in ("bfloat16",):  # weights in another dtype: their converts count
        for name in ("linear", "batch_norm", "layer_norm", "rms_norm", "group_norm"):
            yield pytest.param(OP_CASES[name], (), ("batch", 9, 10, 6),
                               mg.Policy(param_dtype=param_dtype), id=f"{name}-params-{param_dtype}")


@pytest.mark.parametrize("make,extra,shape,policy", list(_cases()))
def test_op_rules_match_xla_count_of_their_apply(make, extra, shape, policy):
    policy = POLICIES.get(policy, policy)
    model = mg.compile(_graph(make, shape, extra), policy)
    for inference_mode in (False, True):
        table = model.cost_table(batch=3, inference_mode=inference_mode)
        for row in table:
            if row.op == "dropout" and not inference_mode:  # see the module docstring
                assert row.xla_flops is None and "threefry" in row.note
                continue
            assert row.xla_flops is not None, row
            assert row.flops == row.xla_flops, row
        if not table.xla_total_note:
            assert table.flops == table.xla_total


def test_embedding_rule_matches_xla_on_plain_jnp():
    ids = mg.Input(("batch", 6), "int32")
    (row,) = mg.compile(mg.Graph(ids, ops.Embedding(50, 8, name="embed")(ids))).cost_table(
        batch=4, xla=False)
    counted = xla_flops(lambda table, i: jnp.take(table, jnp.where(i < 0, 50, i), axis=0,
                                                  mode="fill", fill_value=np.nan),
                        jnp.zeros((50, 8)), jnp.zeros((4, 6), jnp.int32))
    assert row.flops == counted == 8 * 24 + 4 * 6 * 8


def test_ops_without_a_rule_show_xla_count():
    x = mg.Input(("batch", 4))
    (row,) = mg.compile(mg.Graph(x, ops.F(lambda v: v * v, )(x))).cost_table(batch=2)
    assert row.flops is None and row.xla_flops == 8
    assert "no FLOP rule" in row.note


def test_exact_gelu_is_explained():
    x = mg.Input(("batch", 16))
    (row,) = mg.compile(mg.Graph(x, ops.gelu(x))).cost_table(batch=2)
    assert row.flops == 4 * 32 and row.xla_flops is None and "erfc" in row.note
    counted = xla_flops(lambda v: jax.nn.gelu(v, approximate=False), jnp.zeros((2, 16)))
    assert counted > 10 * row.flops  # XLA's polynomial expansion of erfc


# --- recurrent layers: XLA counts a loop body once, so check against an unrolled loop ---


def unrolled_lstm(x, wi, wh, b):
    """An LSTM step by step in plain jnp (gate order i, f, g, o), unrolled in Python."""
    hidden = wh.shape[0]
    h = c = jnp.zeros((x.shape[0], hidden))
    projected = jnp.einsum("bti,ig->tbg", x, wi) + b
    for t in range(x.shape[1]):
        i, f, g, o = jnp.split(projected[t] + h @ wh, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return h


def unrolled_gru(x, wi, wh, b):
    hidden = wh.shape[0]
    h = jnp.zeros((x.shape[0], hidden))
    projected = jnp.einsum("bti,ig->tbg", x, wi) + b
    for t in range(x.shape[1]):
        xr, xz, xn = jnp.split(projected[t], 3, axis=-1)
        hr, hz, hn = jnp.split(h @ wh + b, 3, axis=-1)  # b also stands for recurrent_bias
        r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
    return h


@pytest.mark.parametrize("layer,reference,gates", [(ops.LSTM, unrolled_lstm, 4),
                                                  (ops.GRU, unrolled_gru, 3)])
def test_recurrent_rule_matches_xla_on_an_unrolled_loop(layer, reference, gates):
    x = mg.Input(("batch", 7, 12))
    (row,) = mg.compile(mg.Graph(x, layer(6, name="rnn")(x))).cost_table(batch=3)
    assert row.xla_flops is None and "loop body once" in row.note
    counted = xla_flops(reference, jnp.zeros((3, 7, 12)), jnp.zeros((12, gates * 6)),
                        jnp.zeros((6, gates * 6)), jnp.zeros((gates * 6,)))
    assert row.flops == counted


def test_lstm_classifier_total_counts_every_step():
    table = mg.compile(lstm_classifier()).cost_table(batch=2)
    lstm = table["lstm"]
    # XLA's whole-apply count has the loop body once: far below the rule's.
    assert "lstm" in table.xla_total_note and table.xla_total < table.flops
    assert lstm.flops > 0.9 * table.flops


@pytest.mark.parametrize("alpha", [4, 8])
def test_lora_table_total_is_xla_count_of_the_whole_apply(alpha):
    """The scale of mg.lora (a multiply by alpha / rank) counts as XLA does, 0 when it
    is 1, so the table's total is XLA's count of the whole adapted model."""
    g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32})
    model = mg.compile(mg.lora(g, ["h.*/attn/qkv", "h.*/mlp/c_fc"], rank=4, alpha=alpha))
    table = model.cost_table(batch=2, seq=8, inference_mode=True)
    row = table["h.0/attn.qkv.lora_scale"]
    assert row.flops == row.xla_flops == (0 if alpha == 4 else 2 * 8 * 96), row
    assert row.note == ""
    params, state = model.init(jax.random.key(0))
    ids = jnp.zeros((2, 8), jnp.int32)
    whole = jax.jit(lambda p, s, i: model.apply(p, s, i, inference_mode=True)).lower(
        params, state, ids).cost_analysis()["flops"]
    assert table.flops == int(whole)


def test_a_note_gives_both_counts():
    from mlaxgraph.analysis.cost import _note

    rule, xla = 1536, 0
    assert _note(rule, xla) == f"XLA counts {xla:,} (rule {rule:,})"
    rule, xla = 4000, 5000
    assert _note(rule, xla) == f"XLA counts {xla:,} (rule {rule:,}, +{(xla - rule) * 100 // rule}%)"


def test_a_missing_layer_is_named_with_the_near_ones():
    g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32})
    table = mg.compile(g).cost_table(batch=1, seq=4, xla=False)
    assert "h.0/mlp.c_fc" in table and "h.0/mlp/c_fc" not in table
    for typo in ("h.0/mlp.cfc", "h.0/mlp/c_fc"):
        with pytest.raises(mg.GraphError, match=rf"the cost table has no layer '{re.escape(typo)}'; "
                                                r"did you mean 'h\.0/mlp\.c_fc'"):
            table[typo]
