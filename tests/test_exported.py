"""Shipping a model as files: ``model.save_hlo`` writes the ``jax.export`` artifact, the
HLO texts, the weights and a manifest; ``mg.load_exported`` runs the artifact in a
process that never imports the code that built the graph."""

import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.examples import mlp, residual_cnn

BATCHES = (1, 7, 64)

# Run in a fresh interpreter: loads the folder, runs each input, saves the outputs.
RUNNER = textwrap.dedent("""
    import sys
    import numpy as np
    import mlaxgraph as mg

    folder, inputs, outputs = sys.argv[1:]
    loaded = mg.load_exported(folder)
    arrays = np.load(inputs)
    results = {}
    for key in arrays.files:
        out, state = loaded(arrays[key])
        results[key] = np.asarray(out)
    np.savez(outputs, **results)
    # The graph's code was never needed: mlaxgraph's example models were not imported.
    print("examples imported:", "mlaxgraph.examples" in sys.modules)
""")


def trained_like(model, seed=0):
    """init's weights with BatchNorm statistics moved off their defaults, so that a
    state ignored on the way would show."""
    params, state = model.init(jax.random.key(seed))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda v: jnp.asarray(rng.uniform(0.5, 1.5, v.shape), v.dtype), state)
    return params, state


def test_artifact_loaded_in_a_fresh_process_matches_apply_at_every_batch(tmp_path):
    model = mg.compile(residual_cnn())
    params, state = trained_like(model)
    folder = tmp_path / "cnn-export"
    written = model.save_hlo(folder, batch=8, params=params, state=state)
    assert written["artifact"] == folder / "exported.jax"
    rng = np.random.default_rng(1)
    inputs = {f"b{b}": rng.standard_normal((b, 8, 8, 1)).astype(np.float32) for b in BATCHES}
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    result = subprocess.run([sys.executable, str(script), str(folder), str(tmp_path / "inputs.npz"),
                             str(tmp_path / "outputs.npz")], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "examples imported: False" in result.stdout
    outputs = np.load(tmp_path / "outputs.npz")
    for batch in BATCHES:
        expected, _ = model.apply(params, state, jnp.asarray(inputs[f"b{batch}"]),
                                  inference_mode=True)
        got = outputs[f"b{batch}"]
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-5, atol=1e-6)


def test_folder_holds_texts_weights_and_a_manifest(tmp_path):
    model = mg.compile(residual_cnn(), mg.Policy(compute_dtype="bfloat16", output_dtype="float32"))
    params, state = trained_like(model)
    written = model.save_hlo(tmp_path, batch=4, params=params, state=state)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["exported.jax", "exported.mlir", "stablehlo.mlir", "optimized_hlo.txt",
         "weights.safetensors", "manifest.json"])
    assert set(written) == {"artifact", "exported_mlir", "stablehlo", "optimized_hlo",
                            "weights", "manifest"}
    stablehlo = (tmp_path / "stablehlo.mlir").read_text()
    assert "module @jit_apply" in stablehlo and "tensor<4x8x8x1xf32>" in stablehlo
    assert 'loc("jit(apply)/res1/conv_a/' in stablehlo  # layer locations kept
    assert (tmp_path / "optimized_hlo.txt").read_text().startswith("HloModule")
    assert "tensor<?x8x8x1xf32>" in (tmp_path / "exported.mlir").read_text()  # batch symbolic
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["format"] == "mlaxgraph.exported" and manifest["version"] == 2
    assert manifest["inputs"] == {"image": "f32[batch,8,8,1]"}
    assert manifest["outputs"] == ["f32[batch,10]"] and manifest["dims"] == {"batch": 4}
    assert manifest["inference_mode"] is True and "bfloat16" in manifest["policy"]
    loaded = mg.load_exported(tmp_path)
    assert jax.tree.structure(loaded.params) == jax.tree.structure(params)
    np.testing.assert_array_equal(loaded.state["stem_bn"]["mean"], state["stem_bn"]["mean"])
    x = jnp.ones((3, 8, 8, 1))
    out, new_state = loaded(x)
    expected, _ = model.apply(params, state, x, inference_mode=True)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, rtol=1e-2, atol=1e-2)  # bfloat16 compute
    np.testing.assert_array_equal(out, loaded.apply(params, state, x)[0])
    assert "residual_cnn" in repr(loaded) and "with weights" in repr(loaded)


def test_bfloat16_weights_round_trip(tmp_path):
    model = mg.compile(mlp(6, (8,), 3), mg.Policy(param_dtype="bfloat16", compute_dtype="bfloat16"))
    params, state = model.init(jax.random.key(0))
    model.save_hlo(tmp_path, params=params, state=state)  # no dims: no concrete texts
    assert not (tmp_path / "stablehlo.mlir").exists()
    loaded = mg.load_exported(tmp_path)
    assert loaded.params["dense"]["kernel"].dtype == jnp.bfloat16
    x = jnp.ones((2, 6))
    np.testing.assert_array_equal(loaded(x)[0], model.apply(params, state, x, inference_mode=True)[0])


def test_bare_artifact_file_and_training_mode(tmp_path):
    model = mg.compile(residual_cnn())
    params, state = model.init(jax.random.key(0))
    model.save_hlo(tmp_path, inference_mode=False)
    loaded = mg.load_exported(tmp_path / "exported.jax")  # checked by the manifest beside it
    assert loaded.params is None and loaded.manifest["files"]["artifact"] == "exported.jax"
    with pytest.raises(mg.SerializationError, match="without weights"):
        loaded(jnp.ones((2, 8, 8, 1)))
    x, key = jnp.ones((2, 8, 8, 1)), jax.random.key(3)
    out, new_state = loaded.apply(params, state, x, rng=key)
    expected, expected_state = model.apply(params, state, x, rng=key)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state["stem_bn"]["var"], expected_state["stem_bn"]["var"],
                               rtol=1e-5)


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="exported.jax"):
        mg.load_exported(tmp_path)
    (tmp_path / "exported.jax").write_bytes(b"not flatbuffers at all")
    with pytest.raises(mg.SerializationError, match="not a jax.export artifact"):
        mg.load_exported(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(mg.SerializationError, match="not an mlaxgraph export manifest"):
        mg.load_exported(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "mlaxgraph.exported", "version": 99}')
    with pytest.raises(mg.SerializationError, match="upgrade mlaxgraph"):
        mg.load_exported(tmp_path)


def test_weights_file_of_another_kind_is_refused(tmp_path):
    model = mg.compile(mlp(4, (3,), 2))
    params, state = model.init(jax.random.key(0))
    model.save_hlo(tmp_path)
    mg.save(tmp_path / "weights.safetensors", model.graph, params, state)  # an .mlg, not ours
    with pytest.raises(mg.SerializationError, match="lists no checksum for this file"):
        mg.load_exported(pathlib.Path(tmp_path))
    with pytest.raises(mg.SerializationError, match="not the weights of an mlaxgraph export"):
        mg.load_exported(pathlib.Path(tmp_path), verify=False)


def test_an_edited_or_missing_hlo_text_of_the_folder_is_refused(tmp_path):
    # the manifest lists the texts' checksums, and only the artifact and weights were read
    model = mg.compile(mlp(6, (8,), 3))
    model.save_hlo(tmp_path / "src", batch=2)
    for name in ("optimized_hlo.txt", "stablehlo.mlir", "exported.mlir"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        for f in (tmp_path / "src").iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        with open(folder / name, "ab") as f:
            f.write(b"// edited\n")
        with pytest.raises(mg.SerializationError, match=f"{name}: the file does not match its "
                                                        f"checksum"):
            mg.load_exported(folder)
        assert mg.load_exported(folder, verify=False).exported is not None
        (folder / name).unlink()
        with pytest.raises(mg.SerializationError, match="listed in the manifest, and not in"):
            mg.load_exported(folder)


def test_a_sequence_past_the_position_table_is_refused_by_the_loaded_folder(tmp_path):
    # the artifact's dims are unconstrained: past the table its lookup gives NaN rows,
    # where apply refuses; the manifest records the bound and apply checks it
    model = mg.compile(mg.models.gpt2({"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32,
                                       "n_positions": 8}))
    params, state = model.init(jax.random.key(0))
    model.save_hlo(tmp_path, params=params, state=state)
    loaded = mg.load_exported(tmp_path)
    assert loaded.manifest["limits"] == {"seq": 8}
    ids = np.arange(16, dtype=np.int32).reshape(2, 8) % 32
    np.testing.assert_allclose(loaded(ids)[0], model.apply(params, state, ids, inference_mode=True)[0],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(mg.ShapeError, match=r"has seq=9 on axis 1; the graph allows seq up to 8"):
        loaded(np.zeros((1, 9), np.int32))
    with pytest.raises(mg.ShapeError, match="position table has 8"):
        model.apply(params, state, np.zeros((1, 9), np.int32), inference_mode=True)
