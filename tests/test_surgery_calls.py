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


def test_a_layers_path_names_its_own_call_not_the_tied_heads(gpt2):
    g, _, _ = gpt2
    seen = []

    def lookup(layer, ids):
        seen.append(ids.dtype)
        return ops.Embedding(64, 32, name="wte_new")(ids)

    g2 = g.replace("wte", lookup)
    assert seen == [np.dtype("int32")]  # the lookup's call only
    # the head, the layer's one call left, takes its name; its weights keep their path
    assert [(n.name, n.layer) for n in g2.nodes if "wte" in n.name] == [("wte_new", "wte_new"),
                                                                         ("wte", "wte")]
    assert g2.select("wte*") == ["wte_new", "wte"]
    with pytest.raises(mg.GraphError, match=r"layer 'wte' is also called as 'wte@1' \(sharing its "
                       r"weights\).*\['wte', 'wte@1'\].*name=\.\.\."):
        g.replace("wte", lambda layer, ids: ops.Embedding(64, 32)(ids))


def test_surgery_takes_block_paths_and_further_calls_as_capture_does(gpt2):
    g, params, state = gpt2
    probed = g.insert_after("h.*", lambda y: ops.LayerNorm(name="probe")(y))
    assert [n.name for n in probed.nodes][6:10] == ["h.0", "probe", "h.1", "probe_1"]
    # the last block's output zeroed: ln_f gives its bias, the tied head bias @ wte.T
    zeroed = g.insert_after("h.3", lambda y: y * 0.0)
    out, _ = mg.compile(zeroed).apply(params, state, IDS, inference_mode=True)
    want = np.asarray(params["ln_f"]["bias"]) @ np.asarray(params["wte"]["embedding"]).T
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-5, atol=1e-5)
    # the tied head's call by its own path
    head = g.insert_after("wte@1", lambda logits: ops.softmax(logits))
    plain, _ = mg.compile(g).apply(params, state, IDS, inference_mode=True)
    probs, _ = mg.compile(head).apply(params, state, IDS, inference_mode=True)
    e = np.exp(np.asarray(plain) - np.asarray(plain).max(-1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_function_of_the_wrong_signature_is_an_error_stating_the_expected_one(gpt2):
    g, _, _ = gpt2
    with pytest.raises(mg.GraphError, match=r"replace calls its function as fn\(layer, x\) at "
                       r"'h.0/mlp.act'.*<lambda>\(x\): too many positional arguments"):
        g.replace("h.0/mlp.act", lambda x: ops.relu(x))
    with pytest.raises(mg.GraphError, match=r"insert_before calls its function as fn\(x0, x1\) at "
                       r"'h.0/add' \(a layer of 2 inputs"):
        g.insert_before("h.0/add", lambda x: x)
    with pytest.raises(mg.GraphError, match=r"insert_after calls its function as fn\(y\) at 'ln_f'"):
        g.insert_after("ln_f", lambda: None)


def test_select_takes_a_layer_class_and_names_the_layer_a_predicate_fails_on(gpt2):
    g, _, _ = gpt2
    assert g.select("h.0/*", op=ops.Linear) == g.select("h.0/*", op="linear") == [
        "h.0/mlp.c_fc", "h.0/mlp.c_proj"]
    assert g.select(op=[ops.LayerNorm, "gelu"])[:3] == ["h.0/ln_1", "h.0/ln_2", "h.0/mlp.act"]
    with pytest.raises(mg.GraphError, match=r"op=\.\.\.\) takes a registered op name or a layer class"):
        g.select(op=int)
    with pytest.raises(mg.GraphError, match=r"raised AttributeError on layer 'arange' \(op arange, "
                       r"Arange\): .*getattr\(layer, name, None\)"):
        g.select(where=lambda layer: layer.features > 32)
    assert g.select(where=lambda layer: getattr(layer, "features", 0) > 32) == [
        f"h.{i}/mlp.c_fc" for i in range(4)]
