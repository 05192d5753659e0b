"""How surgery calls the user's function and which layers it accepts: one call per
selected layer, layers of several inputs not removed, shared layers, signatures."""

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

CONFIG = {"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}
IDS = (np.arange(16, dtype=np.int32).reshape(2, 8) * 5) % 64


@pytest.fixture(scope="module")
def gpt2():
    g = mg.models.gpt2(CONFIG)
    params, state = mg.compile(g).init(jax.random.key(0))
    return g, params, state


def test_the_function_is_called_once_per_selected_layer_of_equal_blocks(gpt2):
    g, _, _ = gpt2
    scales = iter([1.0, 2.0, 3.0, 4.0])
    g2 = g.insert_after("h.*/attn", lambda y: y * next(scales))
    constants = [[n.op.constant for n in g2.node(f"h.{i}").op.graph.nodes if n.op.op_name == "mul"]
                 for i in range(4)]
    assert constants == [[1.0], [2.0], [3.0], [4.0]]
    # changed alike, equal blocks stay equal and still fold into one scan
    same = g.insert_after("h.*/attn", lambda y: ops.tanh(y))
    names = [n.name for n in mg.compile(same, scan_blocks="always").graph.nodes]
    assert "h.0..h.3" in names


def test_remove_refuses_a_layer_of_several_inputs(gpt2):
    g, _, _ = gpt2
    with pytest.raises(mg.GraphError, match=r"in block 'h.0': layer 'add' \(op add\): remove takes "
                       r"out a layer of one input.*reads 2.*replace\('h.0/add', lambda layer, \*xs: xs\[0\]\)"):
        g.remove("h.0/add")
