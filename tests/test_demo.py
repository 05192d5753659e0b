"""The demo: a CNN trained on scikit-learn's bundled digits reaches the promised test
accuracy in float32 and under the bfloat16 policy, and writes its outputs."""

import os

import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.cli.main import main
from mlaxgraph.cli.demo import train_digits
from mlaxgraph.examples import load_digits


def test_digits_split_is_the_bundled_data():
    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.shape == (1437, 8, 8, 1) and x_test.shape == (360, 8, 8, 1)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert sorted(np.unique(y_test)) == list(range(10))


@pytest.mark.parametrize("policy,target", [(None, 0.97), ("bfloat16", 0.96)])
def test_demo_model_reaches_its_test_accuracy(policy, target):
    result = train_digits(mg.Policy.named(policy) if policy else None, epochs=8, progress=False)
    assert result.test_accuracy >= target, result.history
    assert result.trainer.trace_counts["train_step"] == 1
    if policy:
        assert str(result.trainer.model.graph.node("stem").outputs[0].dtype) == "bfloat16"


def test_demo_command_writes_graph_hlo_weights_and_checkpoints(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--epochs", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trainable params: 7,434" in text and "test accuracy" in text
    assert sorted(os.listdir(out)) == ["checkpoints-float32", "digits_cnn.mlg", "graph.svg",
                                       "model.stablehlo.mlir"]
    assert (out / "graph.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert "stablehlo.convolution" in (out / "model.stablehlo.mlir").read_text()
    graph, params, state = mg.load(out / "digits_cnn.mlg")
    assert graph.name == "residual_cnn" and params["logits"]["kernel"].shape == (256, 10)
    assert sorted(os.listdir(out / "checkpoints-float32")) == [
        "checkpoint_00000044.safetensors", "checkpoint_00000088.safetensors"]
    # Running again resumes from the checkpoint: nothing left to train.
    assert main(["demo", "--epochs", "2", "--out", str(out)]) == 0
    assert "resuming from the checkpoint of step 88" in capsys.readouterr().out
