"""mg.from_torch on committed torch.export programs (tests/fixtures/torch, written by
tests/fixtures/torch/make.py with PyTorch): numerics against PyTorch's own outputs
stored beside them, the module hierarchy as blocks, state-dict names, scanned blocks,
and the errors. torch itself is not needed (``make test-torch`` runs it live)."""

from __future__ import annotations

import copy
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import mlaxgraph as mg
from mlaxgraph import examples
from mlaxgraph.aten.program import load_program
from mlaxgraph.aten.reader import read_program

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "torch")


def _load(name):
    folder = os.path.join(HERE, name)
    graph, params, state = mg.from_torch(folder)
    return graph, params, state, load_file(os.path.join(folder, "reference.safetensors"))


@pytest.mark.parametrize("name", ["small_cnn", "small_cnn_core", "tiny_transformer"])
def test_outputs_match_pytorch(name):
    graph, params, state, ref = _load(name)
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(ref["input_0"]), inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), ref["output_0"], rtol=1e-5, atol=1e-5)


def test_blocks_are_the_module_hierarchy():
    graph, params, _, _ = _load("small_cnn")
    paths = [path for path, _ in graph.walk()]
    for module in ("stem", "stem/0", "stem/1", "layer1", "layer1/0", "layer1/0/conv1",
                   "layer1/1/bn1", "layer1/1/conv2", "head"):
        assert module in paths
    assert graph.node("layer1").op.graph.node("0").op.graph.name == "Residual"
    assert graph.select(op="conv") == ["stem/0", "layer1/0/conv1", "layer1/0/conv2",
                                       "layer1/1/conv1", "layer1/1/conv2"]
    assert graph.node("head").op.op_name == "linear"
    # equal modules give equal graphs
    layer1 = graph.node("layer1").op.graph
    assert layer1.node("0").op.graph == layer1.node("1").op.graph


@pytest.mark.parametrize("name", ["small_cnn", "small_cnn_core", "tiny_transformer"])
def test_weights_under_the_state_dict_names(name):
    graph, params, state, _ = _load(name)
    tensors = load_file(os.path.join(HERE, name, "tensors.safetensors"))
    ours = mg.models.to_state_dict(graph, params, state)
    assert set(ours) == set(tensors)
    for key, value in tensors.items():
        np.testing.assert_array_equal(ours[key], value)
    # and back: a state dict loads into the graph's layout
    p2, s2 = mg.models.load_state_dict(graph, tensors)
    leaves = jax.tree_util.tree_leaves
    assert all(np.array_equal(a, b) for a, b in zip(leaves(p2), leaves(params)))
    assert all(np.array_equal(a, b) for a, b in zip(leaves(s2), leaves(state)))


def test_symbolic_batch_and_scanned_blocks():
    graph, params, state, ref = _load("tiny_transformer")
    assert str(graph.input_specs[0]) == "i32[batch,8]"
    x = np.asarray(ref["input_0"])
    three = jnp.asarray(np.concatenate([x, x[:1]]))
    model = mg.compile(graph)
    out, _ = model.apply(params, state, three, inference_mode=True)
    np.testing.assert_allclose(np.asarray(out)[:2], ref["output_0"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out)[2], ref["output_0"][0], rtol=1e-5, atol=1e-5)
    assert graph.select("h.*/attn/qkv") == ["h.0/attn/qkv", "h.1/attn/qkv", "h.2/attn/qkv"]
    scanned = mg.compile(graph, scan_blocks="always")
    assert [n.op.op_name for n in scanned.graph.nodes].count("scan") == 1
    p2, s2 = scanned.stack_weights(params, state)
    out2, _ = scanned.apply(p2, s2, jnp.asarray(x), inference_mode=True)
    np.testing.assert_allclose(np.asarray(out2), ref["output_0"], rtol=1e-5, atol=1e-5)


def test_hlo_by_layer_names_module_paths():
    graph, params, state, ref = _load("small_cnn")
    rows = mg.compile(graph).hlo_by_layer(jnp.asarray(ref["input_0"]), inference_mode=True)
    text = str(rows)
    assert "layer1/0/conv1" in text and "layer1/1/bn1" in text


def test_flops_and_summary_of_aten_ops():
    graph, _, _, _ = _load("tiny_transformer")
    cost = mg.compile(graph).cost_table(batch=2)
    rows = {row.layer: row for row in cost.rows}
    # 2 * batch * heads * seq * seq * head_dim for Q K^T, as much for P V
    assert rows["h.0/attn/scaled_dot_product_attention"].flops == 4 * 2 * 4 * 8 * 8 * 8
    # the linear layers: 2 * batch * seq * in * out
    assert rows["h.1/attn/qkv"].flops == 2 * 2 * 8 * 32 * 96 + 2 * 8 * 96
    assert rows["h.2/mlp/1"].op == "aten.gelu.default"


def _record(name):
    return load_program(os.path.join(HERE, name))


def test_unsupported_op_names_the_op_and_module():
    record, tensors = _record("small_cnn")
    record = copy.deepcopy(record)
    node = next(n for n in record["nodes"] if n["target"] == "aten.relu.default")
    node["target"] = "aten.special_bessel_j0.default"
    with pytest.raises(mg.GraphError, match=r"aten\.special_bessel_j0\.default.*module stem\.2"):
        read_program(record, tensors)


def test_data_dependent_size_is_a_shape_error():
    record, tensors = _record("small_cnn")
    record = copy.deepcopy(record)
    node = next(n for n in record["nodes"] if n["target"] == "aten.flatten.using_ints")
    node["outputs"][0]["shape"] = [{"sym": "u0"}, 8]
    with pytest.raises(mg.ShapeError, match=r"node 'flatten'.*depends on the data"):
        read_program(record, tensors)


def test_damaged_and_foreign_folders(tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(os.path.join(HERE, "small_cnn"), folder)
    (folder / "program.json").write_text("{not json")
    with pytest.raises(mg.SerializationError, match="not JSON"):
        mg.from_torch(str(folder))
    record = json.loads(open(os.path.join(HERE, "small_cnn", "program.json")).read())
    record["version"] = 99
    (folder / "program.json").write_text(json.dumps(record))
    with pytest.raises(mg.SerializationError, match="version"):
        mg.from_torch(str(folder))
    del record["nodes"]
    record["version"] = 1
    (folder / "program.json").write_text(json.dumps(record))
    with pytest.raises(mg.SerializationError, match="nodes"):
        mg.from_torch(str(folder))
    with pytest.raises(mg.SerializationError, match="program.json"):
        mg.from_torch(str(tmp_path))
    # a checkpoint file given where a program folder goes (it said NotADirectoryError)
    (tmp_path / "model.pth").write_bytes(b"PK")
    with pytest.raises(mg.SerializationError, match=r"reads a program folder.*is a file.*"
                                                    r"mg.models.load_state_dict"):
        mg.from_torch(str(tmp_path / "model.pth"))
    shutil.copy(os.path.join(HERE, "small_cnn", "program.json"), folder / "program.json")
    (folder / "tensors.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(mg.SerializationError, match="tensors"):
        mg.from_torch(str(folder))


def test_saved_graph_round_trips(tmp_path):
    graph, params, state, ref = _load("small_cnn_core")
    path = tmp_path / "m.mlg"
    mg.save(path, graph, params, state)
    g2, p2, s2 = mg.load(path)
    assert g2 == graph
    out, _ = mg.compile(g2).apply(p2, s2, jnp.asarray(ref["input_0"]), inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), ref["output_0"], rtol=1e-5, atol=1e-5)


def _modules(name):
    """The program's module paths and each one's class, from its nodes' module stacks."""
    record, _ = _record(name)
    return {path: kind for node in record["nodes"] for path, kind in node["stack"]}


@pytest.mark.parametrize("name", ["small_cnn", "tiny_transformer"])
def test_explorer_shows_the_module_hierarchy(name):
    from mlaxgraph.render.html.payload import graph_payload, walk_payload

    graph, _, _, _ = _load(name)
    modules = _modules(name)
    items = list(walk_payload(graph_payload(graph, fold=False)["root"]))
    ids = {item["id"].partition("@")[0].replace("/", "."): item for item in items}
    blocks = {i for i, item in ids.items() if "sub" in item}
    # every block the explorer draws is a module, every module is drawn (a block, or
    # the layer it is: a Conv2d as conv, a ReLU as its one operation)
    assert blocks <= set(modules) and blocks
    assert set(modules) <= set(ids), sorted(set(modules) - set(ids))
    walked = {path: node for path, node in graph.walk()}
    for path in blocks:  # a block's graph is named by its module's class
        assert walked[ids[path]["id"]].op.graph.name == modules[path]


def test_hlo_by_layer_attributes_by_module():
    graph, params, state, ref = _load("small_cnn")
    modules = _modules("small_cnn")
    model = mg.compile(graph)
    by_layer = model.hlo_by_layer(jnp.asarray(ref["input_0"]), inference_mode=True)
    ops = {path.replace("/", "."): [str(op) for op in found] for path, found in by_layer.items()}
    convs = [path for path, kind in modules.items() if kind == "Conv2d"]
    assert len(convs) == 5
    for path in convs:  # each Conv2d module owns its convolution
        assert any("convolution" in op for op in ops[path]), (path, ops[path])
    assert any("dot" in op for op in ops["head"])
    # every layer's operations are attributed to a module: the layer is one, or one of
    # its module's own operations (the top module's included)
    for path in by_layer:
        module = path.partition("@")[0].replace("/", ".")
        parent = path.rpartition("/")[0].replace("/", ".")
        assert module in modules or parent in modules or "/" not in path, path
    # the explorer shows what hlo_by_layer gives for the same call (its defaults)
    nodes = {n["id"]: n for n in walk_payload_of(model)}
    shown = model.hlo_by_layer(optimized=True)
    assert nodes["layer1/0/conv1"]["hlo"] == [str(op) for op in shown["layer1/0/conv1"]]
    assert any("convolution" in op for op in nodes["layer1/0/conv1"]["hlo"])


def walk_payload_of(model):
    from mlaxgraph.render.html.payload import model_payload, walk_payload

    return list(walk_payload(model_payload(model, hlo=True, fold=False)["root"]))


def _in_train_mode(frozen=()):
    """small_cnn's program as torch.export writes the module in train mode, the
    BatchNorms named in ``frozen`` left in eval mode (``model.train(); bn.eval()``)."""
    record, tensors = _record("small_cnn")
    record = copy.deepcopy(record)
    for node in record["nodes"]:
        if node["target"] == "aten.batch_norm.default":
            node["args"][5] = node["stack"][-1][0] not in frozen
    return dict(record, training=False), tensors


def test_the_program_mode_is_carried_by_the_graph(tmp_path):
    graph, params, state, ref = _load("small_cnn")
    assert mg.aten.inference_mode(graph) is True
    assert graph.node("eval_mode").op == mg.aten.Mode(training=False)
    assert mg.aten.inference_mode(examples.mlp()) is None
    # the same program as exported in train mode (its BatchNorms called with
    # training=True, as torch.export writes them): inference_mode=False
    train, params, state = read_program(*_in_train_mode(), name="SmallCNN")
    assert mg.aten.inference_mode(train) is False
    assert train.node("train_mode").op.training
    x = jnp.asarray(ref["input_0"])
    _, new_state, seen = mg.compile(train).apply(params, state, x, inference_mode=False,
                                                 capture=["stem/0"])
    # the stem's BatchNorm (momentum 0.1) moves its statistics towards the batch's (NumPy)
    conv = np.asarray(seen["stem/0"], np.float64)
    n = conv.shape[0] * conv.shape[2] * conv.shape[3]
    mean, var = conv.mean(axis=(0, 2, 3)), conv.var(axis=(0, 2, 3)) * n / (n - 1)
    old = {k: np.asarray(v) for k, v in state["stem"]["1"].items()}
    np.testing.assert_allclose(new_state["stem"]["1"]["mean"], 0.9 * old["mean"] + 0.1 * mean,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state["stem"]["1"]["var"], 0.9 * old["var"] + 0.1 * var,
                               rtol=1e-5, atol=1e-6)
    # a saved graph keeps its mode
    mg.save(tmp_path / "train.mlg", train, params, state)
    assert mg.aten.inference_mode(mg.load(tmp_path / "train.mlg")[0]) is False


def test_a_frozen_batch_norm_in_a_train_mode_program_keeps_its_running_statistics():
    # model.train(); model.stem[1].eval(): that BatchNorm normalizes with its running
    # statistics and leaves them as they are, the others train (PyTorch's per-module mode)
    graph, params, state, ref = _load("small_cnn")
    train, p, s = read_program(*_in_train_mode(frozen=("stem.1",)), name="SmallCNN")
    assert mg.aten.inference_mode(train) is False
    x = jnp.asarray(ref["input_0"])
    _, new_state, seen = mg.compile(train).apply(p, s, x, inference_mode=False,
                                                 capture=["stem"])
    _, _, eval_seen = mg.compile(graph).apply(params, state, x, inference_mode=True,
                                              capture=["stem"])
    # the stem (conv, frozen BatchNorm, ReLU) computes as in eval mode (NumPy: the same
    # conv output normalized with the running statistics)
    np.testing.assert_allclose(seen["stem"], eval_seen["stem"], rtol=1e-6, atol=1e-6)
    sd = mg.models.to_state_dict(train, p, new_state)
    sd_eval = mg.models.to_state_dict(graph, params, state)
    for key in ("stem.1.running_mean", "stem.1.running_var"):
        np.testing.assert_array_equal(sd[key], sd_eval[key])
    assert not np.allclose(sd["layer1.0.bn1.running_mean"], sd_eval["layer1.0.bn1.running_mean"])
    # the module's state dict loads into it: the frozen statistics as the module's buffers
    p2, s2 = mg.models.load_state_dict(train, sd_eval)
    assert np.array_equal(mg.models.to_state_dict(train, p2, s2)["stem.1.running_var"],
                          sd_eval["stem.1.running_var"])


def test_the_decoder_reads_the_mode_marker_as_the_identity_it_is():
    # the marker is an ops.Identity: the decoder's refusal of the imported transformer
    # names the first operator it cannot see into, not the marker
    graph, _, _, _ = _load("tiny_transformer")
    assert isinstance(graph.node("eval_mode").op, mg.ops.Identity)
    with pytest.raises(mg.GraphError, match=r"layer 'add' \(op aten.add.Tensor\): the decoder "
                                            r"cannot cache this layer: an operator the rewrite "
                                            r"cannot see into .*mg.models.load_state_dict"):
        mg.decoder(graph, max_length=16)


def test_a_fixed_batch_error_points_a_torch_user_to_dynamic_shapes():
    graph, params, state, ref = _load("small_cnn")  # exported with a fixed batch of 2
    with pytest.raises(mg.ShapeError) as e:
        mg.compile(graph).apply(params, state, jnp.asarray(ref["input_0"][:1]), inference_mode=True)
    assert ("mg.from_torch gives an input the example's shape (2, 3, 16, 16) unless "
            "dynamic_shapes says otherwise" in str(e.value))
    assert 'dynamic_shapes=({0: torch.export.Dim("batch")},)' in str(e.value)
    assert "mg.Input" not in str(e.value)


def test_a_folder_without_its_tied_head_loads_the_head_from_the_embedding(tmp_path):
    # a save_pretrained folder of a tied model leaves out the head (lm_head.weight), and
    # its config.json says tie_word_embeddings: the head is the embedding's table
    from safetensors.numpy import save_file

    graph, _, _, _ = _load("tiny_transformer")
    tensors = load_file(os.path.join(HERE, "tiny_transformer", "tensors.safetensors"))
    del tensors["head.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(mg.SerializationError, match=r"'head.weight' is missing, and 'wte.weight' "
                                                    r"has its shape.*has no config.json beside it"):
        mg.models.load_state_dict(graph, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    with pytest.raises(mg.SerializationError, match=r"tie_word_embeddings=False"):
        mg.models.load_state_dict(graph, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    params, state = mg.models.load_state_dict(graph, tmp_path)
    ours = mg.models.to_state_dict(graph, params, state)
    np.testing.assert_array_equal(ours["head.weight"], tensors["wte.weight"])
    np.testing.assert_array_equal(ours["ln_f.weight"], tensors["ln_f.weight"])


def _program(nodes, inputs, tensors=None, outputs=None, mutations=None):
    """A program record of ``nodes`` (each ``(target, args[, outputs])``, named n0 ...) on user
    inputs ``{name: (shape, dtype)}`` and weights ``tensors`` (``{name: (kind, array)}``),
    returning the last node's outputs."""
    entries = [{"name": f"p_{k.replace('.', '_')}", "kind": kind, "target": k,
                "shape": list(a.shape), "dtype": str(a.dtype)} for k, (kind, a) in (tensors or {}).items()]
    entries += [{"name": k, "kind": "user_input", "target": None, "shape": list(shape), "dtype": dtype}
                for k, (shape, dtype) in inputs.items()]
    records = [{"name": f"n{i}", "target": t, "args": a, "kwargs": {}, "outputs": [None] * (n[0] if n else 1),
                "stack": [], "source": []} for i, (t, a, *n) in enumerate(nodes)]
    record = {"format": "mlaxgraph.torch_program", "version": 1, "torch": "2", "training": False,
              "inputs": entries, "nodes": records,
              "outputs": [{"ref": n} for n in mutations or {}] + (outputs or [{"ref": f"n{len(nodes) - 1}"}]),
              "mutations": mutations or {}, "dims": {}}
    record["user_outputs"] = list(range(len(mutations or {}), len(record["outputs"])))
    return read_program(record, {k: a for k, (_, a) in (tensors or {}).items()})


def _torch_nearest(x, out, factor):
    # PyTorch's nearest: source index floor(i * (1 / scale_factor)) in float32
    rows = [min(int(np.floor(np.float32(i) * np.float32(1 / factor[0]))), x.shape[2] - 1) for i in range(out[0])]
    cols = [min(int(np.floor(np.float32(j) * np.float32(1 / factor[1]))), x.shape[3] - 1) for j in range(out[1])]
    return x[:, :, rows][:, :, :, cols]


def test_resampling_maps_positions_as_pytorch():
    x = np.random.default_rng(0).normal(size=(1, 2, 8, 10)).astype(np.float32)
    ref = {"x": jnp.asarray(x)}
    cases = [
        # bilinear halving, half-pixel centres: the mean of each 2 x 2 block (no antialiasing)
        (("aten.upsample_bilinear2d.vec", [{"ref": "x"}, [4, 5], False, None]),
         x.reshape(1, 2, 4, 2, 5, 2).mean((3, 5))),
        (("aten.upsample_bilinear2d.vec", [{"ref": "x"}, None, False, [0.5, 0.5]]),
         x.reshape(1, 2, 4, 2, 5, 2).mean((3, 5))),
        # align_corners: the corners kept, a size of 1 per step between them
        (("aten.upsample_bilinear2d.vec", [{"ref": "x"}, [15, 19], True, None]),
         None),
        (("aten.upsample_nearest2d.vec", [{"ref": "x"}, None, [1.7, 1.7]]),
         _torch_nearest(x, (13, 17), (1.7, 1.7))),
        (("aten.upsample_nearest2d.vec", [{"ref": "x"}, None, [0.6, 0.6]]),
         _torch_nearest(x, (4, 6), (0.6, 0.6))),
    ]
    for node, expected in cases:
        graph, params, state = _program([node], {"x": ((1, 2, 8, 10), "float32")})
        out, _ = mg.compile(graph).apply(params, state, ref["x"], inference_mode=True)
        out = np.asarray(out)
        if expected is None:  # align_corners: out[2i, 2j] is x[i, j], midpoints the means
            np.testing.assert_allclose(out[:, :, ::2, ::2], x, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(out[:, :, 1::2, ::2], (x[:, :, :-1] + x[:, :, 1:]) / 2,
                                       rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_max_pool_indices_softmax_dtype_and_clamp_promotion():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 7, 9)).astype(np.float32)
    x[0, 0, :3, :3] = 1.0  # a tie: the first maximum
    graph, params, state = _program(
        [("aten.max_pool2d_with_indices.default", [{"ref": "x"}, [3, 3], [2, 2], [1, 1]], 2),
         ("getitem", [{"ref": "n0"}, 1])], {"x": (x.shape, "float32")})
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(x), inference_mode=True)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    expected = np.zeros((2, 3, 4, 5), np.int64)
    for i in range(4):
        for j in range(5):
            window = padded[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(2, 3, 9)
            a, b = np.unravel_index(window.argmax(-1), (3, 3))
            expected[:, :, i, j] = (2 * i + a - 1) * 9 + (2 * j + b - 1)
    np.testing.assert_array_equal(np.asarray(out), expected)

    h = (rng.normal(size=(2, 50)) * 4).astype(np.float16)
    graph, params, state = _program([("aten.softmax.int", [{"ref": "h"}, -1, {"dtype": "float32"}])],
                                    {"h": (h.shape, "float16")})
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(h), inference_mode=True)
    z = h.astype(np.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, np.exp(z - z.max(-1, keepdims=True)) / np.exp(
        z - z.max(-1, keepdims=True)).sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)

    n = np.arange(-4, 5, dtype=np.int32)
    graph, params, state = _program([("aten.clamp.default", [{"ref": "n"}, -2.5, 2.5])],
                                    {"n": (n.shape, "int64")})
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(n), inference_mode=True)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, np.clip(n.astype(np.float32), -2.5, 2.5))


def test_feature_dropout_draws_whole_channels_and_a_bare_layer_keeps_its_names():
    x = np.random.default_rng(2).uniform(1, 2, size=(4, 16, 5, 5)).astype(np.float32)
    graph, params, state = _program([("aten.feature_dropout.default", [{"ref": "x"}, 0.5, True])],
                                    {"x": (x.shape, "float32")})
    assert mg.aten.inference_mode(graph) is False  # the program drops: train mode
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(x), inference_mode=False,
                                     rng=jax.random.key(0))
    out = np.asarray(out)
    zero = (out == 0).all((2, 3))
    assert 0.2 < zero.mean() < 0.8 and not (out[~zero] == 0).any()
    np.testing.assert_allclose(out[~zero], 2 * x[~zero], rtol=1e-6)
    same, _ = mg.compile(graph).apply(params, state, jnp.asarray(x), inference_mode=True)
    np.testing.assert_array_equal(same, x)

    # nn.Linear(4, 3) given as the module: its weights at the top, "weight" and "bias"
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    b = np.array([1, 2, 3], np.float32)
    graph, params, state = _program(
        [("aten.linear.default", [{"ref": "x"}, {"ref": "p_weight"}, {"ref": "p_bias"}])],
        {"x": ((2, 4), "float32")}, {"weight": ("parameter", w), "bias": ("parameter", b)})
    xs = np.ones((2, 4), np.float32)
    out, _ = mg.compile(graph).apply(params, state, jnp.asarray(xs), inference_mode=True)
    np.testing.assert_allclose(out, xs @ w.T + b, rtol=1e-6)
    assert sorted(mg.models.to_state_dict(graph, params, state)) == ["bias", "weight"]


def test_a_buffer_the_module_updates_is_new_state():
    # self.ema.mul_(0.9).add_(0.1 * x.mean(0)); return x - self.ema, made functional: the
    # update is a buffer_mutation output, the new state of the buffer's layer
    x = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)
    ema = np.array([1, 2, 3, 4], np.float32)
    graph, params, state = _program(
        [("aten.mul.Tensor", [{"ref": "p_ema"}, 0.9]), ("aten.mean.dim", [{"ref": "x"}, [0]]),
         ("aten.mul.Tensor", [{"ref": "n1"}, 0.1]), ("aten.add.Tensor", [{"ref": "n0"}, {"ref": "n2"}]),
         ("aten.sub.Tensor", [{"ref": "x"}, {"ref": "n3"}])],
        {"x": (x.shape, "float32")}, {"ema": ("buffer", ema)}, mutations={"n3": "ema"})
    model = mg.compile(graph)
    expected = ema
    for _ in range(2):
        out, state = model.apply(params, state, jnp.asarray(x), inference_mode=False)
        expected = 0.9 * expected + 0.1 * x.mean(0)
        np.testing.assert_allclose(out, x - expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(mg.models.to_state_dict(graph, params, state)["ema"], expected,
                                   rtol=1e-6)
