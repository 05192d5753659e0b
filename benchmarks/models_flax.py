"""The benchmark models in Flax: linen (``nn.Module`` with ``@nn.compact``, trained
through ``flax.training.train_state.TrainState``) and NNX (``nnx.Module`` objects,
``nnx.Optimizer`` and ``nnx.jit``), each the way that library's documentation trains a
model. The architectures follow ``models_spec``; the built-in layers are used
(``Dense``/``Linear``, ``Conv``, ``BatchNorm``, ``LayerNorm``,
``MultiHeadDotProductAttention``/``MultiHeadAttention``, ``Embed``,
``OptimizedLSTMCell`` under ``RNN``).

Differences from the hand-written models, all inherent to the libraries: conv kernels
are HWIO; the LSTM cell keeps its input projection inside the scan (one fused matmul
of input and hidden state per step) instead of projecting all steps at once.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx
from flax.training import train_state

import models_spec as S
from _common import Run
from models_hand import loss_fn, param_count

# --- linen ------------------------------------------------------------------------------


class LinenMLP(nn.Module):
    sizes: tuple[int, ...]

    @nn.compact
    def __call__(self, x, train: bool = True):
        for width in self.sizes[1:-1]:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.sizes[-1])(x)


class LinenCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.relu(nn.Conv(S.CNN_CHANNELS, (3, 3), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


def _linen_bn(train):
    return nn.BatchNorm(use_running_average=not train, momentum=S.BN_MOMENTUM,
                        epsilon=S.BN_EPSILON)


class LinenBlock(nn.Module):
    channels: int
    stride: int

    @nn.compact
    def __call__(self, x, train: bool):
        s = (self.stride, self.stride)
        h = nn.Conv(self.channels, (3, 3), strides=s, padding="SAME", use_bias=False)(x)
        h = nn.relu(_linen_bn(train)(h))
        h = nn.Conv(self.channels, (3, 3), padding="SAME", use_bias=False)(h)
        h = _linen_bn(train)(h)
        if self.stride != 1 or x.shape[-1] != self.channels:
            x = nn.Conv(self.channels, (1, 1), strides=s, padding="SAME", use_bias=False)(x)
            x = _linen_bn(train)(x)
        return nn.relu(h + x)


class LinenResNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Conv(S.RESNET_STEM, (3, 3), padding="SAME", use_bias=False)(x)
        x = nn.relu(_linen_bn(train)(x))
        for channels, stride in S.RESNET_STAGES:
            x = LinenBlock(channels, stride)(x, train)
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


class LinenTransformer(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        t = S.TRANSFORMER
        h = nn.LayerNorm(epsilon=S.LN_EPSILON)(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=t["heads"], qkv_features=t["width"],
                                                out_features=t["width"])(h)
        h = nn.LayerNorm(epsilon=S.LN_EPSILON)(x)
        h = nn.Dense(t["width"])(nn.gelu(nn.Dense(t["mlp"])(h), approximate=False))
        return nn.Dense(10)(jnp.mean(x + h, axis=1))


class LinenLSTM(nn.Module):
    @nn.compact
    def __call__(self, tokens, train: bool = True):
        t = S.LSTM
        x = nn.Embed(S.SPECS["lstm"].vocab, t["width"])(tokens)
        (_, h), _ = nn.RNN(nn.OptimizedLSTMCell(t["hidden"]), return_carry=True)(x)
        return nn.Dense(5)(h)


def linen_module(name: str) -> nn.Module:
    if name in ("mlp", "tiny_mlp"):
        return LinenMLP((784, *S.MLP_HIDDEN, 10) if name == "mlp" else S.TINY_MLP)
    return {"cnn": LinenCNN, "resnet": LinenResNet, "transformer": LinenTransformer,
            "lstm": LinenLSTM}[name]()


class BNTrainState(train_state.TrainState):
    """``TrainState`` plus BatchNorm statistics (as in Flax's ImageNet example)."""

    batch_stats: Any = None


def make_linen(name: str, x, y, key) -> Run:
    module = linen_module(name)
    variables = module.init(key, x[:1], train=False)
    has_bn = "batch_stats" in variables
    ts = BNTrainState.create(apply_fn=module.apply, params=variables["params"],
                             tx=S.optimizer(), batch_stats=variables.get("batch_stats"))

    def step_fn(ts, x, y):
        def objective(params):
            if has_bn:
                logits, updates = ts.apply_fn({"params": params, "batch_stats": ts.batch_stats},
                                              x, train=True, mutable=["batch_stats"])
                return loss_fn(logits, y), updates["batch_stats"]
            return loss_fn(ts.apply_fn({"params": params}, x), y), None

        (loss, stats), grads = jax.value_and_grad(objective, has_aux=True)(ts.params)
        ts = ts.apply_gradients(grads=grads)
        if has_bn:
            ts = ts.replace(batch_stats=stats)
        return ts, loss

    jstep = jax.jit(step_fn, donate_argnums=0)
    cell = [ts]

    def step():
        cell[0], loss = jstep(cell[0], x, y)
        return loss

    run = Run("linen", name, step, lambda: jstep.lower(cell[0], x, y),
              param_count(variables["params"]), state=lambda: cell[0])
    run.aot = (jstep, lambda: (cell[0], x, y))
    return run


# --- NNX --------------------------------------------------------------------------------


class NnxMLP(nnx.Module):
    def __init__(self, sizes, rngs: nnx.Rngs):
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-2], sizes[1:-1])])
        self.out = nnx.Linear(sizes[-2], sizes[-1], rngs=rngs)

    def __call__(self, x):
        for layer in self.hidden:
            x = nnx.relu(layer(x))
        return self.out(x)


class NnxCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, S.CNN_CHANNELS, (3, 3), padding="SAME", rngs=rngs)
        self.out = nnx.Linear(4 * 4 * S.CNN_CHANNELS, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(nnx.relu(self.conv(x)), (2, 2), strides=(2, 2))
        return self.out(x.reshape(x.shape[0], -1))


def _nnx_bn(c, rngs):
    return nnx.BatchNorm(c, momentum=S.BN_MOMENTUM, epsilon=S.BN_EPSILON, rngs=rngs)


class NnxBlock(nnx.Module):
    def __init__(self, c_in, c, stride, rngs: nnx.Rngs):
        s = (stride, stride)
        self.conv_a = nnx.Conv(c_in, c, (3, 3), strides=s, padding="SAME", use_bias=False, rngs=rngs)
        self.bn_a = _nnx_bn(c, rngs)
        self.conv_b = nnx.Conv(c, c, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.bn_b = _nnx_bn(c, rngs)
        # nnx.data: the attribute holds a submodule or None (the shortcut is optional).
        self.proj = self.proj_bn = nnx.data(None)
        if stride != 1 or c_in != c:
            self.proj = nnx.data(nnx.Conv(c_in, c, (1, 1), strides=s, padding="SAME", use_bias=False,
                                          rngs=rngs))
            self.proj_bn = nnx.data(_nnx_bn(c, rngs))

    def __call__(self, x):
        h = nnx.relu(self.bn_a(self.conv_a(x)))
        h = self.bn_b(self.conv_b(h))
        if self.proj is not None:
            x = self.proj_bn(self.proj(x))
        return nnx.relu(h + x)


class NnxResNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, S.RESNET_STEM, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.stem_bn = _nnx_bn(S.RESNET_STEM, rngs)
        blocks, c_in = [], S.RESNET_STEM
        for c, stride in S.RESNET_STAGES:
            blocks.append(NnxBlock(c_in, c, stride, rngs))
            c_in = c
        self.blocks = nnx.List(blocks)
        self.out = nnx.Linear(c_in, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.out(jnp.mean(x, axis=(1, 2)))


class NnxTransformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        t = S.TRANSFORMER
        d = t["width"]
        self.ln_attention = nnx.LayerNorm(d, epsilon=S.LN_EPSILON, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(t["heads"], d, d, d, decode=False, rngs=rngs)
        self.ln_mlp = nnx.LayerNorm(d, epsilon=S.LN_EPSILON, rngs=rngs)
        self.mlp_in = nnx.Linear(d, t["mlp"], rngs=rngs)
        self.mlp_out = nnx.Linear(t["mlp"], d, rngs=rngs)
        self.out = nnx.Linear(d, 10, rngs=rngs)

    def __call__(self, x):
        x = x + self.attention(self.ln_attention(x))
        h = self.mlp_out(nnx.gelu(self.mlp_in(self.ln_mlp(x)), approximate=False))
        return self.out(jnp.mean(x + h, axis=1))


class NnxLSTM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        t = S.LSTM
        self.embed = nnx.Embed(S.SPECS["lstm"].vocab, t["width"], rngs=rngs)
        self.rnn = nnx.RNN(nnx.OptimizedLSTMCell(t["width"], t["hidden"], rngs=rngs),
                           return_carry=True)
        self.out = nnx.Linear(t["hidden"], 5, rngs=rngs)

    def __call__(self, tokens):
        (_, h), _ = self.rnn(self.embed(tokens))
        return self.out(h)


def nnx_module(name: str, rngs: nnx.Rngs) -> nnx.Module:
    if name in ("mlp", "tiny_mlp"):
        return NnxMLP((784, *S.MLP_HIDDEN, 10) if name == "mlp" else S.TINY_MLP, rngs)
    return {"cnn": NnxCNN, "resnet": NnxResNet, "transformer": NnxTransformer,
            "lstm": NnxLSTM}[name](rngs)


def make_nnx(name: str, x, y, key) -> Run:
    model = nnx_module(name, nnx.Rngs(params=key))
    model.train()
    optimizer = nnx.Optimizer(model, S.optimizer(), wrt=nnx.Param)

    @nnx.jit(donate_argnums=(0, 1))
    def train_step(model, optimizer, x, y):
        def objective(model):
            return loss_fn(model(x), y)

        loss, grads = nnx.value_and_grad(objective)(model)
        optimizer.update(model, grads)
        return loss

    def step():
        return train_step(model, optimizer, x, y)

    return Run("nnx", name, step, lambda: train_step.lower(model, optimizer, x, y),
               param_count(nnx.state(model, nnx.Param)), state=lambda: model)
