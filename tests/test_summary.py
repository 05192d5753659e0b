"""graph.summary() and the compiled model's summary."""

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import residual_cnn


def test_summary_rows_and_totals():
    text = residual_cnn().summary()
    lines = text.splitlines()
    assert lines[2].split() == ["layer", "op", "output", "shape", "dtype", "params", "connected", "to"]
    row = next(line for line in lines if line.startswith("stem "))
    assert row.split() == ["stem", "conv", "[batch,8,8,16]", "f32", "160", "image"]
    # conv 3*3*1*16+16, bn 2*16, two 3x3x16x16 convs without bias, two bns, linear 256*10+10
    trainable = 160 + 32 + 2 * 2304 + 2 * 32 + 2570
    assert f"trainable params: {trainable:,} ({trainable * 4 / 1024:.1f} KiB)" in text
    assert "non-trainable params: 96 (384 B)" in text  # mean and var of three BatchNorms


def test_nested_blocks_collapsed_or_expanded():
    g = residual_cnn()
    collapsed, expanded = g.summary(), g.summary(expand_nested=True)
    assert "conv_a" not in collapsed
    row = next(line for line in expanded.splitlines() if line.startswith("  conv_a "))
    assert row.split() == ["conv_a", "conv", "[batch,height,width,16]", "f32", "2,304", "x"]


def test_shared_layers_are_marked():
    x = mg.Input(("batch", 4), name="x")
    dense = ops.Linear(4, name="dense")
    g = mg.Graph(x, dense(dense(x)))
    row = next(line for line in g.summary().splitlines() if line.startswith("dense@1"))
    assert "(shared with dense)" in row


def test_compiled_summary_shows_policy_casts_and_param_dtype():
    g = residual_cnn()
    text = mg.compile(g, mg.Policy(compute_dtype="bfloat16", param_dtype="bfloat16")).summary()
    assert "stem_f32      cast" in text and "image_bf16    cast" in text
    assert "trainable params: 7,434 (14.5 KiB)" in text  # two bytes a weight
    assert text.endswith("overrides={})")
