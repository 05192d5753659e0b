"""mg.save / mg.load (mlaxgraph/io/save.py, weights.py): one safetensors file with the
graph JSON in its header; round trips of graphs and arrays (bfloat16 included); the
checks save makes before writing; and atomicity: a saving process killed with SIGKILL
at random times leaves the old or the new file, never a part of one."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.io import model_file as save_module
from mlaxgraph.io.model_file import expected_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXAMPLES = {
    "mlp": examples.mlp,
    "residual_cnn": examples.residual_cnn,
    "transformer_block": lambda: examples.transformer_block(causal=True, dropout=0.1),
    "lstm_classifier": examples.lstm_classifier,
}


def random_weights(graph, param_dtype="float32", seed=0):
    """Weights of the shapes and dtype init makes, random (without running init)."""
    rng = np.random.default_rng(seed)
    params, state = expected_weights(graph, param_dtype)
    make = lambda s: jnp.asarray(rng.standard_normal(s.shape).astype(np.float32)).astype(s.dtype)  # noqa: E731
    return jax.tree.map(make, params), jax.tree.map(make, state)


def assert_identical(tree, other):
    assert jax.tree.structure(tree) == jax.tree.structure(other)
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(other)):
        assert isinstance(b, jax.Array)
        assert a.dtype == b.dtype and a.shape == b.shape
        a, b = np.asarray(a), np.asarray(b)
        assert a.tobytes() == b.tobytes()  # bit for bit


def temp_files(directory):
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


@pytest.mark.parametrize("build", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_round_trip(build, tmp_path):
    graph = build()
    params, state = random_weights(graph)
    path = tmp_path / "model.mlg"
    assert mg.save(path, graph, params, state) is None
    loaded, params2, state2 = mg.load(path)
    assert loaded == graph
    assert_identical(params, params2)
    assert_identical(state, state2)
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("name", ["mlp", "residual_cnn", "transformer_block"])
def test_round_trip_of_a_compiled_bfloat16_model(name, tmp_path):
    policy = mg.Policy(param_dtype="bfloat16", compute_dtype="bfloat16")
    compiled = mg.compile(EXAMPLES[name](), policy).graph
    params, state = random_weights(compiled, "bfloat16")
    assert {a.dtype for a in jax.tree.leaves((params, state))} == {jnp.dtype(jnp.bfloat16)}
    mg.save(tmp_path / "m.mlg", compiled, params, state)
    loaded, params2, state2 = mg.load(tmp_path / "m.mlg")
    assert loaded == compiled and any(n.op.op_name == "cast" for _, n in loaded.walk())
    assert_identical(params, params2)
    assert_identical(state, state2)


def test_real_init_bfloat16_params_apply_the_same(tmp_path):
    graph = examples.mlp(12, (8,), 3)
    model = mg.compile(graph, mg.Policy(param_dtype="bfloat16", compute_dtype="bfloat16"))
    params, state = model.init(jax.random.key(0, impl="rbg"))
    assert params["dense"]["kernel"].dtype == jnp.bfloat16
    mg.save(tmp_path / "m.mlg", model.graph, params, state)
    graph2, params2, state2 = mg.load(tmp_path / "m.mlg")
    assert_identical(params, params2)
    x = jnp.linspace(-1, 1, 24, dtype=jnp.float32).reshape(2, 12)
    out, _ = model.apply(params, state, x)
    out2, _ = mg.compile(graph2).apply(params2, state2, x)
    assert out2.dtype == out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out2, np.float32))


def test_file_layout_is_plain_safetensors(tmp_path):
    graph = examples.residual_cnn()
    compiled = mg.compile(graph, mg.Policy(param_dtype="bfloat16")).graph
    params, state = random_weights(compiled, "bfloat16")
    path = tmp_path / "cnn.mlg"
    mg.save(path, compiled, params, state)
    with safetensors.safe_open(path, framework="numpy") as f:
        names = sorted(f.keys())
        meta = f.metadata()
        assert f.get_slice("params/stem/kernel").get_dtype() == "BF16"
        assert f.get_slice("params/stem/kernel").get_shape() == [16, 3, 3, 1]
        kernel = f.get_tensor("params/res1/conv_a/kernel")
    assert "params/res1/conv_a/kernel" in names and "state/res1/bn_a/mean" in names
    assert "state/stem_bn/var" in names and "params/logits/bias" in names
    assert all(n.startswith(("params/", "state/")) for n in names)
    np.testing.assert_array_equal(kernel, np.asarray(params["res1"]["conv_a"]["kernel"]))
    assert sorted(meta) == ["mlaxgraph.checksums", "mlaxgraph.format", "mlaxgraph.graph",
                            "mlaxgraph.header_checksum", "mlaxgraph.param_dtype",
                            "mlaxgraph.version"]
    assert meta["mlaxgraph.format"] == "mlaxgraph.model" and meta["mlaxgraph.version"] == "2"
    assert meta["mlaxgraph.param_dtype"] == "bfloat16"
    assert meta["mlaxgraph.graph"] == compiled.to_json()
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    assert header_len % 8 == 0
    header = json.loads(raw[8:8 + header_len])
    offsets = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert offsets[0][0] == 0 and offsets[-1][1] == len(raw) - 8 - header_len
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))  # no holes
    # The checksums: blake2b-128 of each array's bytes in the file, and of the header's
    # bytes with the header digest's own 32 hex digits written as zeros.
    data = raw[8 + header_len:]
    checksums = json.loads(meta["mlaxgraph.checksums"])
    assert sorted(checksums) == names
    for name in names:
        begin, end = header[name]["data_offsets"]
        assert checksums[name] == hashlib.blake2b(data[begin:end], digest_size=16).hexdigest()
    recorded = meta["mlaxgraph.header_checksum"]
    zeroed = raw[8:8 + header_len].replace(recorded.encode(), b"0" * 32)
    assert recorded == hashlib.blake2b(zeroed, digest_size=16).hexdigest()


def test_saving_to_a_folder_or_into_a_missing_one_names_it(tmp_path):
    x = mg.Input(("batch", 3), name="x")
    g = mg.Graph(x, ops.Linear(2, name="fc")(x))
    params, state = mg.compile(g).init(jax.random.key(0))
    with pytest.raises(mg.SerializationError, match=r"it is a folder; give the path of a file in it"):
        mg.save(tmp_path, g, params, state)
    missing = tmp_path / "no" / "m.mlg"
    with pytest.raises(mg.SerializationError, match=r"folder '.*no' does not exist \(os.makedirs"):
        mg.save(missing, g, params, state)
    assert sorted(os.listdir(tmp_path)) == []  # nothing written, no temporary file left
    mg.save(tmp_path / "m.mlg", g, params, state)  # a file in the folder
    assert os.listdir(tmp_path) == ["m.mlg"]


def test_saving_twice_gives_the_same_bytes(tmp_path):
    graph = examples.transformer_block()
    params, state = random_weights(graph)
    mg.save(tmp_path / "a.mlg", graph, params, state)
    mg.save(tmp_path / "b.mlg", graph, params, state)
    assert (tmp_path / "a.mlg").read_bytes() == (tmp_path / "b.mlg").read_bytes()


def test_a_scanned_models_stacked_weights_save_with_the_graph_built(tmp_path):
    # the graph built (not model.graph) beside the stacked weights: the file holds the
    # blocks one by one either way (it was refused, listing every block's weight missing)
    g = mg.models.gpt2({"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32})
    scanned = mg.compile(g, scan_blocks="always")
    params, state = scanned.init(jax.random.key(0))
    mg.save(tmp_path / "a.mlg", g, params, state)
    mg.save(tmp_path / "b.mlg", scanned.graph, params, state)
    assert (tmp_path / "a.mlg").read_bytes() == (tmp_path / "b.mlg").read_bytes()
    _, loaded, _ = mg.load(tmp_path / "a.mlg")
    np.testing.assert_array_equal(loaded["h.1"]["attn"]["query"]["kernel"],
                                  params["h.0..h.1"]["attn"]["query"]["kernel"][1])
    with pytest.raises(mg.SerializationError, match=r"did you mean verify\?"):
        mg.load(tmp_path / "a.mlg", verfy=False)
    with pytest.raises(mg.SerializationError, match=r"unexpected keyword argument 'dtype'"):
        mg.save(tmp_path / "c.mlg", g, params, state, dtype="bfloat16")


def test_state_may_be_omitted(tmp_path):
    graph = examples.mlp(4, (3,), 2)
    params, _ = random_weights(graph)
    mg.save(tmp_path / "m.mlg", graph, params)
    _, params2, state2 = mg.load(tmp_path / "m.mlg")
    assert state2 == {}
    assert_identical(params, params2)


def test_save_checks_the_arrays_and_writes_nothing_when_wrong(tmp_path):
    graph = examples.residual_cnn()
    params, state = random_weights(graph)
    path = tmp_path / "m.mlg"
    mg.save(path, graph, params, state)
    before = path.read_bytes()

    def without(tree, *keys):
        tree = jax.tree.map(lambda a: a, tree)
        node = tree
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
        return tree

    bad = {
        "missing array": (without(params, "res1", "conv_a", "kernel"), state,
                          r"missing array 'params/res1/conv_a/kernel'"),
        "missing state": (params, without(state, "stem_bn"), r"missing arrays 'state/stem_bn/mean'"),
        "extra array": ({**params, "ghost": {"w": jnp.zeros(3)}}, state, r"extra array 'params/ghost/w'"),
        "wrong shape": ({**params, "logits": {**params["logits"], "bias": jnp.zeros(11)}}, state,
                        r"'params/logits/bias' has shape \[11\], but the graph's init makes \[10\]"),
        "mixed dtypes": ({**params, "logits": {**params["logits"],
                                               "bias": jnp.zeros(10, jnp.bfloat16)}}, state,
                         "several dtypes"),
        "not a dict": ([1, 2], state, "must be a dict"),
        "not arrays": ({"stem": {"kernel": "zeros"}}, state, "holds a str"),
        "slash in key": ({"a/b": {"kernel": jnp.zeros(2)}}, state, "without '/'"),
    }
    for name, (p, s, message) in bad.items():
        with pytest.raises(mg.SerializationError, match=message):
            mg.save(path, graph, p, s)
        assert path.read_bytes() == before, name
    # Weights all in float16 are what init makes with param_dtype float16: save records
    # that dtype and load checks against it.
    p16, s16 = jax.tree.map(lambda a: a.astype(jnp.float16), (params, state))
    mg.save(tmp_path / "f16.mlg", graph, p16, s16)
    assert mg.load(tmp_path / "f16.mlg")[1]["stem"]["kernel"].dtype == jnp.float16
    with pytest.raises(mg.SerializationError, match="param_dtype must be one of"):
        mg.save(path, graph, jax.tree.map(lambda a: a.astype(jnp.int32), params), {})
    with pytest.raises(mg.SerializationError, match="takes a Graph"):
        mg.save(path, "graph", params, state)
    with pytest.raises(mg.SerializationError, match=r"got CompiledModel \(a compiled model: pass model.graph\)"):
        mg.save(path, mg.compile(graph), params, state)
    with pytest.raises(mg.SerializationError, match="the path comes first, got a Graph there"):
        mg.save(graph, params, state, path)
    assert path.read_bytes() == before
    assert temp_files(tmp_path) == []


def test_an_error_while_writing_leaves_the_old_file(tmp_path, monkeypatch):
    graph = examples.mlp(4, (3,), 2)
    params, _ = random_weights(graph)
    path = tmp_path / "m.mlg"
    mg.save(path, graph, params)
    before = path.read_bytes()

    def fail_halfway(f, arrays, metadata):
        f.write(b"\x00" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save_module, "write_safetensors", fail_halfway)
    with pytest.raises(OSError, match="No space left"):
        mg.save(path, graph, jax.tree.map(lambda a: a + 1, params))
    assert path.read_bytes() == before
    assert temp_files(tmp_path) == []


def test_permissions_of_the_replaced_file_are_kept(tmp_path):
    graph = examples.mlp(4, (3,), 2)
    params, _ = random_weights(graph)
    path = tmp_path / "m.mlg"
    mg.save(path, graph, params)
    os.chmod(path, 0o640)
    mg.save(path, graph, params)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_load_of_a_missing_path_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        mg.load(tmp_path / "nothing.mlg")
    # an mlaxgraph error too, as from_onnx gives for a missing file; the suffix suggested
    with pytest.raises(mg.SerializationError, match=r"cannot read the model file '.*nothing.mlg': "
                       r"no such file or folder"):
        mg.load(tmp_path / "nothing.mlg")
    graph = examples.mlp(4, (3,), 2)
    params, _ = random_weights(graph)
    mg.save(tmp_path / "m.mlg", graph, params)
    with pytest.raises(mg.SerializationError, match=r"did you mean '.*m.mlg'\?"):
        mg.load(tmp_path / "m")


# --- atomicity under SIGKILL ------------------------------------------------------------

# Kill points (save number, stage, bytes): in the length field, the header and the data
# of the first, second or third save of a child, and at each call of write_atomic
# (before the file's fsync, before the rename, after it). tests/_kill_saves.py kills
# the child itself at the point, so the result does not depend on the machine's load.
KILL_POINTS = [
    (1, "write", 0), (1, "write", 5), (1, "write", 300), (2, "write", 1 << 20),
    (1, "write", 3 << 20), (3, "write", -1), (2, "write", -4096),
    (1, "fsync", 0), (3, "fsync", 0), (2, "replace", 0), (1, "dir_fsync", 0),
    (2, "dir_fsync", 0),
]


def test_killed_saves_leave_the_old_or_the_new_file(tmp_path):
    from _kill_saves import run_trials

    path = tmp_path / "model.mlg"
    counts = run_trials(path, KILL_POINTS)
    assert counts == {"trials": 12, "replaced": 7, "kept": 5}
    # A killed save leaves at most its temporary file, never read by load.
    assert len(temp_files(tmp_path)) == 10  # one per trial killed before its rename
