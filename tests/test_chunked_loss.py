"""Trainer(loss_chunk=...): the cross-entropy computed with the output layer a chunk of
positions at a time equals the whole-output loss, its gradients and updates, against a
NumPy reference, with a tied head, a Linear head, a bfloat16 policy's casts and an int8
head; the logits are never whole (the compiled step's temporaries); bad settings are
named."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

VOCAB = 3000
CONFIG = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32)


@pytest.fixture(scope="module")
def gpt():
    return mg.models.gpt2(CONFIG)


def _batch(batch=2, seq=24):
    ids = jax.random.randint(jax.random.key(1), (batch, seq), 0, VOCAB)
    return ids, jnp.roll(ids, -1, axis=1)


def _trainers(model, chunk, **kw):
    # plain SGD: the weights after a step differ as the gradients do (Adam's normalized
    # update turns the summation order's 1e-9 in a gradient near 0 into its sign)
    return (mg.train.Trainer(model, optax.sgd(0.5), metrics=("accuracy",), **kw),
            mg.train.Trainer(model, optax.sgd(0.5), metrics=("accuracy",), loss_chunk=chunk, **kw))


def _agree(model, chunk, ids, labels, steps=2, rtol=1e-5, atol=1e-6, **kw):
    whole, chunked = _trainers(model, chunk, **kw)
    a, b = whole.init(jax.random.key(0)), chunked.init(jax.random.key(0))
    for _ in range(steps):
        a, ma = whole.train_step(a, ids, labels)
        b, mb = chunked.train_step(b, ids, labels)
        for name in ("loss", "accuracy"):
            np.testing.assert_allclose(mb[name], ma[name], rtol=rtol, atol=atol)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(y, x, rtol=10 * rtol, atol=10 * atol),
                 a.params, b.params)
    ea, eb = whole.eval_step(a, ids, labels), chunked.eval_step(b, ids, labels)
    np.testing.assert_allclose(eb["loss"], ea["loss"], rtol=rtol, atol=atol)
    return chunked, b


def _reference_loss(logits, labels):
    """Mean next-token cross-entropy in float64: logsumexp minus the label's logit."""
    z = np.asarray(logits, np.float64)
    top = z.max(axis=-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(z - top).sum(axis=-1))
    picked = np.take_along_axis(z, np.asarray(labels)[..., None], axis=-1)[..., 0]
    return float(np.mean(lse - picked))


def test_tied_head_steps_equal_the_whole_logits(gpt, chunk=7):   # 48 positions: one padded
    ids, labels = _batch()
    model = mg.compile(gpt, scan_blocks="always")
    trainer, ts = _agree(model, chunk, ids, labels)
    logits, _ = model.apply(ts.params, ts.state, ids, inference_mode=True)
    np.testing.assert_allclose(trainer.eval_step(ts, ids, labels)["loss"],
                               _reference_loss(logits, labels), rtol=1e-5)
    assert trainer.trace_counts["train_step"] == 1


def test_a_linear_head_and_the_accuracy(gpt):
    x = mg.Input(("batch", 12))
    h = ops.Linear(16, name="hidden")(x)
    graph = mg.Graph(x, ops.Linear(10, name="head")(ops.Relu(name="relu")(h)))
    data = jax.random.normal(jax.random.key(2), (20, 12))
    labels = jax.random.randint(jax.random.key(3), (20,), 0, 10)
    trainer, ts = _agree(mg.compile(graph), 6, data, labels, steps=3)
    logits, _ = trainer.model.apply(ts.params, ts.state, data)
    expected = np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(labels))
    assert float(trainer.eval_step(ts, data, labels)["accuracy"]) == pytest.approx(expected)


def test_a_bfloat16_policys_casts_run_in_the_chunks(gpt):
    model = mg.compile(gpt, policy=mg.Policy(compute_dtype="bfloat16"))
    tail = [s.op.op_name for s in mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=8)
            ._head.tail.steps]
    assert tail == ["cast", "embedding"]
    ids, labels = _batch()
    _agree(model, 8, ids, labels, steps=1, rtol=1e-2, atol=1e-2)


def test_an_int8_head_with_adapters_qlora(gpt):
    qgraph = mg.quantize(gpt, "int8_weight_only")
    graph = mg.lora(qgraph, "h.*/attn/qkv", rank=4)
    model = mg.compile(graph)
    trainer = mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=8, trainable="**/*.lora_*")
    assert [s.op.op_name for s in trainer._head.tail.steps] == ["quantized_embedding"]
    float_params, float_state = mg.compile(gpt).init(jax.random.key(0))
    qparams, qstate = mg.quantize_weights(qgraph, float_params, float_state)
    qparams, _ = model.init(jax.random.key(5), reuse=(qparams, qstate))  # the adapters' too
    ids, labels = _batch()
    whole = mg.train.Trainer(model, optax.sgd(0.1), trainable="**/*.lora_*")
    a = whole.init(jax.random.key(0), reuse=(qparams, qstate))
    b = trainer.init(jax.random.key(0),   # own buffers: each step donates its state
                     reuse=(jax.tree.map(jnp.copy, qparams), jax.tree.map(jnp.copy, qstate)))
    for _ in range(2):
        a, ma = whole.train_step(a, ids, labels)
        b, mb = trainer.train_step(b, ids, labels)
        np.testing.assert_allclose(mb["loss"], ma["loss"], rtol=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6),
                 mg.lora_params(a.params), mg.lora_params(b.params))


def _head_reference(table, h, labels, weights):
    """sum(weights * cross-entropy) of the tied head's logits ``h @ table.T``."""
    logits = h @ table.T
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.sum(weights * (jax.nn.logsumexp(logits, axis=-1) - picked))


@pytest.mark.parametrize("head_trains", [False, True])
def test_gradients_per_position_with_the_head_frozen_or_training(gpt, head_trains):
    """Any cotangent per position (not only the mean's): the rows' gradients and, where
    the head's table trains, its gradient equal the whole logits' (float64 aside, a jnp
    reference); with the table frozen they come from the forward pass's chunks."""
    model = mg.compile(gpt)
    head = mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=7)._head
    assert [s.op.op_name for s in head.tail.steps] == ["embedding"]
    params, state = model.init(jax.random.key(0))
    table = params["wte"]["embedding"]
    h = jax.random.normal(jax.random.key(4), (2, 11, 32))
    labels = jax.random.randint(jax.random.key(5), (2, 11), 0, VOCAB)
    weights = jax.random.uniform(jax.random.key(6), (2, 11))

    def chunked(table, h):
        values = head.values({**params, "wte": {"embedding": table}}, state, h, labels, False)
        return jnp.sum(weights * values["loss"])

    argnums = (0, 1) if head_trains else 1
    got = jax.jit(jax.grad(chunked, argnums=argnums))(table, h)
    want = jax.grad(_head_reference, argnums=argnums)(table, h, labels, weights)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_a_frozen_head_is_not_computed_twice(gpt):
    """LoRA with the tied head frozen: the chunked step has as many vocabulary-wide dots
    as the whole-logits step (the forward's and the rows' gradient), none recomputed."""
    model = mg.compile(mg.lora(gpt, "h.*/attn/qkv", rank=4), scan_blocks="always")
    ids, labels = _batch(batch=2, seq=32)

    def wide_dots(**kw):   # the program's dot_generals with a vocabulary-wide operand
        trainer = mg.train.Trainer(model, optax.sgd(0.1), trainable="**/*.lora_*", **kw)
        ts = trainer.init(jax.random.key(0))
        text = trainer.train_step.lower(ts, ids, labels).as_text()
        return sum(1 for line in text.splitlines()
                   if "dot_general" in line and re.search(rf"tensor<[0-9x]*\b{VOCAB}x", line))

    assert wide_dots(loss_chunk=16) == wide_dots() == 2


def test_the_logits_are_never_whole(gpt):
    ids, labels = _batch(batch=4, seq=32)
    model = mg.compile(gpt, scan_blocks="always")
    whole, chunked = _trainers(model, 16)
    compiled = [trainer.train_step.lower(trainer.init(jax.random.key(0)), ids, labels).compile()
                for trainer in (whole, chunked)]
    temps = [c.memory_analysis().temp_size_in_bytes for c in compiled]
    logits_bytes = 4 * 32 * VOCAB * 4
    assert temps[0] - temps[1] > logits_bytes      # the logits and their gradient
    hlo = compiled[1].as_text()
    assert f"f32[4,32,{VOCAB}]" not in hlo and f"f32[128,{VOCAB}]" not in hlo
    assert f"f32[16,{VOCAB}]" in hlo


def test_bad_settings_are_named(gpt):
    model = mg.compile(gpt)
    for chunk in (0, -3, 2.5, True):
        with pytest.raises(mg.GraphError, match="positive number of positions"):
            mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=chunk)
    with pytest.raises(mg.GraphError, match="'mean_squared_error'"):
        mg.train.Trainer(model, optax.sgd(0.1), loss="mean_squared_error", loss_chunk=8)
    with pytest.raises(mg.GraphError, match="metrics are named ones"):
        mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=8,
                         metrics={"top": lambda o, t: o[..., 0]})
    with pytest.raises(mg.GraphError, match="intervene at 'wte@1' names the output layer"):
        mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=8,
                         intervene={"wte@1": lambda v: v})
    x = mg.Input(("batch", 4))
    ending_in_relu = mg.compile(mg.Graph(x, ops.Relu(name="act")(ops.Linear(3, name="fc")(x))))
    with pytest.raises(mg.GraphError, match=r"layer 'act' \(op relu\).*Linear or an Embedding"):
        mg.train.Trainer(ending_in_relu, optax.sgd(0.1), loss_chunk=8)
    trainer = mg.train.Trainer(model, optax.sgd(0.1), loss_chunk=8)
    ts = trainer.init(jax.random.key(0))
    ids, labels = _batch()
    with pytest.raises(mg.ShapeError, match="without its last"):
        trainer.train_step(ts, ids, labels[:, :5])
    with pytest.raises(mg.DTypeError, match="integer class ids"):
        trainer.train_step(ts, ids, labels.astype(jnp.float32))
