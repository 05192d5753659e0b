"""A file saved by release 0.1.0 (tests/fixtures/release_0_1_0.mlg, written by that
release's ``mg.save``) loads into an equal graph and equal weights: the graph built by
the same code today, and the weights today's ``init`` draws from the same key."""

import pathlib

import jax
import numpy as np

import mlaxgraph as mg
from mlaxgraph import examples, ops

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "release_0_1_0.mlg"


def _graph() -> mg.Graph:
    # The code that made the fixture, with release 0.1.0.
    x = mg.Input(("batch", 8, 16), name="tokens")
    block = examples.transformer_block(length=8, width=16, heads=2, mlp=32, causal=True)
    h = block.as_block("block0")(x)
    h = block.as_block("block1")(h)
    h = ops.BatchNorm(name="bn")(h)
    shared = ops.Linear(16, name="shared", kernel_axes=("embed", "mlp"))
    h = shared(ops.relu(shared(h)))
    y = ops.Conv(4, (3,), padding="SAME", name="conv")(h)
    return mg.Graph(x, ops.Flatten()(ops.MaxPool((2,))(y)), name="fixture")


def test_a_file_of_release_0_1_0_loads_into_an_equal_graph_and_weights():
    graph, params, state = mg.load(FIXTURE)
    assert graph == _graph()
    model = mg.compile(graph)
    want_params, want_state = model.init(jax.random.key(7))
    assert jax.tree.structure(params) == jax.tree.structure(want_params)
    assert jax.tree.structure(state) == jax.tree.structure(want_state)
    for got, want in zip(jax.tree.leaves((params, state)), jax.tree.leaves((want_params, want_state))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    out, _ = model.apply(params, state, np.ones((2, 8, 16), np.float32), inference_mode=True)
    assert out.shape == (2, 16) and np.isfinite(np.asarray(out)).all()
