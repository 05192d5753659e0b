"""The benchmark models in Keras 3 on its JAX backend: functional-API models of
built-in layers (``Dense``, ``Conv2D``, ``MaxPooling2D``, ``BatchNormalization``,
``LayerNormalization``, ``MultiHeadAttention``, ``Embedding``, ``LSTM``), the
functional API users compare mlaxgraph with.

The train step is the one Keras documents for custom JAX training loops
("Writing a training loop from scratch in JAX"): ``model.stateless_call`` on the
trainable and non-trainable variables inside a jitted ``jax.value_and_grad``, the
update by the same optax Adam as every system (Keras's own optimizers would be a
different update), the state donated. Keras's own ``train_on_batch`` and ``fit``
are measured beside it on the MLP (``keras_fit_vs_step``).

Differences from the hand-written models, inherent to Keras: Keras's BatchNormalization
``momentum`` is the weight of the old statistics, as ours; its LSTM keeps one bias
like ours; its MultiHeadAttention has the four biases, like ours.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import optax  # noqa: E402

import models_spec as S  # noqa: E402
from _common import Run  # noqa: E402
from models_hand import loss_fn  # noqa: E402

assert keras.backend.backend() == "jax", "set KERAS_BACKEND=jax"


def _dense(units, activation=None):
    return keras.layers.Dense(units, activation=activation)


def build(name: str) -> keras.Model:
    spec = S.SPECS[name]
    inputs = keras.Input(spec.x_shape, dtype=spec.x_dtype)
    if name in ("mlp", "tiny_mlp"):
        sizes = S.TINY_MLP if name == "tiny_mlp" else (784, *S.MLP_HIDDEN, 10)
        h = inputs
        for width in sizes[1:-1]:
            h = _dense(width, "relu")(h)
        return keras.Model(inputs, _dense(sizes[-1])(h))
    if name == "cnn":
        h = keras.layers.Conv2D(S.CNN_CHANNELS, 3, padding="same", activation="relu")(inputs)
        h = keras.layers.Flatten()(keras.layers.MaxPooling2D(2)(h))
        return keras.Model(inputs, _dense(10)(h))
    if name == "resnet":
        def bn(h):
            return keras.layers.BatchNormalization(momentum=S.BN_MOMENTUM, epsilon=S.BN_EPSILON)(h)

        h = keras.layers.ReLU()(bn(keras.layers.Conv2D(S.RESNET_STEM, 3, padding="same", use_bias=False)(inputs)))
        channels_in = S.RESNET_STEM
        for channels, stride in S.RESNET_STAGES:
            y = keras.layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False)(h)
            y = keras.layers.ReLU()(bn(y))
            y = bn(keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(y))
            shortcut = h
            if stride != 1 or channels != channels_in:
                shortcut = bn(keras.layers.Conv2D(channels, 1, strides=stride, use_bias=False)(h))
            h = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
            channels_in = channels
        return keras.Model(inputs, _dense(10)(keras.layers.GlobalAveragePooling2D()(h)))
    if name == "transformer":
        t = S.TRANSFORMER
        x = inputs
        h = keras.layers.LayerNormalization(epsilon=S.LN_EPSILON)(x)
        h = keras.layers.MultiHeadAttention(t["heads"], t["width"] // t["heads"])(h, h)
        h = keras.layers.Add()([x, h])
        m = keras.layers.LayerNormalization(epsilon=S.LN_EPSILON)(h)
        m = _dense(t["width"])(keras.layers.Activation(lambda v: keras.activations.gelu(v, approximate=False))(
            _dense(t["mlp"])(m)))
        h = keras.layers.Add()([h, m])
        return keras.Model(inputs, _dense(10)(keras.layers.GlobalAveragePooling1D()(h)))
    if name == "lstm":
        t = S.LSTM
        h = keras.layers.Embedding(spec.vocab, t["width"])(inputs)
        h = keras.layers.LSTM(t["hidden"])(h)
        return keras.Model(inputs, _dense(spec.classes)(h))
    raise ValueError(name)


def make(name: str, x, y, key) -> Run:
    keras.utils.set_random_seed(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    model = build(name)
    tx = S.optimizer()
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def step_fn(ts, x, y):
        trainable, non_trainable, opt_state = ts

        def objective(tv):
            logits, new_non_trainable = model.stateless_call(tv, non_trainable, x, training=True)
            return loss_fn(logits, y), new_non_trainable

        (loss, new_non_trainable), grads = jax.value_and_grad(objective, has_aux=True)(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), new_non_trainable, opt_state), loss

    jstep = jax.jit(step_fn, donate_argnums=0)
    cell = [(trainable, non_trainable, tx.init(trainable))]

    def step():
        cell[0], loss = jstep(cell[0], x, y)
        return loss

    count = sum(int(v.size) for v in trainable)
    run = Run("keras", name, step, lambda: jstep.lower(cell[0], x, y), count, state=lambda: cell[0],
              notes="stateless_call in a jitted optax step (Keras's custom JAX loop)")
    run.aot = (jstep, lambda: (cell[0], x, y))
    return run


def fit_and_train_on_batch(name: str, x, y, steps: int = 50) -> dict:
    """Per-step seconds of Keras's own ``train_on_batch`` and ``fit`` (Adam, jit_compile),
    for the table beside the custom loop."""
    import time

    model = build(name)
    model.compile(optimizer=keras.optimizers.Adam(S.LEARNING_RATE),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    model.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(x, y)
    float(loss if not isinstance(loss, list) else loss[0])
    on_batch = (time.perf_counter() - start) / steps
    import numpy as np

    xs, ys = np.concatenate([x] * steps), np.concatenate([y] * steps)
    model.fit(xs[: len(x) * 2], ys[: len(y) * 2], batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    start = time.perf_counter()
    model.fit(xs, ys, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    return {"train_on_batch": on_batch, "fit": (time.perf_counter() - start) / steps}
