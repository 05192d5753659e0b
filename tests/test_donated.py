"""Arrays a Trainer step donated, used again: every function that takes weights or a
train state names the deleted array and the fix (``mlaxgraph/core/donated.py``), where
jax says only ``Array has been deleted`` or ``Buffer has been deleted or donated``; other
errors pass through as they were."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg

CONFIG = {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32, "n_positions": 16}
IDS = np.asarray(jax.random.randint(jax.random.key(1), (2, 8), 0, 32))
FIX = r"was deleted: it was donated to a jitted function.*use the one it returns"


@pytest.fixture(scope="module")
def stepped():
    """A full fine-tuning step's trainer and the train state it was given (now deleted)."""
    graph = mg.models.gpt2(CONFIG)
    model = mg.compile(graph)
    trainer = mg.train.Trainer(model, optax.sgd(0.1), loss="softmax_cross_entropy")
    old = trainer.init(jax.random.key(0))
    new, _ = trainer.train_step(old, IDS, IDS)
    return graph, model, trainer, old, new


def test_the_train_and_eval_steps_name_the_train_states_deleted_array(stepped):
    _, _, trainer, old, new = stepped
    for step in (trainer.train_step, trainer.train_steps, trainer.eval_step):
        with pytest.raises(mg.GraphError, match=r"(train_step|train_steps|eval_step): ts\.\S+ "
                                                + FIX):
            step(old, IDS[None] if step is trainer.train_steps else IDS,
                 IDS[None] if step is trainer.train_steps else IDS)
    metrics = trainer.eval_step(new, IDS, IDS)  # the state the step returned works
    assert np.isfinite(float(metrics["loss"]))


def test_every_function_taking_weights_names_the_deleted_one(stepped, tmp_path):
    graph, model, _, old, _ = stepped
    params, state = old.params, old.state
    calls = {
        "apply": lambda: model.apply(params, state, IDS, inference_mode=True),
        "generate": lambda: mg.generate(model, params, state, IDS[:, :3], max_new_tokens=2),
        "prefill": lambda: mg.decoder(model, max_length=16).prefill(params, state, IDS[:, :3]),
        "mg.save": lambda: mg.save(tmp_path / "m.mlg", graph, params, state),
        "to_state_dict": lambda: mg.models.to_state_dict(graph, params, state),
        "quantize_weights": lambda: mg.quantize_weights(mg.quantize(graph, "int8"), params, state),
        "merge_lora": lambda: mg.merge_lora(mg.lora(graph, "h.*/attn", rank=2), params),
        "stack_weights": lambda: mg.compile(graph, scan_blocks="always").stack_weights(params, state),
        "unstack_weights": lambda: model.unstack_weights(params, state),
    }
    for where, call in calls.items():
        with pytest.raises(mg.GraphError, match=rf"^{where}: params\['\S+'\]\S* " + FIX):
            call()
    assert not (tmp_path / "m.mlg").exists()


def test_a_decoder_step_names_deleted_weights(stepped):
    _, model, trainer, _, _ = stepped
    params, state = model.init(jax.random.key(2))
    dec = mg.decoder(model, max_length=16)
    _, cache = dec.prefill(params, state, IDS[:, :3])
    ts = trainer.init(jax.random.key(0)).replace(params=params, state=state)
    trainer.train_step(ts, IDS, IDS)  # donates params
    with pytest.raises(mg.GraphError, match=r"^step: params\['\S+'\]\S* " + FIX):
        dec.step(params, state, cache, jnp.array([1, 2]))


def test_an_adapter_step_names_the_deleted_adapter_and_keeps_the_frozen_weights():
    graph = mg.lora(mg.models.gpt2(CONFIG), "h.*/attn", rank=2)
    model = mg.compile(graph)
    trainer = mg.train.Trainer(model, optax.sgd(0.1), loss="softmax_cross_entropy",
                               trainable="*/lora_*")
    old = trainer.init(jax.random.key(0))
    trainer.train_step(old, IDS, IDS)
    with pytest.raises(mg.GraphError, match=r"^train_step: ts\.\S+ " + FIX):
        trainer.train_step(old, IDS, IDS)
    leaves = mg.compiler.program.leaf_paths(old.params)
    assert {p for p, w in leaves.items() if w.is_deleted()} == {p for p in leaves if "lora_" in p}
    assert np.isfinite(np.asarray(old.params["wte"]["embedding"])).all()  # frozen: not donated


def test_other_errors_pass_through_unchanged(stepped):
    _, model, trainer, _, new = stepped
    with pytest.raises(mg.ShapeError):
        model.apply(new.params, new.state, IDS[:, :, None], inference_mode=True)
    with pytest.raises(TypeError):
        trainer.train_step(new, IDS, IDS.astype(np.float32))
