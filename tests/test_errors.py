"""Errors name the layer, its op, got vs expected, and the user's file:line."""

import jax
import jax.numpy as jnp
import pytest
from _helpers import next_line

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ir import Node, Value


def test_error_classes():
    assert issubclass(mg.GraphError, ValueError) and issubclass(mg.GraphError, mg.MlaxGraphError)
    assert issubclass(mg.ShapeError, ValueError) and issubclass(mg.ShapeError, mg.MlaxGraphError)
    assert issubclass(mg.DTypeError, TypeError) and issubclass(mg.DTypeError, mg.MlaxGraphError)
    assert issubclass(mg.SerializationError, ValueError)


def test_shape_error_at_the_call_names_layer_op_got_expected_and_line():
    x = mg.Input(("batch", 28, 28), name="image")
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.Conv(16, (3, 3), name="conv1")(x)
    message = str(info.value)
    assert "layer 'conv1' (op conv)" in message
    assert where in message
    assert message.index("got:") < message.index("expected:")
    assert "f32[batch,28,28]" in message  # what it got
    assert "rank 4" in message  # what it expected
    assert "> %conv1: ? = conv[features=16, kernel_size=(3, 3)](%image)" in message


def test_unnamed_layer_error_uses_its_default_name():
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.MaxPool((4, 4))(mg.Input(("batch", 3, 3, 1)))
    assert "layer 'max_pool' (op max_pool)" in str(info.value) and where in str(info.value)


def test_linear_on_mismatched_shared_weights():
    dense = ops.Linear(8, name="dense")
    dense(mg.Input(("batch", 4)))
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        dense(mg.Input(("batch", 5)))
    assert "'dense'" in str(info.value) and where in str(info.value)


def test_dtype_error_for_mixed_float_inputs():
    a = mg.Input(("batch", 3), "float32")
    b = mg.Input(("batch", 3), "bfloat16")
    with pytest.raises(mg.DTypeError) as info:
        where = next_line()
        ops.Add(name="sum")(a, b)
    message = str(info.value)
    assert "layer 'sum' (op add)" in message and where in message
    assert "f32[batch,3], bf16[batch,3]" in message and "ops.cast" in message


def test_dtype_error_for_integer_input_to_linear():
    tokens = mg.Input(("batch", 3), "int32")
    with pytest.raises(mg.DTypeError) as info:
        where = next_line()
        ops.Linear(4, name="proj")(tokens)
    assert "'proj'" in str(info.value) and where in str(info.value) and "int32" in str(info.value)


def test_bad_hyperparameter_names_the_line():
    assert issubclass(mg.ConfigError, ValueError) and issubclass(mg.ConfigError, mg.MlaxGraphError)
    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        ops.Linear(-3, name="neg")
    assert "'neg'" in str(info.value) and where in str(info.value)


def test_duplicate_names_are_a_graph_error_naming_both_lines():
    x = mg.Input(("batch", 4))
    first = next_line()
    h = ops.Linear(4, name="dense")(x)
    second = next_line()
    y = ops.Linear(4, name="dense")(h)
    with pytest.raises(mg.GraphError) as info:
        mg.Graph(x, y)
    assert first in str(info.value) and second in str(info.value)


def test_cycle_in_a_hand_made_graph_is_a_graph_error_with_context():
    x = mg.Input(("batch", 4), name="x")
    where = next_line()
    g = mg.Graph(x, ops.relu(ops.Linear(4, name="a")(x)))
    a, relu = g.node("a"), g.node("relu")
    looped = g.with_parts(nodes=(g.node("x"), a.replace(inputs=(Value("relu"),)), relu))
    with pytest.raises(mg.GraphError) as info:
        mg.compile(looped)
    message = str(info.value)
    assert "cycle: a -> relu -> a" in message
    assert where in message  # where layer 'a' was created
    assert "> %a: f32[batch,4] = linear[features=4](%relu)" in message  # the node in context


def test_dangling_reference_is_a_graph_error():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.relu(x))
    broken = g.with_parts(nodes=(g.node("x"), g.node("relu").replace(inputs=(Value("ghost"),))))
    with pytest.raises(mg.GraphError, match="ghost"):
        mg.compile(broken)


def test_node_claiming_a_wrong_shape_is_a_shape_error():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.Linear(3, name="fc")(x))
    fc = g.node("fc")
    lying = g.with_parts(nodes=(g.node("x"), fc.replace(outputs=(mg.TensorSpec.of(("batch", 5), "float32"),))))
    with pytest.raises(mg.ShapeError, match="layer 'fc' .*records output specs"):
        mg.compile(lying)


def test_unknown_op_is_a_graph_error():
    with pytest.raises(mg.GraphError, match="unknown op 'os.system'"):
        ops.lookup("os.system")
    # a misspelt op, in code or in a .json file, names the one meant
    with pytest.raises(mg.GraphError, match=r"unknown op 'quantized_lineer' \(did you mean 'quantized_linear'\?\)"):
        ops.lookup("quantized_lineer")
    x = mg.Input(("batch", 3), name="x")
    text = mg.Graph(x, ops.Linear(2, name="fc")(x)).to_json().replace('"op":"linear"', '"op":"lineer"')
    with pytest.raises(mg.SerializationError, match=r"unknown op 'lineer' \(did you mean 'linear'\?\)"):
        mg.Graph.from_json(text)


def test_apply_with_wrong_input_shape_names_the_input_and_its_line():
    where = next_line()
    x = mg.Input(("batch", 4), name="features")
    model = mg.compile(mg.Graph(x, ops.Linear(2)(x)))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError) as info:
        model.apply(params, state, jnp.ones((3, 5)))
    assert "'features'" in str(info.value) and where in str(info.value)
    assert "f32[batch,4]" in str(info.value)


def test_apply_with_wrong_input_dtype():
    x = mg.Input(("batch", 4), name="features")
    model = mg.compile(mg.Graph(x, ops.relu(x)))
    with pytest.raises(mg.DTypeError, match="'features'"):
        model.apply({}, {}, jnp.ones((3, 4), jnp.int32))


def test_symbolic_dim_bound_inconsistently_across_inputs():
    a = mg.Input(("batch", 4), name="a")
    b = mg.Input(("batch", 4), name="b")
    model = mg.compile(mg.Graph([a, b], ops.add(a, b)))
    with pytest.raises(mg.ShapeError, match="'b'"):
        model.apply({}, {}, jnp.ones((3, 4)), jnp.ones((2, 4)))


def test_missing_rng_with_random_layers():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.Dropout(0.5, name="drop")(x)))
    with pytest.raises(mg.GraphError, match="random layers \\(drop\\).*rng="):
        model.apply({}, {}, jnp.ones((2, 4)))
    out, _ = model.apply({}, {}, jnp.ones((2, 4)), inference_mode=True)
    assert out.shape == (2, 4)


def test_params_from_another_model_are_a_graph_error():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.Linear(2, name="fc")(x)))
    with pytest.raises(mg.GraphError, match="params has no entry 'fc'"):
        model.apply({}, {}, jnp.ones((2, 4)))


def test_params_with_a_wrong_or_missing_weight_name_the_layer_and_the_weight_path():
    x = mg.Input(("batch", 4))
    where = next_line()
    inner = mg.Graph(x, ops.Linear(3, name="fc")(x), name="inner")
    y = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(y, inner.as_block("block")(y)))
    params, state = model.init(jax.random.key(0))
    wrong = {"block": {"fc": {"kernel": jnp.ones((5, 3)), "bias": params["block"]["fc"]["bias"]}}}
    with pytest.raises(mg.ShapeError) as info:
        model.apply(wrong, state, jnp.ones((2, 4)))
    message = str(info.value)
    assert message.startswith("layer 'block/fc' (op linear): weight block/fc/kernel has another "
                              "shape than the layer needs"), message
    assert "got:      (5, 3)" in message and "expected: (4, 3)" in message, message
    assert where in message, message
    missing = {"block": {"fc": {"kernel": params["block"]["fc"]["kernel"]}}}
    with pytest.raises(mg.GraphError, match="params has no weight block/fc/bias"):
        model.apply(missing, state, jnp.ones((2, 4)))
    ints = {"block": {"fc": {"kernel": jnp.ones((4, 3), jnp.int32), "bias": jnp.ones(3)}}}
    with pytest.raises(mg.DTypeError, match="weight block/fc/kernel is not floating-point"):
        model.apply(ints, state, jnp.ones((2, 4)))


def test_apply_without_state_says_that_state_is_missing():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.Linear(2, name="fc")(x)))
    params, _ = model.init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match="state is missing"):
        model.apply(params, jnp.ones((2, 4)))


def test_missing_state_entry_names_the_layer():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.BatchNorm(name="bn")(x)))
    params, _ = model.init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match="layer 'bn'.*state has no entry 'bn'"):
        model.apply(params, {}, jnp.ones((2, 4)))


def test_hlo_by_layer_of_an_unknown_layer_lists_the_layers():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.relu(ops.Linear(2, name="fc")(x))))
    by_layer = model.hlo_by_layer(batch=2, optimized=False)
    with pytest.raises(mg.GraphError, match="no layer 'nope'.*fc, relu"):
        by_layer["nope"]


def test_f_whose_function_fails_is_a_shape_error_at_the_call():
    x = mg.Input(("batch", 4))
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        ops.F(lambda t: t @ jnp.ones((5, 2)), name="matmul")(x)
    assert "'matmul'" in str(info.value) and where in str(info.value)


def test_f_that_fails_only_on_the_calls_arrays_names_the_layer_and_line():
    # JAX's symbolic reshape does not compare batch*8 with batch*3: the build passes
    x = mg.Input(("batch", 8), name="x")
    where = next_line()
    y = ops.F(lambda t: t.reshape((t.shape[0], 3)), name="fold")(x)
    model = mg.compile(mg.Graph(x, y))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError, match=r"'fold'.*failed on the call's inputs \(float32\[2, 8\]\)"
                       r".*cannot reshape") as info:
        model.apply(params, state, jnp.ones((2, 8)))
    assert where in str(info.value)


@pytest.mark.parametrize("pool", [False, True])
def test_an_input_smaller_than_a_window_names_the_layer(pool):
    x = mg.Input(("batch", "h", "w", 3), name="x")
    where = next_line()
    y = ops.Conv(4, (3, 3), name="conv")(x)  # VALID: h - 2
    if pool:
        y = ops.MaxPool((2, 2), name="pool")(ops.Conv(4, (1, 1), name="conv")(x))
    model = mg.compile(mg.Graph(x, y))
    params, state = model.init(jax.random.key(0))
    layer = "pool" if pool else "conv"
    with pytest.raises(mg.ShapeError, match=rf"'{layer}'.*\(1, 1, 1, 4\) is too small|"
                                            rf"'{layer}'.*\(1, 2, 2, 3\) is too small") as info:
        model.apply(params, state, jnp.ones((1, 2 - pool, 2 - pool, 3)))
    assert pool or where in str(info.value)
    assert model.apply(params, state, jnp.ones((0, 4, 4, 3)))[0].shape[0] == 0  # an empty batch


def test_invalid_in_a_custom_layers_validate_names_the_users_line():
    import dataclasses

    @ops.register("test_scale")
    @dataclasses.dataclass(frozen=True)
    class Scale(ops.Layer):
        factor: float

        def validate(self):
            if self.factor <= 0:
                self.invalid(f"factor must be positive, got {self.factor}")

    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        Scale(-1.0, name="scale")
    assert "layer 'scale' (op test_scale)" in str(info.value) and where in str(info.value)


# --- the forms of issue 16: operators, slices, tied heads, grouped-query attention ------


def test_operators_on_shapes_that_do_not_broadcast_name_the_users_line():
    a, b = mg.Input(("batch", 4)), mg.Input(("batch", 5))
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        a + b
    assert "(op add)" in str(info.value) and where in str(info.value)
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        a @ mg.Input((3, 2))
    assert "(op matmul)" in str(info.value) and where in str(info.value)


def test_slices_out_of_range_name_the_users_line():
    x = mg.Input(("batch", 8, 16))
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        x[:, 8]
    assert "(op getitem)" in str(info.value) and "out of range" in str(info.value)
    assert where in str(info.value)
    with pytest.raises(mg.ShapeError) as info:
        where = next_line()
        x[..., :64]
    assert "out of range" in str(info.value) and where in str(info.value)
    with pytest.raises(mg.ShapeError, match="4 indices for a rank-3"):
        x[0, 0, 0, 0]


def test_attend_without_the_embedding_called_names_the_users_line():
    emb = ops.Embedding(10, 8, name="tokens")
    h = mg.Input(("batch", 8))
    with pytest.raises(mg.GraphError) as info:
        where = next_line()
        emb.attend(h)
    assert "layer 'tokens' (op embedding)" in str(info.value) and where in str(info.value)
    with pytest.raises(mg.DTypeError, match="attend"):
        emb(h)


def test_heads_that_num_kv_heads_does_not_divide_are_a_config_error():
    with pytest.raises(mg.ConfigError) as info:
        where = next_line()
        ops.MultiHeadAttention(6, 8, num_kv_heads=4, name="attn")
    assert "layer 'attn' (op multi_head_attention)" in str(info.value)
    assert "num_kv_heads=4 does not divide num_heads=6" in str(info.value)
    assert where in str(info.value)


def test_int_kernel_sizes_and_config_errors_of_the_new_layers():
    x = mg.Input(("batch", 8, 8, 3))
    assert ops.Conv(8, 3)(x).shape[1:] == (6, 6, 8)
    with pytest.raises(mg.ConfigError, match="padding must be 'SAME' or 'VALID' when kernel_size"):
        ops.Conv(8, 3, padding=((1, 1), (1, 1)))
    for make in (lambda: ops.ConvTranspose(0, 2), lambda: ops.Upsample(2, method="cubic"),
                 lambda: ops.Pad(((1, -1),)), lambda: ops.Linear(4, activation="nope"),
                 lambda: ops.MultiHeadAttention(2, dropout=1.0)):
        with pytest.raises(mg.ConfigError):
            make()
