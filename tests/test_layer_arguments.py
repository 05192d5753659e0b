"""Hyperparameters and call arguments read as what they are, or refused by name: a
flag given as the string "False" (true in Python), a size given as a float or a
string (int() truncated or parsed it), a non-float accumulation dtype, an unhashable
field, a misspelt weight inside a layer's params, apply's inference_mode, and a
symbolic tensor iterated (which never stopped)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ops.base import Layer


@pytest.mark.parametrize("make", [
    lambda: ops.MultiHeadAttention(2, causal="False"),  # computed causal attention
    lambda: ops.Linear(4, use_bias="False"),             # made a bias
    lambda: ops.Linear(4, "fc"),                         # a positional name: use_bias='fc'
    lambda: ops.GlobalAvgPool(keepdims="False"),
])
def test_a_flag_that_is_not_a_bool_is_refused(make):
    with pytest.raises(mg.ConfigError, match="is True or False, got"):
        make()


def test_flags_given_as_numpy_bools_are_python_bools():
    layer = ops.Linear(4, use_bias=np.bool_(False))
    assert layer.use_bias is False and hash(layer) == hash(ops.Linear(4, use_bias=False))


@pytest.mark.parametrize("make", [
    lambda: ops.Conv(4, (3.5, 3)),                 # kernel (3, 3)
    lambda: ops.Conv(4, (3, 3), strides=(1.9, 1)),  # strides (1, 1)
    lambda: ops.Conv(4, (3, 3), strides="12"),      # strides (1, 2)
    lambda: ops.Conv(4, (3, 3), padding=((0.9, 0), (0, 0))),
    lambda: ops.MaxPool((2.9, 2.9)),
    lambda: ops.Reshape((2.7, 4)),
])
def test_a_size_that_is_not_an_int_is_refused(make):
    with pytest.raises(mg.ConfigError, match="must"):
        make()


def test_sizes_given_as_numpy_ints_are_taken():
    conv = ops.Conv(4, (np.int64(3), 3), strides=np.int32(2))
    assert conv.kernel_size == (3, 3) and conv.strides == (2, 2)


def test_an_integer_accumulation_dtype_is_refused():
    # preferred_element_type="int8" on bfloat16 inputs gave all zeros
    with pytest.raises(mg.ConfigError, match="preferred_element_type is a float dtype"):
        ops.Linear(4, preferred_element_type="int8")
    with pytest.raises(mg.ConfigError, match="preferred_element_type is a float dtype"):
        ops.Conv(4, (3, 3), preferred_element_type="int32")
    assert ops.Linear(4, preferred_element_type="float32").preferred_element_type == np.float32


def test_an_unhashable_hyperparameter_is_refused_when_the_layer_is_made():
    @dataclasses.dataclass(frozen=True)
    class Scaled(Layer):
        factors: list = dataclasses.field(default_factory=lambda: [1.0, 2.0])

    with pytest.raises(mg.ConfigError, match="hyperparameters must be hashable"):
        Scaled()


def test_a_misspelt_weight_in_a_layers_params_is_named():
    x = mg.Input(("batch", 3), name="x")
    model = mg.compile(mg.Graph(x, ops.Linear(2, name="fc")(x)))
    params, state = model.init(jax.random.key(0))
    bad = {"fc": {**params["fc"], "kernal": jnp.zeros((3, 2))}}  # ran with the old kernel
    with pytest.raises(mg.GraphError, match=r"params has a weight fc/kernal this layer does not "
                                            r"have \(its weights: kernel, bias\); did you mean "
                                            r"'kernel'\?"):
        model.apply(bad, state, jnp.ones((1, 3)))


def test_a_missing_state_is_not_called_a_swap_of_params_and_state():
    # BatchNorm has params and state under one name: an empty state is not a swap
    x = mg.Input(("batch", 3), name="x")
    model = mg.compile(mg.Graph(x, ops.BatchNorm(name="bn")(x)))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.GraphError) as caught:
        model.apply(params, {}, jnp.ones((2, 3)))
    assert "state has no entry 'bn'" in str(caught.value) and "swapped" not in str(caught.value)
    with pytest.raises(mg.GraphError, match="params and state are swapped"):
        model.apply(state, params, jnp.ones((2, 3)))


def test_inference_mode_is_a_bool():
    x = mg.Input(("batch", 3), name="x")
    model = mg.compile(mg.Graph(x, ops.Dropout(0.5, name="drop")(x)))
    params, state = model.init(jax.random.key(0))
    for value in ("False", 1, None):  # "False" ran in inference mode; 1 compiled again
        with pytest.raises(mg.GraphError, match="inference_mode is True or False"):
            model.apply(params, state, jnp.ones((2, 3)), inference_mode=value)


def test_a_symbolic_tensor_cannot_be_iterated():
    x = mg.Input(("batch", 8), name="x")
    with pytest.raises(mg.GraphError, match="cannot be iterated.*ops.concat\\(\\[x, y\\]\\)"):
        ops.concat(x)  # the list forgotten: it hung
    with pytest.raises(mg.GraphError, match="cannot be iterated"):
        list(x)
    a, b = ops.split(x, 2)  # a tuple of tensors unpacks as before
    assert a.spec.shape[-1] == 4 and b.spec.shape[-1] == 4


def test_an_initializer_is_a_function_of_key_shape_and_dtype():
    # Keras's names and functions of the shape alone failed at init, naming no layer
    with pytest.raises(mg.ConfigError, match="kernel_init is an initializer.*he_normal\\(\\)"):
        ops.Linear(4, kernel_init="he_normal")
    with pytest.raises(mg.ConfigError, match="kernel_init is called as fn\\(key, shape, dtype\\)"):
        ops.Linear(4, kernel_init=lambda shape: jnp.zeros(shape))
    layer = ops.Linear(4, kernel_init=jax.nn.initializers.he_normal(), name="fc")
    x = mg.Input(("batch", 3), name="x")
    params, _ = mg.compile(mg.Graph(x, layer(x))).init(jax.random.key(0))
    assert params["fc"]["kernel"].shape == (3, 4)


def test_a_misspelt_keyword_names_the_one_meant():
    # Python's dataclass TypeError named neither the layer's fields nor the near one
    with pytest.raises(mg.ConfigError, match="Conv got an unexpected keyword argument 'stride'; "
                                             "did you mean 'strides'"):
        ops.Conv(4, (3, 3), stride=2)
    with pytest.raises(mg.ConfigError, match="did you mean 'num_kv_heads'"):
        ops.MultiHeadAttention(2, num_kv_head=1)
    with pytest.raises(mg.ConfigError, match="Policy got an unexpected keyword argument "
                                             "'compute_type'; did you mean 'compute_dtype'"):
        mg.Policy(compute_type="bfloat16")
    with pytest.raises(mg.ConfigError, match="TopK got an unexpected keyword argument 'kk'; "
                                             "did you mean 'k'"):
        mg.sampling.TopK(kk=3)
    import copy
    layer = ops.Conv(4, (3, 3), strides=2, name="c")
    assert copy.deepcopy(layer) == layer and dataclasses.replace(layer, strides=1).strides == (1, 1)


def test_an_array_operand_and_an_int_key_are_named():
    x = mg.Input(("batch", 8), name="x")
    for array in (np.ones(8), jnp.ones(8)):  # a JAX array gave JAX's TypeError
        with pytest.raises(mg.GraphError, match="make the array a weight .*ops.F"):
            x + array
    model = mg.compile(mg.Graph(x, ops.Linear(2)(x)))
    with pytest.raises(mg.GraphError, match=r"init takes one JAX random key, "
                                            r"init\(jax.random.key\(0\)\), got 0"):
        model.init(0)
    assert model.init(jax.random.PRNGKey(0))[0]  # the legacy key is one too


def test_an_int_field_is_an_int():
    # LayerNorm(axis=(-2, -1)) failed at the call with "'<=' not supported"
    with pytest.raises(mg.ConfigError, match=r"axis is an int, got \(-2, -1\)"):
        ops.LayerNorm(axis=(-2, -1))
    with pytest.raises(mg.ConfigError, match="axis is an int, got 1.0"):
        ops.LayerNorm(axis=1.0)
    assert ops.LayerNorm(axis=np.int64(-1)).axis == -1
