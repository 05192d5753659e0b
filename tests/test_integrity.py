"""Checksums (mlaxgraph/io/weights.py): every file kind mlaxgraph writes (model file,
train checkpoint, export folder: artifact, weights and manifest) records the blake2b
digests of its header and of each array, or of each file, and its loader refuses bytes
that changed: a flipped tensor byte, a flipped header byte, a truncation. An untouched
file loads; ``verify=False`` skips the hashing; files written before the checksums
(tests/fixtures/v1_*) still load, with an ``mg.UnverifiedFileWarning``."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import struct
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph.examples import mlp

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def header_and_data(raw: bytes) -> tuple[dict, int]:
    """The parsed safetensors header and where the data starts."""
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), 8 + n


def flipped(path: pathlib.Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


def tensor_byte(path: pathlib.Path, name: str) -> int:
    """The offset in the file of a byte in the middle of array ``name``."""
    header, start = header_and_data(path.read_bytes())
    begin, end = header[name]["data_offsets"]
    return start + (begin + end) // 2


def header_byte(path: pathlib.Path, text: bytes) -> int:
    """The offset of a byte inside ``text`` in the header (a digit of a shape, a letter
    of the graph), whose flip leaves valid JSON and a valid safetensors file."""
    raw = path.read_bytes()
    _, start = header_and_data(raw)
    at = raw.index(text)
    assert at < start
    return at + len(text) - 1


def truncated(path: pathlib.Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture(scope="module")
def model():
    m = mg.compile(mlp(4, (8,), 3))
    params, state = m.init(jax.random.key(0))
    return m, params, state


# --- model files ------------------------------------------------------------------------


def test_model_file_refuses_changed_bytes(model, tmp_path):
    m, params, state = model
    good = tmp_path / "good.mlg"
    mg.save(good, m.graph, params, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checksummed file loads without a warning
        _, loaded, _ = mg.load(good)
    np.testing.assert_array_equal(loaded["dense"]["kernel"], params["dense"]["kernel"])

    bad = tmp_path / "bad.mlg"
    shutil.copy(good, bad)
    flipped(bad, tensor_byte(bad, "params/dense/kernel"))
    with pytest.raises(mg.SerializationError, match="array 'params/dense/kernel' does not match its checksum"):
        mg.load(bad)
    # verify=False reads it, and the flipped byte shows: nothing else hides it.
    _, unchecked, _ = mg.load(bad, verify=False)
    assert not np.array_equal(unchecked["dense"]["kernel"], params["dense"]["kernel"])

    shutil.copy(good, bad)
    flipped(bad, header_byte(bad, b'\\"features\\":8'))  # in the graph JSON: 8 -> "("
    with pytest.raises(mg.SerializationError, match="the header does not match its checksum"):
        mg.load(bad)

    shutil.copy(good, bad)
    # A flip that leaves the header valid JSON: "mlaxgraph.model" -> "mlaxgraph.}odel".
    flipped(bad, header_byte(bad, b'"mlaxgraph.format":"mlaxgraph.m'))
    with pytest.raises(mg.SerializationError, match="the header does not match its checksum"):
        mg.load(bad)

    size = good.stat().st_size
    for keep in (size - 1, size // 2, 100, 7):
        shutil.copy(good, bad)
        truncated(bad, keep)
        with pytest.raises(mg.SerializationError):
            mg.load(bad)


def test_every_flipped_bit_of_a_model_file_is_refused(model, tmp_path):
    m, params, state = model
    good = tmp_path / "good.mlg"
    mg.save(good, m.graph, params, state)
    raw = good.read_bytes()
    bad = tmp_path / "bad.mlg"
    rng = np.random.default_rng(0)
    # 150 positions spread over the length field, the header and the data.
    positions = sorted({*range(8), *rng.integers(8, len(raw), 142).tolist()})
    for position in positions:
        data = bytearray(raw)
        data[position] ^= 1 << int(rng.integers(0, 8))
        bad.write_bytes(bytes(data))
        with pytest.raises(mg.SerializationError):
            mg.load(bad)


def test_a_file_without_its_checksums_is_refused_when_its_version_has_them(model, tmp_path):
    m, params, state = model
    good = tmp_path / "good.mlg"
    mg.save(good, m.graph, params, state)
    header, start = header_and_data(good.read_bytes())
    del header["__metadata__"]["mlaxgraph.checksums"]
    del header["__metadata__"]["mlaxgraph.header_checksum"]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    stripped = tmp_path / "stripped.mlg"
    stripped.write_bytes(struct.pack("<Q", len(text)) + text + good.read_bytes()[start:])
    with pytest.raises(mg.SerializationError, match="version 2 file records checksums"):
        mg.load(stripped)


def test_version_1_model_file_loads_with_a_warning():
    with pytest.warns(mg.UnverifiedFileWarning, match="written without checksums"):
        graph, params, _ = mg.load(FIXTURES / "v1_model.mlg")
    assert graph == mlp(4, (8,), 3)
    reference = np.load(FIXTURES / "v1_model_params.npz")
    for key in reference.files:
        layer, name = key.split("/")
        np.testing.assert_array_equal(params[layer][name], reference[key])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mg.load(FIXTURES / "v1_model.mlg", verify=False)  # asked not to verify: no warning


# --- train checkpoints --------------------------------------------------------------------


def _trainer(model):
    return mg.train.Trainer(model[0], optax.sgd(0.1))


def test_checkpoint_refuses_changed_bytes(model, tmp_path):
    trainer = _trainer(model)
    ts = trainer.init(jax.random.key(0))
    manager = mg.train.CheckpointManager(tmp_path / "run")
    path = pathlib.Path(manager.save(ts))
    good = path.read_bytes()
    template = trainer.init(jax.random.key(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = manager.restore(template)
    np.testing.assert_array_equal(restored.params["logits"]["bias"], ts.params["logits"]["bias"])

    flipped(path, tensor_byte(path, "params/logits/kernel"))
    with pytest.raises(mg.SerializationError, match="'params/logits/kernel' does not match its checksum"):
        manager.restore(template)
    assert not np.array_equal(manager.restore(template, verify=False).params["logits"]["kernel"],
                              ts.params["logits"]["kernel"])

    path.write_bytes(good)
    flipped(path, header_byte(path, b'"step":"0'))  # "0" -> " " : still a string
    with pytest.raises(mg.SerializationError, match="the header does not match its checksum"):
        manager.restore(template)

    for keep in (len(good) - 3, len(good) // 2):
        path.write_bytes(good[:keep])
        with pytest.raises(mg.SerializationError):
            manager.restore(template)


def test_version_1_checkpoint_restores_with_a_warning(model, tmp_path):
    trainer = _trainer(model)
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "v1_checkpoint", folder)
    manager = mg.train.CheckpointManager(folder)
    assert manager.steps() == [2]
    template = trainer.init(jax.random.key(5))
    with pytest.warns(mg.UnverifiedFileWarning, match="the checkpoint was written without checksums"):
        ts = manager.restore(template)
    assert int(ts.step) == 2
    reference = np.load(FIXTURES / "v1_checkpoint_params.npz")
    for key in reference.files:
        layer, name = key.split("/")
        np.testing.assert_array_equal(ts.params[layer][name], reference[key])
    # The restored run goes on: one more step from it equals one SGD step computed here.
    x = jnp.asarray(np.arange(32, dtype=np.float32).reshape(8, 4) / 32)
    y = jnp.asarray(np.arange(8, dtype=np.int32) % 3)
    before = jax.tree.map(np.asarray, ts.params)

    def loss(params):
        out, _ = model[0].apply_fn(params, ts.state, x)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, y))

    grads = jax.grad(loss)(ts.params)
    ts, _ = trainer.train_step(ts, x, y)
    np.testing.assert_allclose(ts.params["dense"]["kernel"],
                               before["dense"]["kernel"] - 0.1 * np.asarray(grads["dense"]["kernel"]),
                               rtol=1e-5, atol=1e-6)


# --- export folders -----------------------------------------------------------------------


def test_export_folder_records_the_digest_of_every_file(model, tmp_path):
    m, params, state = model
    m.save_hlo(tmp_path, batch=2, params=params, state=state)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["version"] == 2
    assert sorted(manifest["checksums"]) == sorted(
        p.name for p in tmp_path.iterdir() if p.name != "manifest.json")
    for name, value in manifest["checksums"].items():
        assert value == hashlib.blake2b((tmp_path / name).read_bytes(), digest_size=16).hexdigest()
    content = {k: v for k, v in manifest.items() if k != "checksum"}
    assert manifest["checksum"] == hashlib.blake2b(
        json.dumps(content, sort_keys=True, separators=(",", ":")).encode(), digest_size=16).hexdigest()


@pytest.mark.parametrize("target", ["exported.jax", "weights.safetensors", "manifest.json"])
def test_export_folder_refuses_changed_bytes(model, tmp_path, target):
    m, params, state = model
    good = tmp_path / "good"
    m.save_hlo(good, params=params, state=state)
    x = np.ones((2, 4), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = mg.load_exported(good)(x)
    np.testing.assert_allclose(out, m.apply(params, state, x)[0], rtol=1e-6)
    file = good / target
    raw = file.read_bytes()
    if target == "weights.safetensors":
        inside = tensor_byte(file, "params/dense/kernel")
        head = header_byte(file, b'"mlaxgraph.format":"mlaxgraph.e')
    elif target == "manifest.json":
        inside = raw.index(b'"graph": "mlp"') + len(b'"graph": "m')   # "mlp" -> "m|p"
        head = raw.index(b'"inference_mode": true') + 3
    else:
        inside, head = len(raw) // 2, 40
    for offset in (inside, head):
        file.write_bytes(raw)
        flipped(file, offset)
        with pytest.raises(mg.SerializationError, match=f"{target}: .*checksum"):
            mg.load_exported(good)
    file.write_bytes(raw[:len(raw) - 5])
    with pytest.raises(mg.SerializationError, match=target):
        mg.load_exported(good)
    file.write_bytes(raw)
    mg.load_exported(good)


def test_bare_artifact_is_checked_by_the_manifest_beside_it(model, tmp_path):
    m, params, state = model
    m.save_hlo(tmp_path)
    artifact = tmp_path / "exported.jax"
    flipped(artifact, artifact.stat().st_size // 2)
    with pytest.raises(mg.SerializationError, match="exported.jax: the file does not match its checksum"):
        mg.load_exported(artifact)


def test_version_1_export_folder_loads_with_a_warning(model):
    m, params, state = model
    with pytest.warns(mg.UnverifiedFileWarning, match="the export folder was written without checksums"):
        loaded = mg.load_exported(FIXTURES / "v1_exported")
    reference = np.load(FIXTURES / "v1_model_params.npz")  # the same init
    for key in reference.files:
        layer, name = key.split("/")
        np.testing.assert_array_equal(loaded.params[layer][name], reference[key])
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    kernel, bias = reference["dense/kernel"], reference["dense/bias"]
    hidden = np.maximum(x.astype(np.float64) @ kernel + bias, 0)
    expected = hidden @ reference["logits/kernel"] + reference["logits/bias"]
    np.testing.assert_allclose(loaded(x)[0], expected, rtol=1e-5, atol=1e-6)


def test_a_manifest_whose_version_was_lowered_is_refused(model, tmp_path):
    m, params, state = model
    m.save_hlo(tmp_path, params=params, state=state)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["version"] = 1       # as if written before the checksums: must not skip them
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(mg.SerializationError, match="the manifest is damaged: it says version 1"):
        mg.load_exported(tmp_path)
