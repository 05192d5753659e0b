"""mg.train: the jitted train step against a hand-written reference, fused steps,
tracing, donation, mixed precision, loss scaling, fit and evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import mlp, residual_cnn
from mlaxgraph.train import DynamicLossScale, Trainer, evaluate


def _data(n=64, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (np.argmax(x[:, :classes], axis=1)).astype(np.int32)
    return x, y


def _reference_sgd(params, x, y, lr, steps):
    """A two-layer MLP with mean cross-entropy and plain SGD, in jax.numpy."""
    def loss(p):
        h = jnp.maximum(x @ p["dense"]["kernel"] + p["dense"]["bias"], 0)
        logits = h @ p["logits"]["kernel"] + p["logits"]["bias"]
        logp = logits - jax.scipy.special.logsumexp(logits, axis=1, keepdims=True)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    losses = []
    for _ in range(steps):
        value, grads = jax.value_and_grad(loss)(params)
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        losses.append(float(value))
    return params, losses


def test_train_step_matches_hand_written_sgd():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    start = jax.tree.map(np.array, ts.params)
    x, y = _data(16)
    losses = []
    for _ in range(3):
        ts, metrics = trainer.train_step(ts, x, y)
        losses.append(float(metrics["loss"]))
    expected, expected_losses = _reference_sgd(start, x, y, 0.1, 3)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 ts.params, expected)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert int(ts.step) == 3


def test_metrics_are_the_batch_mean_of_loss_and_accuracy():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.0), metrics=("accuracy",))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(32)
    logits, _ = trainer.model.apply(ts.params, ts.state, x)
    logits = np.asarray(logits, np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ts, metrics = trainer.train_step(ts, x, y)
    np.testing.assert_allclose(metrics["loss"], -logp[np.arange(32), y].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], (logits.argmax(1) == y).mean())


def test_batchnorm_state_updates_in_training_and_eval_uses_running_statistics():
    x_in = mg.Input(("batch", 4))
    graph = mg.Graph(x_in, ops.Linear(2, name="out")(ops.BatchNorm(momentum=0.5, name="bn")(x_in)))
    trainer = Trainer(mg.compile(graph), optax.sgd(0.0))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(8, classes=2)
    ts, _ = trainer.train_step(ts, x, y)
    np.testing.assert_allclose(ts.state["bn"]["mean"], 0.5 * x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ts.state["bn"]["var"], 0.5 + 0.5 * x.var(0), rtol=1e-5)
    # Inference normalises with the running statistics.
    normed = (x - 0.5 * x.mean(0)) / np.sqrt(0.5 + 0.5 * x.var(0) + 1e-5)
    expected = normed @ np.asarray(ts.params["out"]["kernel"]) + np.asarray(ts.params["out"]["bias"])
    np.testing.assert_allclose(trainer.predict(ts, x), expected, rtol=1e-4, atol=1e-5)


def test_fused_steps_equal_single_steps_with_dropout_and_batchnorm():
    graph = residual_cnn()
    images = np.random.default_rng(0).uniform(size=(8, 16, 8, 8, 1)).astype(np.float32)
    labels = np.random.default_rng(1).integers(0, 10, size=(8, 16)).astype(np.int32)
    # SGD, not Adam: the stem's bias feeds a BatchNorm, so its gradient is rounding
    # noise, which Adam's normalisation would blow up to full-size steps.
    single = Trainer(mg.compile(graph), optax.sgd(0.05, momentum=0.9))
    fused = Trainer(mg.compile(graph), optax.sgd(0.05, momentum=0.9))
    ts_a = single.init(jax.random.key(3))
    ts_b = fused.init(jax.random.key(3))
    losses = []
    for i in range(8):
        ts_a, metrics = single.train_step(ts_a, images[i], labels[i])
        losses.append(float(metrics["loss"]))
    ts_b, stacked = fused.train_steps(ts_b, images, labels)
    assert stacked["loss"].shape == (8,)
    np.testing.assert_allclose(stacked["loss"], losses, rtol=1e-5, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 (ts_a.params, ts_a.state), (ts_b.params, ts_b.state))
    assert int(ts_b.step) == 8 and fused.trace_counts["train_steps"] == 1
    with pytest.raises(mg.ShapeError, match=r"inputs and targets give \[2, 8\]"):
        fused.train_steps(ts_b, images, labels[:2])  # was scan's own ValueError


def test_by_default_the_step_reports_the_loss_only_and_carries_raw_key_data():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    assert ts.rng.dtype == np.uint32  # plain data: the step stays on the fast dispatch path
    ts, metrics = trainer.train_step(ts, *_data(8))
    assert sorted(metrics) == ["loss"]
    with pytest.raises(mg.GraphError, match=r"\('accuracy',\)"):
        Trainer(trainer.model, optax.sgd(0.1), metrics="accuracy")


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_dropout_masks_follow_the_key_and_the_step(impl):
    """Step n's dropout masks come from fold_in(key, n) with the key's own PRNG: two
    trainers from the same key agree step by step; the masks differ between steps."""
    graph = mlp(4, (64,), 3, dropout=0.5)
    key = jax.random.key(3, impl=impl)
    x, y = _data(16)
    runs = []
    for _ in range(2):
        trainer = Trainer(mg.compile(graph), optax.sgd(0.0))  # params never move
        ts = trainer.init(key)
        losses = []
        for _ in range(3):
            ts, metrics = trainer.train_step(ts, x, y)
            losses.append(float(metrics["loss"]))
        runs.append(losses)
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 3  # fresh masks every step
    wanted = jax.random.key_data(jax.random.split(key)[1])
    np.testing.assert_array_equal(ts.rng, wanted)


def test_train_step_donates_the_old_state():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.adam(1e-3))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(8)
    old_kernel = ts.params["dense"]["kernel"]
    new, _ = trainer.train_step(ts, x, y)
    assert old_kernel.is_deleted()
    assert not new.params["dense"]["kernel"].is_deleted()


def test_fit_traces_each_step_once_and_learns():
    x, y = _data(200)
    trainer = Trainer(mg.compile(mlp(4, (32,), 3, dropout=0.1)), optax.adam(1e-2),
                      metrics=("accuracy",))
    ts, history = trainer.fit(trainer.init(jax.random.key(0)), (x, y), epochs=6,
                              batch_size=32, validation=(x[:50], y[:50]), progress=False)
    assert trainer.trace_counts == {"train_step": 1, "eval_step": 1}
    assert history["epoch"] == [1, 2, 3, 4, 5, 6]
    assert int(ts.step) == 6 * (200 // 32)  # the partial batch is dropped
    assert history["loss"][-1] < history["loss"][0]
    assert history["val_accuracy"][-1] > 0.85


def test_fit_without_a_train_state_is_named_as_keras_users_call_it():
    x, y = _data(16)
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    for call in (lambda: trainer.fit((x, y), epochs=1, batch_size=8),
                 lambda: trainer.fit(x, y, epochs=1, batch_size=8)):
        with pytest.raises(mg.GraphError, match=r"fit trains a train state: trainer\.fit\(ts, "
                                                r"\(inputs, targets\), \.\.\.\), ts from "
                                                r"trainer\.init\(key\).*got (tuple|ndarray) first"):
            call()
    with pytest.raises(mg.ShapeError, match="training data must be a pair"):
        trainer.fit(trainer.init(jax.random.key(0)), epochs=1, batch_size=8)


def test_fit_with_fused_steps_traces_once_and_matches_single_steps():
    x, y = _data(128)
    runs = []
    for k in (1, 4):
        trainer = Trainer(mg.compile(mlp(4, (16,), 3)), optax.adam(1e-2))
        ts, history = trainer.fit(trainer.init(jax.random.key(0)), (x, y), epochs=2,
                                  batch_size=16, steps_per_dispatch=k, progress=False)
        runs.append((ts, history, dict(trainer.trace_counts)))
    (ts1, h1, _), (ts4, h4, counts4) = runs
    assert counts4 == {"train_steps": 1}
    np.testing.assert_allclose(h1["loss"], h4["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 ts1.params, ts4.params)


def test_evaluate_pads_the_last_batch_and_weighs_it_out():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1), metrics=("accuracy",))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(50)
    result = evaluate(trainer, ts, (x, y), batch_size=16)  # 16+16+16+2
    logits = np.asarray(trainer.predict(ts, x), np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(result["loss"], -logp[np.arange(50), y].mean(), rtol=1e-5)
    np.testing.assert_allclose(result["accuracy"], (logits.argmax(1) == y).mean(), rtol=1e-6)
    assert trainer.trace_counts["eval_step"] == 1


@pytest.mark.parametrize("batch_size", [4, 8])  # batch 8 = the sequence length
def test_evaluate_of_a_sequence_model_weighs_examples_not_positions(batch_size):
    # per-position losses (batch, length) against per-example weights (batch,): the
    # weights lined up with the positions (val_loss 8x, accuracy above 1, or a shape error)
    vocab, length = 11, 8
    x = mg.Input(("batch", length), "int32", name="ids")
    graph = mg.Graph(x, ops.Linear(vocab, name="head")(ops.Embedding(vocab, 6, name="embed")(x)))
    trainer = Trainer(mg.compile(graph), optax.sgd(0.1), metrics=("accuracy",))
    ts = trainer.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (13, length)).astype(np.int32)
    labels = rng.integers(0, vocab, (13, length)).astype(np.int32)
    result = evaluate(trainer, ts, (ids, labels), batch_size=batch_size)
    logits = np.asarray(trainer.predict(ts, ids), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(result["loss"], -picked.mean(), rtol=1e-5)
    np.testing.assert_allclose(result["accuracy"], (logits.argmax(-1) == labels).mean(), rtol=1e-6)
    with pytest.raises(mg.ShapeError, match=r"weights has shape \(3,\); it takes one weight per "
                                            r"example, shape \(13,\)"):
        trainer.eval_step(ts, ids, labels, np.ones(3, np.float32))


def test_early_stopping_returns_the_history_so_far():
    x, y = _data(64)
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.0))  # never improves
    ts, history = trainer.fit(trainer.init(jax.random.key(0)), (x, y), epochs=10,
                              batch_size=16, validation=(x, y), patience=2, progress=False)
    assert history["epoch"] == [1, 2, 3]


def test_bfloat16_policy_keeps_float32_master_weights():
    policy = mg.Policy(compute_dtype="bfloat16")
    trainer = Trainer(mg.compile(mlp(4, (8,), 3), policy), optax.adam(1e-3))
    ts = trainer.init(jax.random.key(0))
    ts, metrics = trainer.train_step(ts, *_data(8))
    assert {str(p.dtype) for p in jax.tree.leaves(ts.params)} == {"float32"}
    assert metrics["loss"].dtype == jnp.float32
    assert trainer.loss_scale is None  # no loss scaling is needed for bfloat16
    jaxpr = str(jax.make_jaxpr(trainer.step_fn)(ts, *_data(8)))
    assert "bf16" in jaxpr


def test_float16_with_a_huge_loss_scale_recovers():
    policy = mg.Policy(compute_dtype="float16")
    x, y = _data(64)
    trainer = Trainer(mg.compile(mlp(4, (16,), 3), policy), optax.adam(1e-2),
                      loss_scale=DynamicLossScale.create(2.0 ** 40, period=1000))
    ts = trainer.init(jax.random.key(0))
    start = jax.tree.map(np.array, ts.params)
    ts, metrics = trainer.train_step(ts, x[:16], y[:16])
    # The scaled float16 gradients overflow: the update is skipped, the scale drops.
    assert float(metrics["loss_scale"]) == 2.0 ** 39
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, ts.params), start)
    ts, history = trainer.fit(ts, (x, y), epochs=40, batch_size=16, progress=False)
    scale = float(ts.loss_scale.scale)
    # It came down to where the float16 gradients are finite, and stayed there.
    assert 1.0 <= scale <= 2.0 ** 30, scale
    assert int(ts.loss_scale.good_steps) > 100
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(ts.params))
    assert history["loss"][-1] < 0.5 * history["loss"][0]


def test_float16_policy_turns_on_dynamic_loss_scaling():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3), mg.Policy(compute_dtype="float16")),
                      optax.sgd(0.1))
    assert float(trainer.loss_scale.scale) == 2.0 ** 15
    assert Trainer(trainer.model, optax.sgd(0.1), loss_scale=None).loss_scale is None


def test_loss_scale_grows_after_a_period_of_finite_steps():
    scale = DynamicLossScale.create(8.0, period=3)
    seen = []
    for finite in (True, True, True, True, False, False, True):
        scale = scale.adjust(jnp.array(finite))
        seen.append(float(scale.scale))
    assert seen == [8.0, 8.0, 16.0, 16.0, 8.0, 4.0, 4.0]
    assert float(DynamicLossScale.create(1.0).adjust(jnp.array(False)).scale) == 1.0


def test_custom_loss_and_metrics():
    x_in = mg.Input(("batch", 3))
    trainer = Trainer(mg.compile(mg.Graph(x_in, ops.Linear(1, name="w")(x_in))), optax.sgd(0.1),
                      loss="mean_squared_error",
                      metrics={"mae": lambda out, t: jnp.abs(out - t).mean(axis=1)})
    ts = trainer.init(jax.random.key(0))
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    t = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32))
    out = np.asarray(trainer.predict(ts, x))
    ts2, metrics = trainer.train_step(ts, x, t)
    np.testing.assert_allclose(metrics["loss"], ((out - t) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["mae"], np.abs(out - t).mean(), rtol=1e-5)


def test_bad_arguments_raise_mlaxgraph_errors():
    model = mg.compile(mlp(4, (8,), 3))
    with pytest.raises(mg.GraphError, match="optax optimizer"):
        Trainer(model, "adam")
    with pytest.raises(mg.GraphError, match="Trainer takes a compiled model"):
        Trainer(mlp(4, (8,), 3), optax.sgd(0.1))
    with pytest.raises(mg.GraphError, match="unknown loss 'hinge';"):
        Trainer(model, optax.sgd(0.1), loss="hinge")
    # Keras's names and typos get the name of the same loss here.
    with pytest.raises(mg.GraphError, match="unknown loss 'mse' \\(did you mean 'mean_squared_error'"):
        Trainer(model, optax.sgd(0.1), loss="mse")
    with pytest.raises(mg.GraphError, match="did you mean 'softmax_cross_entropy' \\(of logits"):
        Trainer(model, optax.sgd(0.1), loss="sparse_categorical_crossentropy")
    with pytest.raises(mg.GraphError, match="did you mean 'mean_squared_error'"):
        Trainer(model, optax.sgd(0.1), loss="mean_square_error")
    with pytest.raises(mg.GraphError, match="unknown metric 'f1'"):
        Trainer(model, optax.sgd(0.1), metrics=("f1",))
    trainer = Trainer(model, optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(10)
    with pytest.raises(mg.ShapeError, match="batch_size=16 does not fit the 10"):
        trainer.fit(ts, (x, y), epochs=1, batch_size=16, progress=False)
    # a ZeroDivisionError, a TypeError, or a dispatch of no steps that ran
    for bad in ({"batch_size": 0}, {"batch_size": 4.0}, {"steps_per_dispatch": 0},
                {"steps_per_dispatch": -2}, {"epochs": -1}):
        name = next(iter(bad))
        with pytest.raises(mg.ConfigError, match=f"fit: {name} is an int >= "):
            trainer.fit(ts, (x, y), **{"epochs": 1, "batch_size": 4, **bad}, progress=False)
    with pytest.raises(mg.ShapeError, match="different numbers of examples"):
        trainer.fit(ts, (x, y[:5]), epochs=1, batch_size=4, progress=False)
    with pytest.raises(mg.ShapeError, match="takes 1 inputs, got 2"):
        trainer.fit(ts, ((x, x), y), epochs=1, batch_size=4, progress=False)
    # class ids outside the output's 3 classes: named before any step (the loss gives NaN)
    with pytest.raises(mg.ShapeError, match=r"training data: the targets hold class id 3, and the "
                                            r"graph's output 'logits' has 3 classes: ids must be "
                                            r"in \[0, 3\); they run from 1 to 3: class ids count "
                                            r"from 0 \(targets - 1\)"):
        trainer.fit(ts, (x, y + 1), epochs=1, batch_size=4, progress=False)
    with pytest.raises(mg.ShapeError, match=r"validation data: the targets hold class id -100, .*"
                                            r"Hugging Face's labels"):
        trainer.fit(ts, (x, y), epochs=1, batch_size=4, progress=False,
                    validation=(x, np.where(y == 0, -100, y)))
    assert int(ts.step) == 0  # nothing was trained


def _log_softmax_ce(logits, labels):
    """Cross-entropy of class ids in NumPy (float64): the reference."""
    logits = np.asarray(logits, np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    return -logp[np.arange(len(labels)), labels]


def test_steps_refuse_class_ids_outside_the_classes_of_host_targets():
    """train_step, train_steps and eval_step check class ids held in a NumPy array
    (on the host, before dispatch) as fit does; on a device, an id outside [0, classes)
    gives the loss NaN, never another class's loss."""
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(8)
    for bad, hint in ((3, r"\[0, 3\)$"), (-1, r"\[0, 3\)$"), (-100, "Hugging Face's labels")):
        labels = y.copy()
        labels[2] = bad
        for name, call in (("train_step", lambda t: trainer.train_step(ts, x, t)),
                           ("train_steps", lambda t: trainer.train_steps(ts, x[None], t[None])),
                           ("eval_step", lambda t: trainer.eval_step(ts, x, t))):
            with pytest.raises(mg.ShapeError, match=f"{name}: the targets hold class id {bad}, and "
                                                    f"the graph's output 'logits' has 3 classes.*{hint}"):
                call(labels)
        metrics = trainer.eval_step(ts, jnp.asarray(x), jnp.asarray(labels))  # not read back
        assert np.isnan(float(metrics["loss"]))
    assert int(ts.step) == 0
    logits = np.asarray(trainer.predict(ts, x))
    np.testing.assert_allclose(float(trainer.eval_step(ts, x, y)["loss"]),
                               _log_softmax_ce(logits, y).mean(), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_loss_function_gets_float32_outputs_as_the_named_loss(dtype):
    model = mg.compile(mlp(4, (8,), 3), dtype)
    seen = []

    def loss(outputs, targets):
        seen.append(outputs.dtype)
        return optax.softmax_cross_entropy_with_integer_labels(outputs, targets)

    def metric(outputs, targets):
        seen.append(outputs.dtype)
        return jnp.max(outputs, axis=-1)

    custom = Trainer(model, optax.sgd(0.1), loss=loss, metrics={"top": metric}, loss_scale=None)
    ts = custom.init(jax.random.key(0))
    x, y = _data(8)
    got = custom.eval_step(ts, x, y)
    assert seen == [np.float32, np.float32]
    logits = np.asarray(custom.predict(ts, x)).astype(np.float32)
    np.testing.assert_allclose(float(got["loss"]), _log_softmax_ce(logits, y).mean(), rtol=1e-5)
    named = Trainer(model, optax.sgd(0.1), loss_scale=None)
    assert float(named.eval_step(ts, x, y)["loss"]) == float(got["loss"])


def test_what_a_loss_or_metric_function_returns_is_checked():
    model = mg.compile(mlp(4, (8,), 3))
    x, y = _data(8)

    def step(loss, metrics=None):
        trainer = Trainer(model, optax.sgd(0.1), loss=loss, metrics=metrics)
        return trainer.train_step(trainer.init(jax.random.key(0)), x, y)

    ce = optax.softmax_cross_entropy_with_integer_labels
    with pytest.raises(mg.DTypeError, match=r"the loss returned complex values \(complex64\[8\]\)"):
        step(lambda o, t: ce(o, t).astype(jnp.complex64))
    with pytest.raises(mg.DTypeError, match=r"the loss returned int32 values .*no gradient"):
        step(lambda o, t: jnp.argmax(o, -1))
    with pytest.raises(mg.GraphError, match="the loss returned the Python number 1.5, a constant"):
        step(lambda o, t: 1.5)
    with pytest.raises(mg.GraphError, match="the loss returned a dict; it returns per-example"):
        step(lambda o, t: {"loss": ce(o, t)})
    with pytest.raises(mg.GraphError, match=r"the loss returned a tuple; .*capture="):
        step(lambda o, t: (ce(o, t), o))
    with pytest.raises(mg.DTypeError, match="metric 'c' returned complex values"):
        step("softmax_cross_entropy", {"c": lambda o, t: o[:, 0].astype(jnp.complex64)})
    _, metrics = step("softmax_cross_entropy", {"one": lambda o, t: 1.0, "hit": lambda o, t: o.argmax(-1) == t})
    assert float(metrics["one"]) == 1.0 and metrics["hit"].dtype == np.float32


def test_misused_steps_name_what_they_take():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.adam(0.1))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(8)
    with pytest.raises(mg.GraphError, match=r"train_step got unexpected keyword argument 'rng' "
                                            r"\(the step draws its dropout keys from the train state"):
        trainer.train_step(ts, x, y, rng=jax.random.key(1))
    with pytest.raises(mg.GraphError, match=r"takes train_step\(ts, inputs, targets\): a TrainState "
                                            r"first, got ndarray; the train state is argument 2"):
        trainer.train_step(x, ts, y)
    with pytest.raises(mg.GraphError, match="eval_step got unexpected keyword argument 'weight' "
                                            r"\(did you mean weights\?\)"):
        trainer.eval_step(ts, x, y, weight=np.ones(8, np.float32))
    with pytest.raises(mg.GraphError, match="got 3 arguments after ts; a graph with several inputs"):
        trainer.train_step(ts, x, x, y)
    with pytest.raises(mg.GraphError, match=r"Trainer.init takes one JAX random key, .*got 0$"):
        trainer.init(0)
    # another optimizer's state, either way
    momentum = Trainer(trainer.model, optax.sgd(0.1, momentum=0.9))
    for a, b in ((trainer, momentum), (momentum, trainer), (Trainer(trainer.model, optax.sgd(0.1)), trainer)):
        with pytest.raises(mg.GraphError, match="train_step: ts.opt_state is not this Trainer's optimizer state"):
            a.train_step(b.init(jax.random.key(0)), x, y)
    # train_steps given one batch, not batches stacked on a steps axis
    with pytest.raises(mg.ShapeError, match=r"train_steps runs k steps on batches stacked on a "
                                            r"leading steps axis, and input .* got float32\[8, 4\], one batch"):
        trainer.train_steps(ts, x, y)
    assert int(ts.step) == 0 and float(trainer.eval_step(ts, x, y, np.ones(8, np.float32))["loss"]) > 0


def test_optax_multi_steps_accumulates_gradients_as_written_out():
    """optax.MultiSteps (optax's gradient accumulation) is taken as its
    gradient_transformation(): every k-th step applies the mean of k gradients."""
    model = mg.compile(mlp(4, (8,), 3))
    trainer = Trainer(model, optax.MultiSteps(optax.sgd(0.5), every_k_schedule=2))
    ts = trainer.init(jax.random.key(0))
    params = jax.tree.map(np.asarray, ts.params)
    batches = [_data(8, seed=s) for s in range(4)]

    def loss(p, x, y):
        logits = model.apply_fn(p, ts.state, x, inference_mode=False)[0]
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

    want = params
    for i in range(0, 4, 2):
        g = [jax.grad(loss)(want, *batches[j]) for j in (i, i + 1)]
        want = jax.tree.map(lambda p, a, b: p - 0.5 * (a + b) / 2, want, *g)
    for x, y in batches:
        ts, _ = trainer.train_step(ts, x, y)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), ts.params, want)


def test_fit_names_its_misused_arguments_before_python_does():
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    x, y = _data(16)
    with pytest.raises(mg.GraphError, match=r"fit got unexpected keyword argument 'batch_sise' "
                                            r"\(did you mean batch_size\?\)"):
        trainer.fit(ts, (x, y), epochs=1, batch_sise=8)
    with pytest.raises(mg.GraphError, match="fit needs batch_size"):
        trainer.fit(ts, (x, y), epochs=1)
    with pytest.raises(mg.GraphError, match=r"fit takes the training data as one pair: .*got 2 "
                                            r"positional arguments after ts"):
        trainer.fit(ts, x, y, epochs=1, batch_size=8)
    with pytest.raises(mg.DTypeError, match=r"training data: input 'x' is <U1\[16, 4\]"):
        trainer.fit(ts, (np.full((16, 4), "a"), y), epochs=1, batch_size=8, progress=False)
    # the inputs the train step refuses, fit refuses too; float64 NumPy data both take
    with pytest.raises(mg.DTypeError, match=r"input 'x' is int32\[16, 4\], .*cast it"):
        trainer.fit(ts, (x.astype(np.int32), y), epochs=1, batch_size=8, progress=False)
    with pytest.raises(mg.DTypeError):
        trainer.train_step(ts, x.astype(np.int32), y)
    ts, history = trainer.fit(ts, (x.astype(np.float64), y), epochs=1, batch_size=8, progress=False)
    assert int(ts.step) == 2


def test_trainable_takes_a_list_of_globs():
    """``trainable=["a/*", "c/kernel"]`` trains the weights any glob matches (SGD,
    against plain JAX's gradient); a glob in the list matching nothing is named."""
    x = mg.Input(("batch", 3), name="x")
    h = ops.Linear(4, name="a")(x)
    h = ops.Linear(4, name="b")(ops.tanh(h))
    g = mg.Graph(x, ops.Linear(2, name="c")(ops.tanh(h)))
    model = mg.compile(g)
    trainer = mg.train.Trainer(model, optax.sgd(0.5), loss="mean_squared_error", trainable=["a/*", "c/kernel"])
    ts = trainer.init(jax.random.key(0))
    params = jax.tree.map(np.asarray, ts.params)
    xs = np.asarray(jax.random.normal(jax.random.key(1), (5, 3)))
    ys = np.asarray(jax.random.normal(jax.random.key(2), (5, 2)))

    def loss(p):
        h = jnp.tanh(xs @ p["a"]["kernel"] + p["a"]["bias"])
        h = jnp.tanh(h @ p["b"]["kernel"] + p["b"]["bias"])
        return jnp.mean((h @ p["c"]["kernel"] + p["c"]["bias"] - ys) ** 2)

    grads = jax.grad(loss)(params)
    new, _ = trainer.train_step(ts, xs, ys)
    for layer, weight in [("a", "kernel"), ("a", "bias"), ("c", "kernel")]:
        np.testing.assert_allclose(new.params[layer][weight],
                                   params[layer][weight] - 0.5 * grads[layer][weight], rtol=1e-5, atol=1e-6)
    for layer, weight in [("b", "kernel"), ("b", "bias"), ("c", "bias")]:
        np.testing.assert_array_equal(new.params[layer][weight], params[layer][weight])
    with pytest.raises(mg.GraphError, match=r"pattern 'd/\*' matches no weight"):
        mg.train.Trainer(model, optax.sgd(0.5), loss="mean_squared_error", trainable=["a/*", "d/*"])
