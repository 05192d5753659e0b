"""Graph surgery on the zoo's models: select, replace, insert_after, insert_before and
remove; init's reuse; the changed graphs saved and loaded. Numbers are checked against
the unchanged model or a graph built by hand to compute the same thing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

CONFIG = {"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}
IDS = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7) % 64


@pytest.fixture(scope="module")
def gpt2():
    g = mg.models.gpt2(CONFIG)
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    return g, model, params, state


@pytest.fixture(scope="module")
def resnet():
    g = mg.models.resnet18(10, image_size=32, width=8)
    model = mg.compile(g)
    params, state = model.init(jax.random.key(1))
    return g, model, params, state


def leaves(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(leaves(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: tree}


def assert_kept_bit_for_bit(new, old, changed=()):
    """Every weight of ``new`` whose path ``old`` has (and is not in ``changed``) is
    the same array, bit for bit."""
    new_leaves, old_leaves = leaves(new), leaves(old)
    for path, value in new_leaves.items():
        if path in old_leaves and not any(path.startswith(c) for c in changed):
            np.testing.assert_array_equal(np.asarray(value), np.asarray(old_leaves[path]), err_msg=path)


# --- select -------------------------------------------------------------------------


def test_select_by_pattern_op_and_predicate(gpt2):
    g = gpt2[0]
    assert g.select("h.*/attn") == [f"h.{i}/attn" for i in range(4)]
    assert g.select("h.1/mlp.*") == ["h.1/mlp.c_fc", "h.1/mlp.act", "h.1/mlp.c_proj", "h.1/mlp.dropout"]
    assert g.select("**/mlp.act") == [f"h.{i}/mlp.act" for i in range(4)]
    assert g.select("*") == [p for p in g.select() if "/" not in p]  # '*' stays at the top
    assert g.select(op="linear") == [f"h.{i}/mlp.{n}" for i in range(4) for n in ("c_fc", "c_proj")]
    assert g.select(op=("layer_norm", "embedding"))[:2] == ["wpe", "wte"]
    wide = g.select(where=lambda layer: getattr(layer, "features", 0) == 128)
    assert wide == [f"h.{i}/mlp.c_fc" for i in range(4)]
    assert g.select("h.9/*") == []  # an empty selection is no error
    with pytest.raises(mg.GraphError, match="'lienar' is no registered op.*'linear'"):
        g.select(op="lienar")
    # a glob of op names: the registered names it matches
    assert g.select(op="layer_*") == g.select(op="layer_norm") == [f"h.{i}/ln_{k}" for i in range(4)
                                                                   for k in (1, 2)] + ["ln_f"]
    quantized = mg.quantize(g, "int8_weight_only")
    assert quantized.select(op="quantized_*") == quantized.select(
        op=("quantized_linear", "quantized_embedding", "quantized_multi_head_attention")) != []
    with pytest.raises(mg.GraphError, match="'quantised_\\*' is no registered op.*'quantized_linear'"):
        g.select(op="quantised_*")


def test_acting_on_nothing_names_near_paths(gpt2):
    g = gpt2[0]
    with pytest.raises(mg.GraphError, match=r"no layer 'h.1/mlp.ac'.*near names: h.1/mlp.act"):
        g.replace("h.1/mlp.ac", lambda layer, x: x)
    with pytest.raises(mg.GraphError, match=r"no layer 'h\.1/mlp'; 'h\.1/mlp' is a module, not a "
                                            r"layer: its layers are mlp\.c_fc, .*'h\.1/mlp\.\*'"):
        g.replace("h.1/mlp", lambda layer, x: x)
    with pytest.raises(mg.GraphError, match="pattern 'h.*/atn' matches no layer.*h.0/attn"):
        g.remove("h.*/atn")
    with pytest.raises(mg.GraphError, match="the selection is empty"):
        g.remove(g.select("h.9/*"))
    # a pattern of blocks, where layers are wanted (lora's targets): their layers named
    with pytest.raises(mg.GraphError, match=r"pattern 'h\.\*' matches no layer of graph 'gpt2'; it "
                                            r"matches blocks \(h\.0, h\.1, h\.2, h\.3\): select their "
                                            r"layers \(h\.\*/\*\)"):
        mg.lora(g, "h.*", rank=2)
    # a block's path names the block's call: removing it takes the whole block out
    assert [n.name for n in g.remove("h.1").nodes if n.name.startswith("h.")] == ["h.0", "h.2", "h.3"]


# --- replace on GPT-2 -----------------------------------------------------------------


def test_swap_an_activation_in_one_block_only(gpt2):
    g, model, params, state = gpt2
    g2 = g.replace("h.1/mlp.act", lambda layer, x: ops.relu(x))
    assert g.node("h.1").op.graph.node("mlp.act").op.op_name == "gelu"  # g unchanged
    inner = g2.node("h.1").op.graph
    assert inner.node("mlp.act").op.op_name == "relu"  # the new layer takes the old name
    for i in (0, 2, 3):  # the other calls keep the very same block graph
        assert g2.node(f"h.{i}").op.graph is g.node(f"h.{i}").op.graph
    folded = mg.compile(g2, scan_blocks="always").graph
    assert [n.name for n in folded.nodes if n.name.startswith("h.")] == ["h.0", "h.1", "h.2..h.3"]

    m2 = mg.compile(g2)
    p2, s2 = m2.init(jax.random.key(5), reuse=(params, state))
    assert_kept_bit_for_bit(p2, params)
    assert m2.reuse_report(params, state).new == ()
    # Before h.1's activation nothing changed; after it, h.1's MLP computes relu: a
    # hand-written check of block h.1's MLP from the captured values.
    _, _, base = model.apply(params, state, IDS, inference_mode=True, capture=["h.0", "h.1/ln_2"])
    out, _, got = m2.apply(p2, s2, IDS, inference_mode=True,
                           capture=["h.0", "h.1/ln_2", "h.1/mlp.c_proj"])
    np.testing.assert_array_equal(got["h.0"], base["h.0"])
    np.testing.assert_array_equal(got["h.1/ln_2"], base["h.1/ln_2"])
    fc, proj = params["h.1"]["mlp.c_fc"], params["h.1"]["mlp.c_proj"]
    x = np.asarray(got["h.1/ln_2"], np.float64)
    want = np.maximum(x @ np.asarray(fc["kernel"], np.float64) + np.asarray(fc["bias"], np.float64), 0)
    want = want @ np.asarray(proj["kernel"], np.float64) + np.asarray(proj["bias"], np.float64)
    np.testing.assert_allclose(got["h.1/mlp.c_proj"], want, rtol=1e-4, atol=1e-5)
    base_out, _ = model.apply(params, state, IDS, inference_mode=True)
    assert not np.allclose(out, base_out)


def test_module_paths_with_slashes_name_the_same_layers(gpt2):
    """A layer named after its Hugging Face module path (``mlp.act``) is also reached
    with ``/`` for its dots (``h.3/mlp/act``, api.md's spelling); block names keep
    theirs, so ``*/mlp/*`` names every block's MLP layers."""
    g, model, params, state = gpt2
    assert g.select("*/mlp/*") == [f"h.{i}/mlp.{n}" for i in range(4)
                                   for n in ("c_fc", "act", "c_proj", "dropout")]
    assert g.select("h.3/mlp/act") == ["h.3/mlp.act"]
    assert g.select("h.*/mlp/c_*", op="linear") == g.select(op="linear")
    g2 = g.replace("h.3/mlp/act", lambda layer, x: ops.relu(x))
    assert g2.node("h.3").op.graph.node("mlp.act").op.op_name == "relu"
    assert g2.node("h.2").op.graph is g.node("h.2").op.graph
    # capture and intervene take the spelling too; a path captured is keyed as written
    _, _, got = model.apply(params, state, IDS, inference_mode=True,
                            capture=["h.3/mlp/act", "h.3/mlp.c_fc", "h.0/mlp/*"])
    assert set(got) == {"h.3/mlp/act", "h.3/mlp.c_fc", "h.0/mlp.c_fc", "h.0/mlp.act",
                        "h.0/mlp.c_proj", "h.0/mlp.dropout"}
    x = np.asarray(got["h.3/mlp.c_fc"], np.float64)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))  # gelu_new
    np.testing.assert_allclose(got["h.3/mlp/act"], gelu, rtol=1e-5, atol=1e-6)
    _, _, seen = model.apply(params, state, IDS, inference_mode=True, capture=["h.3/mlp.act"],
                                  intervene={"h.3/mlp/act": lambda v: 0 * v})
    np.testing.assert_array_equal(seen["h.3/mlp.act"], 0)
    # a typo is still an error naming the layers near it
    with pytest.raises(mg.GraphError, match="near names: h.3/mlp.act"):
        g.replace("h.3/mlp/actt", lambda layer, x: ops.relu(x))
    adapted = mg.lora(g, "h.*/mlp/c_fc", rank=2)
    assert adapted.select("**/*lora_A") == [f"h.{i}/mlp.c_fc.lora_A" for i in range(4)]


def test_insert_a_layer_norm_after_each_attention(gpt2):
    g, model, params, state = gpt2
    g2 = g.insert_after("h.*/attn", lambda y: ops.LayerNorm(name="probe")(y))
    assert g2.select("**/probe") == [f"h.{i}/probe" for i in range(4)]
    inner = g2.node("h.0").op.graph
    assert inner.node("attn.resid_dropout").inputs[0].node == "probe"
    m2 = mg.compile(g2, scan_blocks="always")
    assert [n.name for n in m2.graph.nodes if n.name.startswith("h.")] == ["h.0..h.3"]
    report = mg.compile(g2).reuse_report(params, state)
    assert set(report.new) == {f"h.{i}/probe/{w}" for i in range(4) for w in ("scale", "bias")}
    assert report.dropped == () and len(report.kept) == len(leaves(params))
    p2, s2 = mg.compile(g2).init(jax.random.key(3), reuse=(params, state))
    assert_kept_bit_for_bit(p2, params)
    # The probe normalises attention's output: check it against NumPy.
    _, _, got = mg.compile(g2).apply(p2, s2, IDS, inference_mode=True, capture=["h.2/attn", "h.2/probe"])
    a = np.asarray(got["h.2/attn"], np.float64)
    mean, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    want = (a - mean) / np.sqrt(var + 1e-5) * np.asarray(p2["h.2"]["probe"]["scale"]) + np.asarray(
        p2["h.2"]["probe"]["bias"])
    np.testing.assert_allclose(got["h.2/probe"], want, rtol=1e-4, atol=1e-5)


def test_remove_dropouts_leaves_inference_unchanged(gpt2):
    g, model, params, state = gpt2
    g2 = g.remove(g.select(op="dropout"))
    assert g2.select(op="dropout") == []
    m2 = mg.compile(g2)
    # attention's own dropout is left: only the Dropout layers went
    assert m2.program.random_paths() == [f"h.{i}/attn" for i in range(4)]
    out, _ = m2.apply(params, state, IDS, inference_mode=True)
    want, _ = model.apply(params, state, IDS, inference_mode=True)
    np.testing.assert_array_equal(out, want)


def test_replace_a_linear_by_a_bottleneck(gpt2):
    g, model, params, state = gpt2

    def bottleneck(layer, x):
        return ops.Linear(layer.features, name="up")(ops.Linear(8, name="down")(x))

    g2 = g.replace("h.2/mlp.c_fc", bottleneck)
    inner = g2.node("h.2").op.graph
    names = [n.name for n in inner.nodes]
    assert names[names.index("down"):names.index("down") + 3] == ["down", "up", "mlp.act"]
    assert "mlp.c_fc" not in names
    m2 = mg.compile(g2)
    report = m2.reuse_report(params, state)
    assert set(report.dropped) == {"h.2/mlp.c_fc/kernel", "h.2/mlp.c_fc/bias"}
    assert set(report.new) == {"h.2/down/kernel", "h.2/down/bias", "h.2/up/kernel", "h.2/up/bias"}
    p2, s2 = m2.init(jax.random.key(2), reuse=(params, state))
    assert_kept_bit_for_bit(p2, params)
    _, _, got = m2.apply(p2, s2, IDS, inference_mode=True, capture=["h.2/ln_2", "h.2/up"])
    x = np.asarray(got["h.2/ln_2"], np.float64)
    d, u = p2["h.2"]["down"], p2["h.2"]["up"]
    want = (x @ np.asarray(d["kernel"], np.float64) + np.asarray(d["bias"])) @ np.asarray(
        u["kernel"], np.float64) + np.asarray(u["bias"])
    np.testing.assert_allclose(got["h.2/up"], want, rtol=1e-4, atol=1e-5)


def test_the_old_layer_called_again_keeps_its_weights(gpt2):
    g, model, params, state = gpt2
    g2 = g.replace("h.0/mlp.c_proj", lambda layer, x: ops.tanh(layer(x)))
    inner = g2.node("h.0").op.graph
    assert inner.node("mlp.c_proj").op is g.node("h.0").op.graph.node("mlp.c_proj").op
    assert mg.compile(g2).reuse_report(params, state).new == ()


def test_insert_before_and_errors_name_the_rewrites_line(gpt2):
    g = gpt2[0]
    g2 = g.insert_before("ln_f", lambda x: 2.0 * x)
    assert g2.node("ln_f").inputs[0].node == "mul"
    with pytest.raises(mg.ShapeError) as info:
        g.replace("h.1/mlp.c_proj", lambda layer, x: ops.Linear(7)(x))  # the residual breaks
    assert f"test_surgery.py:{info.tb.tb_lineno}" in str(info.value) or "test_surgery.py" in str(info.value)
    assert "add" in str(info.value)
    with pytest.raises(mg.ShapeError, match="remove takes out a layer whose output has its first input's spec"):
        g.remove("h.1/mlp.c_fc")
    with pytest.raises(mg.GraphError, match="must return 1 symbolic tensor"):
        g.replace("ln_f", lambda layer, x: None)


def test_changed_graph_saves_and_loads(gpt2, tmp_path):
    g, _, params, state = gpt2
    g2 = g.insert_after("h.*/attn", lambda y: ops.LayerNorm(name="probe")(y)).remove(
        g.select(op="dropout"))
    m2 = mg.compile(g2)
    p2, s2 = m2.init(jax.random.key(3), reuse=(params, state))
    path = tmp_path / "changed.mlg"
    mg.save(path, g2, p2, s2)
    loaded, lp, ls = mg.load(path)
    assert loaded == g2
    assert_kept_bit_for_bit(lp, p2)


def test_layer_names_cannot_hold_path_separators():
    with pytest.raises(mg.ConfigError, match="'/'"):
        ops.Linear(3, name="a/b")
    # nor control characters: to_json and mg.save wrote them, from_json and mg.load refused
    for name in ("tab\tx", "line\nbreak", "bad\x02"):
        with pytest.raises(mg.ConfigError, match="cannot hold control characters"):
            ops.Linear(3, name=name)
        with pytest.raises(mg.GraphError, match="without control characters"):
            x = mg.Input(("batch", 4), name="x")
            mg.Graph(x, ops.Linear(2)(x), name=name)


# --- ResNet-18 ------------------------------------------------------------------------


def test_resnet_swap_activation_in_one_block(resnet):
    g, model, params, state = resnet
    g2 = g.replace("layer2.1/relu_1", lambda layer, x: ops.gelu(x))
    assert g2.node("layer2.0") == g.node("layer2.0")
    x = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
    m2 = mg.compile(g2)
    p2, s2 = m2.init(jax.random.key(9), reuse=(params, state))
    assert_kept_bit_for_bit(p2, params)
    assert_kept_bit_for_bit(s2, state)
    _, _, got = m2.apply(p2, s2, x, inference_mode=True, capture=["layer2.0", "layer2.1/add", "layer2.1"])
    _, _, base = model.apply(params, state, x, inference_mode=True, capture=["layer2.0"])
    np.testing.assert_array_equal(got["layer2.0"], base["layer2.0"])
    a = np.asarray(got["layer2.1/add"], np.float64)
    from math import erf
    want = 0.5 * a * (1 + np.vectorize(erf)(a / np.sqrt(2)))
    approx = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
    gelu = g2.node("layer2.1").op.graph.node("relu_1").op
    np.testing.assert_allclose(got["layer2.1"], approx if gelu.approximate else want, rtol=1e-4, atol=1e-5)


def test_resnet_remove_and_insert(resnet):
    g, model, params, state = resnet
    g2 = g.insert_after("layer1.0/bn2", lambda y: ops.Identity(name="tap")(y))
    assert "layer1.0/tap" in g2.select()
    g3 = g2.remove("layer1.0/tap")
    assert g3.node("layer1.0").op.graph == g.node("layer1.0").op.graph
    x = jax.random.normal(jax.random.key(4), (2, 32, 32, 3))
    out3, _ = mg.compile(g3).apply(params, state, x, inference_mode=True)
    out, _ = model.apply(params, state, x, inference_mode=True)
    np.testing.assert_array_equal(out3, out)


def test_a_file_naming_a_layer_with_a_path_separator_is_refused():
    x = mg.Input(("batch", 4), name="x")
    text = mg.Graph(x, ops.Linear(3, name="fc")(x)).to_json()
    with pytest.raises(mg.MlaxGraphError, match="'/'"):
        mg.Graph.from_json(text.replace('"fc"', '"a/b"'))


def test_a_block_of_a_graph_named_with_a_slash_gets_a_usable_name():
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Graph(x, ops.relu(x), name="enc/dec")
    y = mg.Input(("batch", 4), name="y")
    g = mg.Graph(y, inner(y))
    assert [n.name for n in g.nodes] == ["y", "enc_dec"]
    assert g.select() == ["enc_dec/relu"]


def test_a_replacement_named_as_the_layer_it_replaces_keeps_the_name(gpt2):
    # its name is free once it is replaced: it got mlp.c_fc_1, and to_state_dict wrote
    # h.0.mlp.c_fc_1.weight, a name transformers does not know
    g = gpt2[0]
    named = g.replace("h.0/mlp.c_fc", lambda layer, x: ops.Linear(256, name="mlp.c_fc")(x))
    assert named.select("h.0/mlp.*")[:2] == ["h.0/mlp.c_fc", "h.0/mlp.act"]
    params, state = mg.compile(named).init(jax.random.key(0))
    assert params["h.0"]["mlp.c_fc"]["kernel"].shape == (32, 256)
    # the old layer called again keeps the name: a new one named so is a clash, named
    with pytest.raises(mg.GraphError, match="two different layers are named 'mlp.c_fc'"):
        g.replace("h.0/mlp.c_fc", lambda layer, x: layer(x) + ops.Linear(128, name="mlp.c_fc")(x))


def test_globs_read_brackets_as_fnmatch_does():
    import fnmatch

    from mlaxgraph.ir.paths import path_matcher
    for pattern in ("h.[0/*", "h.0/attn[", "h.[^0]/attn", "h.[!0]/attn", "h.[01]/attn", "h.[0-1]/a*"):
        for path in ("h.0/attn", "h.1/attn", "h.^/attn", "h.[0/attn", "h.0/attn["):
            assert path_matcher(pattern)(path) == fnmatch.fnmatchcase(path, pattern), (pattern, path)


def test_a_surgery_function_reading_a_tensor_it_was_not_given_is_named():
    x = mg.Input(("batch", 4), name="x")
    g = mg.Graph(x, ops.Linear(4, name="fc2")(ops.Linear(4, name="fc1")(x)))
    with pytest.raises(mg.GraphError, match=r"insert_after's function read a tensor it was not given "
                                            r"\(input 'x'.*build its result from the tensors it gets"):
        g.insert_after("fc1", lambda y: y + x)
