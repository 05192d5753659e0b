"""The benchmark models in Equinox: ``eqx.Module`` pytrees that act on one example,
``jax.vmap``-ed over the batch, with ``eqx.filter_jit`` and
``eqx.filter_value_and_grad`` around the train step and ``eqx.nn.State`` for the
BatchNorm statistics, as Equinox's documentation trains a model. Built-in layers:
``eqx.nn.Linear``, ``Conv2d``, ``MaxPool2d``, ``BatchNorm`` (``mode="batch"``: batch
statistics in training, as the other systems), ``LayerNorm``, ``MultiheadAttention``
(with all four biases, as the other systems), ``Embedding`` and ``LSTMCell`` under
``lax.scan``.

Differences from the hand-written models, inherent to Equinox: images are
channel-first (the batch is transposed to ``(batch, channels, height, width)`` once,
outside the timed step); conv kernels are OIHW; the LSTM cell multiplies input and
hidden state inside the scan.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

import models_spec as S
from _common import Run
from models_hand import loss_fn, param_count


class MLP(eqx.Module):
    layers: list

    def __init__(self, sizes, key):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [eqx.nn.Linear(a, b, key=k) for a, b, k in zip(sizes[:-1], sizes[1:], keys)]

    def __call__(self, x, state):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x), state


class CNN(eqx.Module):
    conv: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    out: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(1, S.CNN_CHANNELS, 3, padding="SAME", key=k1)
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.out = eqx.nn.Linear(4 * 4 * S.CNN_CHANNELS, 10, key=k2)

    def __call__(self, x, state):
        return self.out(self.pool(jax.nn.relu(self.conv(x))).reshape(-1)), state


def _bn(c):
    return eqx.nn.BatchNorm(c, axis_name="batch", momentum=S.BN_MOMENTUM, eps=S.BN_EPSILON,
                            mode="batch")


class Block(eqx.Module):
    conv_a: eqx.nn.Conv2d
    bn_a: eqx.nn.BatchNorm
    conv_b: eqx.nn.Conv2d
    bn_b: eqx.nn.BatchNorm
    proj: eqx.nn.Conv2d | None
    proj_bn: eqx.nn.BatchNorm | None

    def __init__(self, c_in, c, stride, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv_a = eqx.nn.Conv2d(c_in, c, 3, stride=stride, padding="SAME", use_bias=False, key=k1)
        self.bn_a = _bn(c)
        self.conv_b = eqx.nn.Conv2d(c, c, 3, padding="SAME", use_bias=False, key=k2)
        self.bn_b = _bn(c)
        if stride != 1 or c_in != c:
            self.proj = eqx.nn.Conv2d(c_in, c, 1, stride=stride, padding="SAME", use_bias=False, key=k3)
            self.proj_bn = _bn(c)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x, state):
        h, state = self.bn_a(self.conv_a(x), state)
        h, state = self.bn_b(self.conv_b(jax.nn.relu(h)), state)
        if self.proj is not None:
            x, state = self.proj_bn(self.proj(x), state)
        return jax.nn.relu(h + x), state


class ResNet(eqx.Module):
    stem: eqx.nn.Conv2d
    stem_bn: eqx.nn.BatchNorm
    blocks: list
    out: eqx.nn.Linear

    def __init__(self, key):
        keys = jax.random.split(key, 2 + len(S.RESNET_STAGES))
        self.stem = eqx.nn.Conv2d(3, S.RESNET_STEM, 3, padding="SAME", use_bias=False, key=keys[0])
        self.stem_bn = _bn(S.RESNET_STEM)
        blocks, c_in = [], S.RESNET_STEM
        for (c, stride), k in zip(S.RESNET_STAGES, keys[2:]):
            blocks.append(Block(c_in, c, stride, k))
            c_in = c
        self.blocks = blocks
        self.out = eqx.nn.Linear(c_in, 10, key=keys[1])

    def __call__(self, x, state):
        x, state = self.stem_bn(self.stem(x), state)
        x = jax.nn.relu(x)
        for block in self.blocks:
            x, state = block(x, state)
        return self.out(jnp.mean(x, axis=(1, 2))), state


class Transformer(eqx.Module):
    ln_attention: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    ln_mlp: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    out: eqx.nn.Linear

    def __init__(self, key):
        t = S.TRANSFORMER
        d = t["width"]
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.ln_attention = eqx.nn.LayerNorm(d, eps=S.LN_EPSILON)
        self.attention = eqx.nn.MultiheadAttention(t["heads"], d, use_query_bias=True, use_key_bias=True,
                                                   use_value_bias=True, use_output_bias=True, key=k1)
        self.ln_mlp = eqx.nn.LayerNorm(d, eps=S.LN_EPSILON)
        self.mlp_in = eqx.nn.Linear(d, t["mlp"], key=k2)
        self.mlp_out = eqx.nn.Linear(t["mlp"], d, key=k3)
        self.out = eqx.nn.Linear(d, 10, key=k4)

    def __call__(self, x, state):                     # x: (length, width)
        h = jax.vmap(self.ln_attention)(x)
        x = x + self.attention(h, h, h)
        h = jax.vmap(self.ln_mlp)(x)
        h = jax.vmap(lambda v: self.mlp_out(jax.nn.gelu(self.mlp_in(v), approximate=False)))(h)
        return self.out(jnp.mean(x + h, axis=0)), state


class LSTMClassifier(eqx.Module):
    embed: eqx.nn.Embedding
    cell: eqx.nn.LSTMCell
    out: eqx.nn.Linear

    def __init__(self, key):
        t = S.LSTM
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(S.SPECS["lstm"].vocab, t["width"], key=k1)
        self.cell = eqx.nn.LSTMCell(t["width"], t["hidden"], key=k2)
        self.out = eqx.nn.Linear(t["hidden"], 5, key=k3)

    def __call__(self, tokens, state):                # tokens: (length,)
        x = jax.vmap(self.embed)(tokens)
        zeros = jnp.zeros((self.cell.hidden_size,))

        def body(carry, x_t):
            return self.cell(x_t, carry), None

        (h, _), _ = lax.scan(body, (zeros, zeros), x)
        return self.out(h), state


def module(name: str, key):
    if name in ("mlp", "tiny_mlp"):
        return MLP((784, *S.MLP_HIDDEN, 10) if name == "mlp" else S.TINY_MLP, key)
    return {"cnn": CNN, "resnet": ResNet, "transformer": Transformer, "lstm": LSTMClassifier}[name](key)


def make(name: str, x, y, key) -> Run:
    if x.ndim == 4:                                  # images: channel-first for Equinox
        x = jnp.transpose(x, (0, 3, 1, 2))
    model, state = eqx.nn.make_with_state(module)(name, key)
    tx = S.optimizer()
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))

    # The batch comes first so that everything after it (model, state, optimizer state)
    # is donated and the batch is not.
    @eqx.filter_jit(donate="all-except-first")
    def train_step(batch, model, state, opt_state):
        x, y = batch

        def objective(model, state):
            batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            logits, state = batched(x, state)
            return loss_fn(logits, y), state

        (loss, state), grads = eqx.filter_value_and_grad(objective, has_aux=True)(model, state)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, opt_state, loss

    cell = [(model, state, opt_state)]

    def step():
        model, state, opt_state, loss = train_step((x, y), *cell[0])
        cell[0] = (model, state, opt_state)
        return loss

    run = Run("equinox", name, step, lambda: _Lowered(train_step.lower((x, y), *cell[0])),
              param_count(eqx.filter(model, eqx.is_inexact_array)), state=lambda: cell[0])
    run.aot = (_Traceable(train_step), lambda: ((x, y), *cell[0]))
    return run


class _Traceable:
    """``eqx.filter_jit``'s step with JAX's ``.trace``: Equinox's own split of the
    arguments into arrays and static parts (what its ``__call__`` and ``lower`` do first),
    then ``.trace`` of the ``jax.jit`` it wraps, so that the trace / lower / compile
    split of the first call counts Equinox's Python work as tracing."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def trace(self, *args):
        from equinox._jit import _preprocess  # Equinox's private API (equinox 0.13)

        w = self.wrapper
        info = (w._signature, w._dynamic_fun, w._static_fun, w.donate_first, w.donate_rest)
        donate, keep, static = _preprocess(info, args, {}, return_static=True)
        return w._cached.trace(donate, keep, static)


class _Lowered:
    """Equinox's ``Lowered``, with ``compile()`` giving JAX's ``Compiled``."""

    def __init__(self, lowered):
        self.lowered = lowered

    def compile(self):
        return self.lowered.compile().compiled

    def as_text(self):
        return self.lowered.as_text()
