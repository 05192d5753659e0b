"""The benchmark models in Haiku: functions of ``hk.Module`` objects made pure by
``hk.transform_with_state``, and a ``jax.jit`` train step over ``(params, state,
opt_state)``, as Haiku's examples train. Built-in layers: ``hk.Linear``,
``hk.Conv2D``, ``hk.BatchNorm``, ``hk.LayerNorm``, ``hk.MultiHeadAttention``,
``hk.Embed``, ``hk.LSTM`` under ``hk.dynamic_unroll``.

Differences from the hand-written models, inherent to Haiku: conv kernels are HWIO;
``hk.BatchNorm`` keeps its running statistics as zero-debiased exponential moving
averages (a ``hidden`` and a ``counter`` besides the average), so its state is larger
and its update does a little more arithmetic; ``hk.MultiHeadAttention`` projects with
``(d, heads * head_dim)`` matrices; ``hk.LSTM`` multiplies the concatenated input and
hidden state by one matrix inside the scan.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import optax

import models_spec as S
from _common import Run
from models_hand import loss_fn, param_count


def _bn():
    return hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=S.BN_MOMENTUM,
                        eps=S.BN_EPSILON)


def _mlp(sizes):
    def forward(x, is_training):
        for width in sizes[1:-1]:
            x = jax.nn.relu(hk.Linear(width)(x))
        return hk.Linear(sizes[-1])(x)

    return forward


def _cnn(x, is_training):
    x = jax.nn.relu(hk.Conv2D(S.CNN_CHANNELS, 3, padding="SAME")(x))
    x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
    return hk.Linear(10)(hk.Flatten()(x))


def _block(x, channels, stride, is_training):
    h = hk.Conv2D(channels, 3, stride=stride, padding="SAME", with_bias=False)(x)
    h = jax.nn.relu(_bn()(h, is_training))
    h = hk.Conv2D(channels, 3, padding="SAME", with_bias=False)(h)
    h = _bn()(h, is_training)
    if stride != 1 or x.shape[-1] != channels:
        x = hk.Conv2D(channels, 1, stride=stride, padding="SAME", with_bias=False)(x)
        x = _bn()(x, is_training)
    return jax.nn.relu(h + x)


def _resnet(x, is_training):
    x = hk.Conv2D(S.RESNET_STEM, 3, padding="SAME", with_bias=False)(x)
    x = jax.nn.relu(_bn()(x, is_training))
    for channels, stride in S.RESNET_STAGES:
        x = _block(x, channels, stride, is_training)
    return hk.Linear(10)(jnp.mean(x, axis=(1, 2)))


def _transformer(x, is_training):
    t = S.TRANSFORMER
    d = t["width"]

    def ln(v):
        return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=S.LN_EPSILON)(v)

    h = ln(x)
    attention = hk.MultiHeadAttention(num_heads=t["heads"], key_size=d // t["heads"], model_size=d,
                                      w_init=hk.initializers.VarianceScaling(1.0))
    x = x + attention(h, h, h)
    h = hk.Linear(d)(jax.nn.gelu(hk.Linear(t["mlp"])(ln(x)), approximate=False))
    return hk.Linear(10)(jnp.mean(x + h, axis=1))


def _lstm(tokens, is_training):
    t = S.LSTM
    x = hk.Embed(S.SPECS["lstm"].vocab, t["width"])(tokens)
    core = hk.LSTM(t["hidden"])
    _, final = hk.dynamic_unroll(core, x, core.initial_state(tokens.shape[0]), time_major=False)
    return hk.Linear(5)(final.hidden)


def forward_fn(name: str):
    if name in ("mlp", "tiny_mlp"):
        return _mlp((784, *S.MLP_HIDDEN, 10) if name == "mlp" else S.TINY_MLP)
    return {"cnn": _cnn, "resnet": _resnet, "transformer": _transformer, "lstm": _lstm}[name]


def make(name: str, x, y, key) -> Run:
    net = hk.transform_with_state(forward_fn(name))
    params, state = net.init(key, x[:1], is_training=True)
    tx = S.optimizer()

    def step_fn(ts, x, y):
        params, state, opt_state = ts

        def objective(p):
            logits, new_state = net.apply(p, state, None, x, is_training=True)
            return loss_fn(logits, y), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), new_state, opt_state), loss

    jstep = jax.jit(step_fn, donate_argnums=0)
    cell = [(params, state, tx.init(params))]

    def step():
        cell[0], loss = jstep(cell[0], x, y)
        return loss

    run = Run("haiku", name, step, lambda: jstep.lower(cell[0], x, y), param_count(params),
              state=lambda: cell[0])
    run.aot = (jstep, lambda: (cell[0], x, y))
    return run
