"""Checkpoints: bit-identical resume, keep-last-N, atomic writes, mismatches refused."""

import os

import jax
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import residual_cnn
from mlaxgraph.train import CheckpointManager, Trainer


def _digits_like(n=96, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(size=(n, 8, 8, 1)).astype(np.float32),
            rng.integers(0, 10, size=n).astype(np.int32))


def _trainer(policy=None):
    # Dropout and BatchNorm (rng and state) and Adam (moments and a counter).
    return Trainer(mg.compile(residual_cnn(), policy), optax.adam(1e-3))


def _leaves(ts):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                       else x) for x in jax.tree.leaves(ts)]


@pytest.mark.parametrize("policy", [None, mg.Policy(compute_dtype="float16")],
                         ids=["float32", "float16-loss-scaled"])
def test_resumed_training_is_bit_identical_to_an_uninterrupted_run(tmp_path, policy):
    data = _digits_like()
    trainer = _trainer(policy)
    whole, _ = trainer.fit(trainer.init(jax.random.key(0)), data, epochs=4, batch_size=16,
                           progress=False)

    manager = CheckpointManager(tmp_path, keep=2)
    first = _trainer(policy)
    first.fit(first.init(jax.random.key(0)), data, epochs=2, batch_size=16,
              checkpoints=manager, progress=False)
    assert manager.steps() == [6, 12]
    # A new process would start here: a fresh trainer, a template state, the file.
    second = _trainer(policy)
    resumed = manager.restore(second.init(jax.random.key(99)))
    assert int(resumed.step) == 12
    resumed, history = second.fit(resumed, data, epochs=4, initial_epoch=int(resumed.step) // 6,
                                  batch_size=16, checkpoints=manager, progress=False)
    assert history["epoch"] == [3, 4]
    assert manager.steps() == [18, 24]  # the last two kept
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_restore_of_an_older_step_and_the_saved_arrays(tmp_path):
    trainer = _trainer()
    ts = trainer.init(jax.random.key(0))
    manager = CheckpointManager(tmp_path / "nested" / "dir", keep=5)
    manager.save(ts)
    data = _digits_like(32)
    saved = _leaves(ts)
    for _ in range(3):
        ts, _ = trainer.train_step(ts, data[0][:16], data[1][:16])
    manager.save(ts)
    back = manager.restore(trainer.init(jax.random.key(5)), step=0)
    for a, b in zip(saved, _leaves(back), strict=True):
        np.testing.assert_array_equal(a, b)
    assert manager.latest_step() == 3
    with pytest.raises(mg.SerializationError, match="no checkpoint of step 7"):
        manager.restore(ts, step=7)


def test_no_temporary_files_are_left_and_only_the_last_n_kept(tmp_path):
    trainer = Trainer(mg.compile(mg.examples.mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    manager = CheckpointManager(tmp_path, keep=3)
    x = np.ones((4, 4), np.float32)
    y = np.zeros(4, np.int32)
    for _ in range(5):
        manager.save(ts)
        ts, _ = trainer.train_step(ts, x, y)
    assert sorted(os.listdir(tmp_path)) == [f"checkpoint_0000000{i}.safetensors" for i in (2, 3, 4)]


def test_mismatched_or_damaged_checkpoints_are_refused(tmp_path):
    small = Trainer(mg.compile(mg.examples.mlp(4, (8,), 3)), optax.adam(1e-3))
    manager = CheckpointManager(tmp_path)
    path = manager.save(small.init(jax.random.key(0)))
    wider = Trainer(mg.compile(mg.examples.mlp(4, (16,), 3)), optax.adam(1e-3))
    with pytest.raises(mg.SerializationError, match="'params/dense/bias' is float32\\[8\\], "
                                                    "the train state has float32\\[16\\]"):
        manager.restore(wider.init(jax.random.key(0)))
    other_optimizer = Trainer(small.model, optax.sgd(0.1, momentum=0.9))
    with pytest.raises(mg.SerializationError, match="does not match this train state"):
        manager.restore(other_optimizer.init(jax.random.key(0)))
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(mg.SerializationError):
        manager.restore(small.init(jax.random.key(0)))
    with pytest.raises(mg.SerializationError, match="no checkpoint in"):
        CheckpointManager(tmp_path / "empty").restore(small.init(jax.random.key(0)))
    with pytest.raises(mg.SerializationError, match="keep must be at least 1"):
        CheckpointManager(tmp_path, keep=0)


def test_a_mismatch_names_the_differing_arrays_by_part_and_the_step_is_checked(tmp_path):
    """Another model's checkpoint names its params that differ (not the first names in
    sorted order, which may all be the loss scale's); a file renamed to another step, or
    misspelt keywords, are refused by name."""
    import shutil

    small = Trainer(mg.compile(mg.examples.mlp(4, (8,), 3)), optax.adam(1e-3), loss_scale="dynamic")
    manager = CheckpointManager(tmp_path)
    manager.save(small.init(jax.random.key(0)))
    x = mg.Input(("batch", 4), name="x")
    other = mg.compile(mg.Graph(x, ops.Linear(3, name="head")(ops.Linear(8, name="dense")(x))))
    with pytest.raises(mg.SerializationError) as info:
        manager.restore(Trainer(other, optax.adam(1e-3)).init(jax.random.key(0)))
    message = str(info.value)
    assert "params: 2 missing from the file (params/head/bias, params/head/kernel)" in message
    assert "params: 2 in the file, not in this state (params/logits/bias, params/logits/kernel)" in message
    assert "loss_scale: 2 in the file, not in this state (loss_scale/good_steps, loss_scale/scale)" in message
    assert message.index("params: 2 missing") < message.index("opt_state: 4 missing")
    shutil.copy(manager.path(0), manager.path(7))
    with pytest.raises(mg.SerializationError, match="the file of step 7 records step 0 and holds a "
                                                    "state at step 0: it was renamed"):
        manager.restore(small.init(jax.random.key(0)), 7)
    with pytest.raises(mg.SerializationError, match=r"unexpected keyword argument 'kep' \(did you mean keep\?\)"):
        CheckpointManager(tmp_path, kep=2)
    with pytest.raises(mg.SerializationError, match=r"'stp' \(did you mean step\?\)"):
        manager.restore(small.init(jax.random.key(0)), stp=0)
    with pytest.raises(mg.SerializationError, match="save replaces a checkpoint of the same step"):
        manager.save(small.init(jax.random.key(0)), overwrite=True)
    with pytest.raises(mg.SerializationError, match="keep must be at least 1 .* got 'two'"):
        CheckpointManager(tmp_path, keep="two")
