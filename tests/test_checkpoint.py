"""Checkpoints: bit-identical resume, keep-last-N, atomic writes, mismatches refused."""

import os

import jax
import numpy as np
import optax
import pytest

import mlaxgraph as mg
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
