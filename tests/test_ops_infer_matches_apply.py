"""Registry-wide: for every op a user can construct, ``op.infer(input_specs)`` is exactly
what ``jax.eval_shape`` of ``op.apply`` gives (shapes, symbolic dims included, and
dtypes), with params and state shaped by ``op.param_specs`` / ``op.state_specs``, in
training and in inference mode. ``apply`` also returns state of the shapes and dtypes it
was given."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.onnx.layer import Constant, encode_array

F32, BF16, I32, BOOL = "float32", "bfloat16", "int32", "bool"

# Structural ops, not layers a user calls: "input" is made by mg.Input and is the graph's
# argument (it has no apply); "block" is a Graph called on tensors, which the lowering
# runs by walking the inner graph (it has no apply of its own either), and "scan" a run
# of blocks the compiler folds (tests/test_scan.py). They are covered by the model
# tests (test_models_numerics.py, test_scan.py), not here.
STRUCTURAL = {"input", "block", "scan"}


def _two(a, b):
    return a @ b, jnp.sum(a, axis=-1)


def _with_rng(x, rng):
    return x if rng is None else x * jnp.asarray(2.0, x.dtype)


# op name -> [(layer, [[(shape, dtype), ...] input lists...]), ...]
CASES = {
    "linear": [
        (ops.Linear(4, activation="gelu"), [[(("batch", 8), F32)]]),
        (ops.Linear(5), [[(("batch", 8), F32)], [((3, 8), F32)], [(("batch", 4, 8), F32)],
                         [((8,), F32)], [(("batch", 8), BF16)]]),
        (ops.Linear(3, use_bias=False), [[(("batch", "time", 8), F32)]]),
    ],
    "conv": [
        (ops.Conv(4, (3, 3), strides=2, padding="SAME"),
         [[(("batch", 9, 9, 3), F32)], [((2, 8, 8, 3), F32)], [(("batch", 9, 9, 3), BF16)],
          [(("batch", "h", "w", 3), F32)]]),
        (ops.Conv(6, (2, 2), groups=3, dilation=2, data_format="NCHW"),
         [[(("batch", 3, 7, 7), F32)], [((1, 6, 5, 6), BF16)]]),
        (ops.Conv(2, (3,), padding=((2, 1),), strides=2), [[(("batch", 10, 2), F32)]]),
        (ops.Conv(4, (2, 3, 2), padding="SAME", data_format="NCDHW", use_bias=False),
         [[(("batch", 2, 4, 5, 6), F32)]]),
        (ops.Conv(2, (2, 2, 2), padding=((1, 0), (0, 0), (1, 1))), [[(("batch", 4, 5, 6, 2), F32)]]),
    ],
    "batch_norm": [
        (ops.BatchNorm(), [[(("batch", 4), F32)], [(("batch", 3, 3, 4), BF16)]]),
        (ops.BatchNorm(axis=1, use_scale=False), [[(("batch", 4, 5), F32)]]),
    ],
    "dropout": [
        (ops.Dropout(0.5), [[(("batch", 8), F32)], [((2, 3, 4), BF16)]]),
    ],
    "max_pool": [
        (ops.MaxPool((2, 2), data_format="NCHW"), [[(("batch", 3, 8, 7), F32)]]),
        (ops.MaxPool((2, 2)), [[(("batch", 8, 8, 3), F32)], [(("batch", 7, 9, 3), BF16)],
                               [((2, 4, 4, 1), I32)]]),
        (ops.MaxPool((3,), strides=(2,), padding="SAME"), [[(("batch", 7, 2), F32)]]),
        (ops.MaxPool((2, 2, 2), padding=((1, 0), (0, 1), (0, 0))), [[(("batch", 3, 4, 5, 2), F32)]]),
    ],
    "flatten": [
        (ops.Flatten(), [[(("batch", 2, 3, 4), F32)], [((5,), F32)], [(("batch", "h", 4), BF16)]]),
    ],
    "reshape": [
        (ops.Reshape((4, -1)), [[(("batch", 2, 3, 4), F32)]]),
        (ops.Reshape((6,)), [[(("batch", 2, 3), BF16)]]),
    ],
    "concat": [
        (ops.Concat(), [[(("batch", 2), F32), (("batch", 3), F32)]]),
        (ops.Concat(0), [[(("batch", 3), F32), (("n", 3), F32)]]),
        (ops.Concat(1), [[(("batch", 1, 2), BF16), (("batch", 4, 2), BF16), (("batch", 2, 2), BF16)]]),
    ],
    **{name: [
        (cls(), [[(("batch", 4), F32), (("batch", 4), F32)],
                 [(("batch", 4, 5), BF16), (("batch", 4, 5), BF16)],
                 [(("batch", 1, 5), F32), (("batch", 4, 1), F32)],
                 [(("batch", 4, 5), F32), ((5,), F32)]]),            # NumPy broadcasting
    ] for name, cls in (("add", ops.Add), ("sub", ops.Sub), ("mul", ops.Mul))},
    **{name: [
        (cls(), [[(("batch", 8), F32)], [((2, 3, 4), BF16)]]),
    ] for name, cls in (("relu", ops.Relu), ("silu", ops.Silu), ("tanh", ops.Tanh),
                        ("sigmoid", ops.Sigmoid))},
    "gelu": [
        (ops.Gelu(), [[(("batch", 8), F32)]]),
        (ops.Gelu(approximate=True), [[((2, 3, 4), BF16)]]),
    ],
    "softmax": [
        (ops.Softmax(), [[(("batch", 8), F32)]]),
        (ops.Softmax(axis=1), [[(("batch", 3, 4), BF16)]]),
    ],
    "log_softmax": [
        (ops.LogSoftmax(), [[(("batch", 8), F32)]]),
        (ops.LogSoftmax(axis=0), [[((2, 3, 4), BF16)]]),
    ],
    "cast": [
        (ops.Cast(BF16), [[(("batch", 4), F32)]]),
        (ops.Cast(I32), [[(("batch", 4), F32)]]),
        (ops.Cast(F32), [[(("batch", 3, 2), I32)], [((2,), BF16)]]),
    ],
    "constrain": [
        (ops.Constrain(("batch", None)), [[(("batch", 4), F32)], [((3, 4), BF16)]]),
    ],
    "layer_norm": [
        (ops.LayerNorm(), [[(("batch", 8), F32)], [(("batch", 3, 4), BF16)]]),
        (ops.LayerNorm(axis=1), [[(("batch", 4, 5), F32)]]),
    ],
    "rms_norm": [
        (ops.RMSNorm(), [[(("batch", 6), F32)], [(("batch", "time", 6), BF16)]]),
    ],
    "group_norm": [
        (ops.GroupNorm(num_groups=2), [[(("batch", 4, 4, 6), F32)], [(("batch", 3, 4), BF16)]]),
    ],
    "avg_pool": [
        (ops.AvgPool((3,), strides=2, padding="SAME", count_include_pad=False, data_format="NCW"),
         [[(("batch", 2, 9), F32)]]),
        (ops.AvgPool((2, 2)), [[(("batch", 8, 8, 3), F32)], [(("batch", 7, 9, 3), BF16)]]),
        (ops.AvgPool((3, 3), strides=(2, 2), padding="SAME", count_include_pad=False),
         [[(("batch", 7, 7, 2), F32)]]),
    ],
    "global_avg_pool": [
        (ops.GlobalAvgPool(), [[(("batch", 4, 4, 3), F32)]]),
        (ops.GlobalAvgPool(keepdims=True), [[(("batch", 5, 3), BF16)]]),
    ],
    "global_max_pool": [
        (ops.GlobalMaxPool(data_format="NCHW", keepdims=True), [[(("batch", 3, 4, 5), F32)]]),
        (ops.GlobalMaxPool(), [[(("batch", 5, 3), F32)], [(("batch", 2, 3, 4, 2), BF16)]]),
    ],
    "transpose": [
        (ops.Transpose((0, 2, 1)), [[(("batch", 3, 4), F32)]]),
        (ops.Transpose((1, 0)), [[(("batch", 3), BF16)]]),
    ],
    "split": [
        (ops.Split(2), [[(("batch", 6), F32)]]),
        (ops.Split((1, 3), axis=1), [[(("batch", 5, 2), BF16)]]),
    ],
    "embedding": [
        (ops.Embedding(10, 4), [[(("batch", 7), I32)], [((3,), I32)]]),
        (ops.Embedding(10, 4, dtype=BF16), [[(("batch", 2, 3), I32)]]),
    ],
    "quantize": [
        (ops.Quantize("int8"), [[(("batch", 8), F32)], [(("batch", 4, 6), BF16)]]),
        (ops.Quantize("float8_e4m3fn", axes=(1, 2)), [[(("batch", 3, 4), F32)]]),
    ],
    "dequantize": [
        (ops.Dequantize(), [[(("batch", 5), "int32"), (("batch", 1), F32), ((5,), F32)],
                            [(("batch", 3, 5), "int32"), (("batch", 3, 1), BF16), ((5,), F32),
                             ((5,), F32)]]),
        (ops.Dequantize("relu", axis=1), [[(("batch", 5, 2, 2), F32), (("batch", 1, 1, 1), F32),
                                          ((5,), F32), ((5,), F32)]]),
    ],
    "quantized_linear": [
        (ops.QuantizedLinear(5, scheme="int8"), [[(("batch", 8), "int8"), (("batch", 1), F32)]]),
        (ops.QuantizedLinear(5, scheme="int8", dequantize=False),
         [[(("batch", 8), "int8"), (("batch", 1), F32)],
          [(("batch", 8), "int8"), (("batch", 1), F32), (("batch", 1), "int32")]]),
        (ops.QuantizedLinear(5, scheme="float8", activation="relu"),
         [[(("batch", 3, 8), "float8_e4m3fn"), (("batch", 3, 1), BF16)]]),
        (ops.QuantizedLinear(5, scheme="int8_weight_only"), [[(("batch", 8), F32)]]),
        (ops.QuantizedLinear(5, scheme="int4_weight_only", group_size=4, use_bias=False),
         [[(("batch", 8), F32)], [(("batch", 2, 8), BF16)]]),
    ],
    "quantized_conv": [
        (ops.QuantizedConv(4, (3, 3), scheme="int8", padding="SAME"),
         [[(("batch", 6, 6, 4), "int8"), (("batch", 1, 1, 1), F32)]]),
        (ops.QuantizedConv(4, (3, 3), scheme="int8", data_format="NCHW", dequantize=False),
         [[(("batch", 3, 6, 6), "int8"), (("batch", 1, 1, 1), F32)]]),
        (ops.QuantizedConv(4, (3, 3), scheme="int4_weight_only", group_size=2, data_format="NCHW"),
         [[(("batch", 4, 6, 6), F32)]]),
        (ops.QuantizedConv(4, (2,), scheme="int8_weight_only"), [[(("batch", 5, 3), F32)]]),
    ],
    "quantized_embedding": [
        (ops.QuantizedEmbedding(10, 4, scheme="int8"), [[(("batch", 7), I32)],
                                                       [(("batch", 4), "int8"), (("batch", 1), F32)],
                                                       [(("batch", 4), F32)]]),
        (ops.QuantizedEmbedding(10, 4, scheme="int4_weight_only", group_size=2),
         [[(("batch", 2, 3), I32)], [(("batch", 4), BF16)]]),
    ],
    "quantized_multi_head_attention": [
        (ops.QuantizedMultiHeadAttention(2, scheme="int8"),
         [[(("batch", 5, 8), F32), (("batch", 5, 8), F32)]]),
        (ops.QuantizedMultiHeadAttention(4, 2, num_kv_heads=2, scheme="int4_weight_only",
                                         group_size=4),
         [[(("batch", 5, 8), F32), (("batch", 5, 8), F32)]]),
    ],
    "multi_head_attention": [
        (ops.MultiHeadAttention(2), [[(("batch", 5, 8), F32), (("batch", 5, 8), F32)],
                                     [(("batch", 5, 8), BF16), (("batch", 5, 8), BF16)]]),
        (ops.MultiHeadAttention(4, 2, causal=True, num_kv_heads=2, rope=True, dropout=0.1),
         [[(("batch", 5, 8), F32), (("batch", 5, 8), F32)],
          [(("batch", 5, 8), BF16), (("batch", 5, 8), BF16), (("batch", 1, 1, 5), BOOL)]]),
        (ops.MultiHeadAttention(2, head_dim=3, out_features=6),
         [[(("batch", 4, 8), F32), (("batch", 7, 5), F32)],
          [(("batch", 5, 8), F32), (("batch", 5, 8), F32), ((5, 5), BOOL)],
          [(("batch", 4, 8), F32), (("batch", 7, 5), F32), (("batch", 4, 7), BOOL)]]),
    ],
    "causal_mask": [
        (ops.CausalMask(), [[(("batch", 5, 8), F32)], [((2, 3), I32)]]),
    ],
    "lstm": [
        (ops.LSTM(4), [[(("batch", 6, 3), F32)], [((2, 5, 3), BF16)]]),
        (ops.LSTM(4, return_state=True), [[(("batch", 6, 3), F32)]]),
    ],
    "gru": [
        (ops.GRU(3), [[(("batch", 6, 2), F32)], [((2, 4, 2), BF16)]]),
        (ops.GRU(3, return_state=True), [[(("batch", 6, 2), F32)]]),
    ],
    "conv_transpose": [
        (ops.ConvTranspose(4, (3, 3), strides=2, padding="SAME"),
         [[(("batch", 5, 6, 3), F32)], [((2, 4, 4, 3), BF16)], [(("batch", "h", "w", 3), F32)]]),
        (ops.ConvTranspose(2, 2, strides=3), [[(("batch", 4, 3), F32)], [(("batch", 2, 3, 2, 3), F32)]]),
        (ops.ConvTranspose(3, (3, 2), strides=(2, 1), padding=((1, 0), (0, 1)), dilation=(1, 2),
                           data_format="NCHW", use_bias=False), [[(("batch", 2, 5, 6), F32)]]),
    ],
    "upsample": [
        (ops.Upsample(2), [[(("batch", 4, 5, 3), F32)], [(("batch", 3, 2), BF16)]]),
        (ops.Upsample((2, 3), method="bilinear", data_format="NCHW"), [[(("batch", 2, 3, 4), F32)]]),
    ],
    "resize": [
        (ops.Resize((7, 3)), [[(("batch", 4, 5, 3), F32)], [((2, 9, 9, 1), BF16)]]),
        (ops.Resize((5,), method="nearest", data_format="NCHW"), [[(("batch", 2, 3), F32)]]),
    ],
    **{name: [
        (cls(), [[(("batch", 4), F32), (("batch", 4), F32)],
                 [(("batch", 1, 5), BF16), (("batch", 4, 1), BF16)]]),
        (cls(constant=2), [[(("batch", 4), F32)], [((3, 2), BF16)]]
         + ([] if cls is ops.Div else [[((3,), I32)]])),
        (cls(constant=0.5, reverse=True), [[(("batch", 4), BF16)]]),
    ] for name, cls in (("div", ops.Div), ("pow", ops.Pow), ("maximum", ops.Maximum),
                        ("minimum", ops.Minimum), ("equal", ops.Equal),
                        ("not_equal", ops.NotEqual), ("less", ops.Less),
                        ("less_equal", ops.LessEqual), ("greater", ops.Greater),
                        ("greater_equal", ops.GreaterEqual))},
    "matmul": [
        (ops.MatMul(), [[(("batch", 3, 4), F32), ((4, 5), F32)], [((4,), BF16), ((2, 4, 3), BF16)],
                        [(("batch", 2, 3, 4), F32), (("batch", 1, 4, 2), F32)], [((3, 4), I32), ((4,), I32)]]),
    ],
    "getitem": [
        (ops.GetItem((slice(None), 0)), [[(("batch", 3, 4), F32)], [((2, 5), BF16)]]),
        (ops.GetItem((Ellipsis, slice(1, None, 2))), [[(("batch", 3, 7), F32)]]),
        (ops.GetItem((slice(None), None, -1)), [[(("batch", "seq", 4), F32)], [(("batch", 3), I32)]]),
        (ops.GetItem((slice(None), slice(None, 2))), [[(("batch", "seq", 4), F32)]]),
    ],
    "neg": [(ops.Neg(), [[(("batch", 4), F32)], [((3,), I32)]])],
    "identity": [(ops.Identity(), [[(("batch", 4), F32)], [((3,), BOOL)]])],
    "where": [
        (ops.Where(), [[(("batch", 4), BOOL), (("batch", 4), F32), ((4,), F32)]]),
        (ops.Where(y_constant=0.0), [[(("batch", 1), BOOL), (("batch", 4), BF16)]]),
        (ops.Where(x_constant=-1), [[((3,), BOOL), ((2, 3), I32)]]),
    ],
    "pad": [
        (ops.Pad(((0, 0), (1, 2))), [[(("batch", 4), F32)]]),
        (ops.Pad(((0, 0), (2, 1), (0, 0)), mode="reflect"), [[(("batch", 4, 3), BF16)]]),
    ],
    "squeeze": [(ops.Squeeze(1), [[(("batch", 1, 4), F32)]]), (ops.Squeeze((0, -1)), [[((1, 3, 1), BF16)]])],
    "expand_dims": [(ops.ExpandDims(1), [[(("batch", 4), F32)]]), (ops.ExpandDims((0, -1)), [[((3,), I32)]])],
    "sum": [(ops.Sum(), [[(("batch", 4), F32)]]), (ops.Sum((1, 2), keepdims=True), [[(("batch", 3, 4), BF16)]]),
            (ops.Sum(-1), [[((2, 3), BOOL)], [((2, 3), I32)]])],
    "mean": [(ops.Mean(1), [[(("batch", 4), F32)], [((2, 3, 4), BF16)]])],
    "max": [(ops.Max(0, keepdims=True), [[(("batch", 4), F32)], [((2, 3), I32)]])],
    "arange": [(ops.Arange(5), [[]]), (ops.Arange("seq", "float32"), [[]])],
    "broadcast_to": [(ops.BroadcastTo(("batch", 3, 4)), [[((1, 1, 4), F32)], [((3, 1), BF16)]])],
    "param": [(ops.Param((1, 1, 8)), [[]]), (ops.Param((3,), dtype=BF16), [[]])],
    "rotary_embedding": [
        (ops.RotaryEmbedding(), [[(("batch", 6, 4, 8), F32)], [(("batch", "seq", 8), BF16)],
                                 [(("batch", 6, 4), F32), ((6,), I32)],
                                 [(("batch", 6, 2, 4), F32), (("batch", 6), I32)]]),
    ],
    "aten.buffer": [(mg.aten.Buffer((2, 3), "float32"), [[]]), (mg.aten.Buffer((5,), "int32"), [[]])],
    "aten.mode": [(mg.aten.Mode(training=False), [[(("batch", 4), F32)], [((2, 3), I32)]]),
                  (mg.aten.Mode(training=True), [[(("batch", 3, 2), BF16)]])],
    "onnx.constant": [(Constant(encode_array(np.arange(6, dtype=np.int64).reshape(2, 3))), [[]]),
                      (Constant(encode_array(np.float32([0.5, -1.0]))), [[]])],
    # The cache is concrete (batch rows of max_length slots), and so are the tokens
    # written into it by lax.dynamic_update_slice: a prefill's or a step's.
    "cached_attention": [
        (ops.CachedAttention(2, 4, 8, max_length=16, batch=2),
         [[((2, 5, 8), F32), ((2, 5), I32), ((), I32), ((2, 16), BOOL)],
          [((2, 1, 8), BF16), ((2, 1), I32), ((), I32), ((2, 16), BOOL)]]),
        (ops.CachedAttention(4, 4, 6, max_length=8, batch=3, num_kv_heads=2, rope=True,
                             use_bias=False),
         [[((3, 5, 8), F32), ((3, 5), I32), ((), I32), ((3, 8), BOOL)]]),
    ],
    "quantized_cached_attention": [
        (ops.QuantizedCachedAttention(2, 4, 8, max_length=16, batch=2, scheme="int8"),
         [[((2, 5, 8), F32), ((2, 5), I32), ((), I32), ((2, 16), BOOL)]]),
        (ops.QuantizedCachedAttention(4, 4, 8, max_length=8, batch=3, num_kv_heads=2, rope=True,
                                      use_bias=False, scheme="int4_weight_only", group_size=4),
         [[((3, 1, 8), F32), ((3, 1), I32), ((), I32), ((3, 8), BOOL)]]),
    ],
    "function": [
        (ops.F(jnp.tanh), [[(("batch", 4), F32)], [((2, 3), BF16)]]),
        (ops.F(_two), [[(("batch", 4), F32), ((4, 3), F32)]]),
        (ops.F(_with_rng, needs_rng=True), [[(("batch", 4), F32)]]),
    ],
}


def library_ops():
    """Registered ops that belong to the library: their class is importable from its
    module (an op registered inside a doctest, such as the registry's own example, is
    not), minus the structural ones."""
    found = {}
    for name, cls in mg.ops.registered_ops().items():
        module = sys.modules.get(cls.__module__)
        if name in STRUCTURAL or getattr(module, cls.__name__, None) is not cls:
            continue
        found[name] = cls
    return found


def test_every_registered_op_has_cases():
    missing = sorted(set(library_ops()) - set(CASES))
    assert not missing, f"add shape-inference cases for the new ops {missing}"
    for name, cases in CASES.items():
        for layer, _ in cases:
            assert layer.op_name == name


def _specs(inputs):
    return [mg.TensorSpec.of(shape, dtype) for shape, dtype in inputs]


def _same_dim(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # jax raises for an inconclusive comparison of symbolic dims
        return False


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b))


def _eval_apply(layer, specs, inference_mode):
    def structs(declared):
        # Weights are created in the policy's param_dtype (float32) unless their spec
        # fixes their dtype (a quantized layer's); a layer with several
        # weight groups (attention) nests them one level.
        return {k: structs(v) if isinstance(v, dict) else
                jax.ShapeDtypeStruct(v.shape, v.dtype if v.dtype is not None else jnp.float32)
                for k, v in declared.items()}

    params, state = structs(layer.param_specs(specs)), structs(layer.state_specs(specs))

    def run(params, state, inputs, rng):
        outs, new_state = layer.apply(params, state, inputs, rng=rng, inference_mode=inference_mode)
        return tuple(outs), dict(new_state)

    outs, new_state = jax.eval_shape(run, params, state, [s.to_jax() for s in specs],
                                     jax.random.key(0))
    return outs, new_state, state


def _all_cases():
    for name in sorted(CASES):
        for i, (layer, input_lists) in enumerate(CASES[name]):
            for j, inputs in enumerate(input_lists):
                yield pytest.param(layer, inputs, id=f"{name}-{i}-{j}")


@pytest.mark.parametrize("layer, inputs", list(_all_cases()))
def test_infer_matches_eval_shape_of_apply(layer, inputs):
    specs = _specs(inputs)
    inferred = layer.infer(specs)
    for inference_mode in (False, True):
        outs, new_state, state = _eval_apply(layer, specs, inference_mode)
        assert len(outs) == len(inferred)
        for out, spec in zip(outs, inferred):
            assert np.dtype(out.dtype) == spec.dtype, (layer, specs, out, spec)
            assert _same_shape(tuple(out.shape), tuple(spec.shape)), (layer, specs, out.shape, spec)
        assert jax.tree.structure(new_state) == jax.tree.structure(state)
        for got, want in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
            assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype


@pytest.mark.parametrize("layer, shape", [
    (ops.Conv(4, (3, 3)), ("batch", "h", "w", 3)),
    (ops.Conv(4, (3, 3), dilation=2, data_format="NCHW"), ("batch", 3, "h", "w")),
    (ops.Conv(4, (3, 3), strides=2, padding=((1, 0), (2, 2)), dilation=2), ("batch", "h", "w", 3)),
    (ops.MaxPool((3, 3), strides=1), ("batch", "h", "w", 3)),
], ids=["conv_valid", "conv_nchw_dilated", "conv_explicit_strided", "max_pool_stride1"])
def test_infer_matches_eval_shape_with_symbolic_spatial_dims(layer, shape):
    # Symbolic spatial dims, as in examples.residual_block's ("batch", "height", "width", C).
    specs = _specs([(shape, F32)])
    (inferred,) = layer.infer(specs)
    (out,), _, _ = _eval_apply(layer, specs, True)
    assert _same_shape(tuple(out.shape), tuple(inferred.shape)), (tuple(out.shape), inferred)
