"""The benchmark models written by hand in plain JAX: a params dict, a pure forward
function, and one ``jax.jit``-ed train step with optax's Adam (the baseline).

The params dicts use the same layout as mlaxgraph's (``params[layer][weight]``,
kernels ``(in, out)``, conv kernels OHWI), so the forward functions also run on the
params an mlaxgraph model makes; the computation is what a JAX programmer writes
directly: ``x @ W + b``, ``lax.conv_general_dilated``, batch statistics with
``jnp.mean``, ``lax.scan`` for the LSTM; max pooling over strided slices, as mlaxgraph
computes it (``lax.reduce_window``, the usual form, is the ``pool_reduce_window`` variant).

This module imports only JAX, optax and NumPy (``tests/test_hlo_parity.py`` uses it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import models_spec as S

_lecun = jax.nn.initializers.lecun_normal()


# --- init -------------------------------------------------------------------------------

class _Keys:
    """Hands out fresh keys, one per weight."""

    def __init__(self, key):
        self.key = key

    def __call__(self):
        self.key, sub = jax.random.split(self.key)
        return sub


def _dense(keys, n_in, n_out):
    return {"kernel": _lecun(keys(), (n_in, n_out), jnp.float32), "bias": jnp.zeros((n_out,))}


def _conv(keys, n_in, n_out, size, bias=True):
    # OHWI; fan in = size * size * n_in.
    w = jax.random.normal(keys(), (n_out, size, size, n_in)) / math.sqrt(size * size * n_in)
    return {"kernel": w, "bias": jnp.zeros((n_out,))} if bias else {"kernel": w}


def _norm(n):
    return {"scale": jnp.ones((n,)), "bias": jnp.zeros((n,))}


def _stats(n):
    return {"mean": jnp.zeros((n,)), "var": jnp.ones((n,))}


def init(name: str, key) -> tuple[dict, dict]:
    """``(params, state)`` of model ``name`` (state: BatchNorm statistics, else empty)."""
    keys = _Keys(key)
    if name in ("mlp", "tiny_mlp"):
        sizes = (784, *S.MLP_HIDDEN, 10) if name == "mlp" else S.TINY_MLP
        names = ["dense"] + [f"dense_{i}" for i in range(1, len(sizes) - 2)] + ["logits"]
        return {n: _dense(keys, a, b) for n, a, b in zip(names, sizes[:-1], sizes[1:])}, {}
    if name == "cnn":
        c = S.CNN_CHANNELS
        return {"conv": _conv(keys, 1, c, 3), "logits": _dense(keys, 4 * 4 * c, 10)}, {}
    if name == "resnet":
        params = {"stem": _conv(keys, 3, S.RESNET_STEM, 3, bias=False), "stem_bn": _norm(S.RESNET_STEM)}
        state = {"stem_bn": _stats(S.RESNET_STEM)}
        c_in = S.RESNET_STEM
        for i, (c, stride) in enumerate(S.RESNET_STAGES):
            p = {"conv_a": _conv(keys, c_in, c, 3, bias=False), "bn_a": _norm(c),
                 "conv_b": _conv(keys, c, c, 3, bias=False), "bn_b": _norm(c)}
            s = {"bn_a": _stats(c), "bn_b": _stats(c)}
            if stride != 1 or c_in != c:
                p["proj"], p["proj_bn"] = _conv(keys, c_in, c, 1, bias=False), _norm(c)
                s["proj_bn"] = _stats(c)
            params[f"block{i + 1}"], state[f"block{i + 1}"] = p, s
            c_in = c
        params["logits"] = _dense(keys, c_in, 10)
        return params, state
    if name == "transformer":
        t = S.TRANSFORMER
        d, h, m = t["width"], t["heads"], t["mlp"]
        k = d // h

        def proj():
            return {"kernel": _lecun(keys(), (d, h * k), jnp.float32).reshape(d, h, k),
                    "bias": jnp.zeros((h, k))}

        block = {"ln_attention": _norm(d),
                 "attention": {"query": proj(), "key": proj(), "value": proj(),
                               "out": {"kernel": _lecun(keys(), (h * k, d), jnp.float32).reshape(h, k, d),
                                       "bias": jnp.zeros((d,))}},
                 "ln_mlp": _norm(d), "mlp_in": _dense(keys, d, m), "mlp_out": _dense(keys, m, d)}
        return {"transformer_block": block, "logits": _dense(keys, d, 10)}, {}
    if name == "lstm":
        t = S.LSTM
        n, hid = t["width"], t["hidden"]
        bias = jnp.zeros((4 * hid,)).at[hid:2 * hid].set(1.0)  # forget gate opens
        return {"embed": {"embedding": jax.random.normal(keys(), (S.SPECS["lstm"].vocab, n))},
                "lstm": {"input_kernel": _lecun(keys(), (n, 4 * hid), jnp.float32),
                         "recurrent_kernel": jax.nn.initializers.orthogonal()(keys(), (hid, 4 * hid)),
                         "bias": bias},
                "logits": _dense(keys, hid, 5)}, {}
    raise KeyError(name)


# --- forward ----------------------------------------------------------------------------

def _linear(p, x):
    return x @ p["kernel"] + p["bias"]


def mlp_forward(params, x):
    names = list(params)
    names.sort(key=lambda n: (n == "logits", len(n), n))  # dense, dense_1, ..., logits
    for n in names[:-1]:
        x = jax.nn.relu(_linear(params[n], x))
    return _linear(params[names[-1]], x)


def _conv2d(x, kernel, stride=1, hwio=False):
    """``kernel`` OHWI (mlaxgraph's layout), or HWIO (``hwio``: Flax's, Haiku's and
    Keras's, which XLA's CPU convolutions take without a transpose); ``hwio="transposed"``:
    an OHWI kernel transposed to HWIO in the program, before an HWIO convolution."""
    if hwio == "transposed":
        kernel = jnp.transpose(kernel, (1, 2, 3, 0))
    return lax.conv_general_dilated(x, kernel, (stride, stride), "SAME",
                                    dimension_numbers=("NHWC", "HWIO" if hwio else "OHWI", "NHWC"))


def _max_pool_2x2(h, reduce_window=False):
    """2x2 max pooling, stride 2, of NHWC ``h``: as mlaxgraph's ``ops.MaxPool`` computes it,
    a select over the window's four strided slices keeping the first maximum (its
    gradient a select per slice), or (``reduce_window``) ``lax.reduce_window``, whose
    gradient is XLA's ``select_and_scatter`` (what Flax, Haiku, Equinox and Keras call)."""
    if reduce_window:
        return lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    best = h[:, 0::2, 0::2]
    for tap in (h[:, 0::2, 1::2], h[:, 1::2, 0::2], h[:, 1::2, 1::2]):
        best = jnp.where((tap > best) | (tap != tap), tap, best)
    return best


def cnn_forward(params, x, hwio=False, reduce_window=False):
    h = jax.nn.relu(_conv2d(x, params["conv"]["kernel"], hwio=hwio) + params["conv"]["bias"])
    h = _max_pool_2x2(h, reduce_window)
    return _linear(params["logits"], h.reshape(h.shape[0], -1))


#: BatchNorm formulations (``_batch_norm``'s ``how``): the variance's and the normalization's.
#:   shifted:   k = the batch's first value of each channel (x[0, 0, 0]: a slice),
#:              mean = k + mean(x - k), var = mean((x - k)^2) - mean(x - k)^2: one pass,
#:              float32's cancellation depends on |k - mean| / std, not on the mean
#:              (mlaxgraph's ``ops.BatchNorm``, and the hand-written model)
#:   shifted_mean: the same, k = the mean of the first example's values of each channel
#:              (what mlaxgraph computed before: a reduction more per BatchNorm)
#:   two_pass:  var = mean((x - mean)^2)                          (a second pass over x)
#:   one_pass:  var = max(mean(x^2) - mean^2, 0)                  (Flax linen's default, Haiku)
#:   affine:    y = x * m + (bias - mean * m), m = rsqrt(var + eps) * scale  (mlaxgraph's,
#:              Keras's; the backward pass needs x, not x - mean)
#:   centered:  y = (x - mean) * m + bias                         (Flax's, Haiku's)
AS_MLAXGRAPH = ("shifted", "affine")
BN_FORMS = {"bn_two_pass": ("two_pass", "affine"), "bn_centered": ("shifted", "centered"),
            "bn_two_pass_centered": ("two_pass", "centered"),
            "bn_one_pass": ("one_pass", "affine"),
            "bn_shift_mean": ("shifted_mean", "affine"),
            "bn_shift_running": ("shifted_running", "affine")}


def _batch_norm(p, s, x, how=AS_MLAXGRAPH):
    """Training mode: batch statistics (biased variance); running averages updated.
    ``how``: the formulation (``BN_FORMS``); by default mlaxgraph's."""
    variance, form = how
    axes = (0, 1, 2)
    if variance.startswith("shifted"):
        k = lax.stop_gradient(x[0, 0, 0] if variance == "shifted"  # the first value
                              else s["mean"] if variance == "shifted_running"  # running mean
                              else jnp.mean(x[0], axis=(0, 1)))  # the first example's mean
        d = jnp.mean(x - k, axis=axes)
        mean = k + d
        var = jnp.maximum(jnp.mean(jnp.square(x - k), axis=axes) - jnp.square(d), 0.0)
    else:
        mean = jnp.mean(x, axis=axes)
        if variance == "two_pass":
            var = jnp.mean(jnp.square(x - mean), axis=axes)
        else:
            var = jnp.maximum(jnp.mean(jnp.square(x), axis=axes) - jnp.square(mean), 0.0)
    m = lax.rsqrt(var + S.BN_EPSILON) * p["scale"]
    y = x * m + (p["bias"] - mean * m) if form == "affine" else (x - mean) * m + p["bias"]
    mom = S.BN_MOMENTUM
    return y, {"mean": mom * s["mean"] + (1 - mom) * mean, "var": mom * s["var"] + (1 - mom) * var}


def _basic_block(p, s, x, stride, how, hwio=False):
    new = {}
    h = _conv2d(x, p["conv_a"]["kernel"], stride, hwio)
    h, new["bn_a"] = _batch_norm(p["bn_a"], s["bn_a"], h, how)
    h = _conv2d(jax.nn.relu(h), p["conv_b"]["kernel"], hwio=hwio)
    h, new["bn_b"] = _batch_norm(p["bn_b"], s["bn_b"], h, how)
    if "proj" in p:
        x = _conv2d(x, p["proj"]["kernel"], stride, hwio)
        x, new["proj_bn"] = _batch_norm(p["proj_bn"], s["proj_bn"], x, how)
    return jax.nn.relu(h + x), new


def resnet_forward(params, state, x, how=AS_MLAXGRAPH, hwio=False):
    new = {}
    h = _conv2d(x, params["stem"]["kernel"], hwio=hwio)
    h, new["stem_bn"] = _batch_norm(params["stem_bn"], state["stem_bn"], h, how)
    h = jax.nn.relu(h)
    for i, (_, stride) in enumerate(S.RESNET_STAGES):
        name = f"block{i + 1}"
        h, new[name] = _basic_block(params[name], state[name], h, stride, how, hwio)
    return _linear(params["logits"], jnp.mean(h, axis=(1, 2))), new


def _layer_norm(p, x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + S.LN_EPSILON) * p["scale"] + p["bias"]


def _heads(x, p):
    """``x @ W + b`` over the heads' columns, then split into heads, heads first:
    ``(batch, heads, length, head_dim)`` (as mlaxgraph's MultiHeadAttention)."""
    d, h, k = p["kernel"].shape
    y = x @ p["kernel"].reshape(d, h * k) + p["bias"].reshape(h * k)
    return jnp.swapaxes(y.reshape(y.shape[:-1] + (h, k)), 1, 2)


def _attention(p, x, scale_scores=False):
    """``scale_scores``: the scores scaled by ``1/sqrt(head_dim)`` after the dot, instead
    of q before it (mlaxgraph's)."""
    q, k, v = _heads(x, p["query"]), _heads(x, p["key"]), _heads(x, p["value"])
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.einsum("bhqk,bhsk->bhqs", q if scale_scores else q * scale, k)
    weights = jax.nn.softmax(scores * scale if scale_scores else scores, axis=-1)
    out = jnp.swapaxes(jnp.einsum("bhqs,bhsk->bhqk", weights, v), 1, 2)
    h, k_, o = p["out"]["kernel"].shape
    return out.reshape(out.shape[:2] + (h * k_,)) @ p["out"]["kernel"].reshape(h * k_, o) + p["out"]["bias"]


def transformer_forward(params, x, scale_scores=False):
    p = params["transformer_block"]
    h = x + _attention(p["attention"], _layer_norm(p["ln_attention"], x), scale_scores)
    m = jax.nn.gelu(_linear(p["mlp_in"], _layer_norm(p["ln_mlp"], h)), approximate=False)
    h = h + _linear(p["mlp_out"], m)
    return _linear(params["logits"], jnp.mean(h, axis=1))


def lstm_forward(params, tokens, in_loop=True):
    """As mlaxgraph's LSTM: each step projects its own input inside the scan;
    ``in_loop=False``: the input projection of all time steps in one matmul before the
    scan instead."""
    p = params["lstm"]
    x = params["embed"]["embedding"][tokens]                       # (batch, time, width)
    if in_loop:
        xw = jnp.swapaxes(x, 0, 1)
    else:
        xw = jnp.einsum("bti,ig->tbg", x, p["input_kernel"]) + p["bias"]  # all steps at once

    def cell(carry, xw_t):
        h, c = carry
        if in_loop:
            xw_t = xw_t @ p["input_kernel"] + p["bias"]
        i, f, g, o = jnp.split(xw_t + h @ p["recurrent_kernel"], 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), None

    zeros = jnp.zeros((tokens.shape[0], p["recurrent_kernel"].shape[0]), x.dtype)
    (h, _), _ = lax.scan(cell, (zeros, zeros), xw)
    return _linear(params["logits"], h)


_STATELESS = {"mlp": mlp_forward, "tiny_mlp": mlp_forward, "cnn": cnn_forward,
              "transformer": transformer_forward, "lstm": lstm_forward}


#: Alternative formulations, to measure what a design choice of mlaxgraph's ops costs
#: (variant -> model).
VARIANTS = {**{v: "resnet" for v in BN_FORMS}, "conv_hwio": "cnn", "conv_transposed": "cnn",
            "pool_reduce_window": "cnn", "lstm_projected_before": "lstm",
            "attention_scores_scaled": "transformer"}

#: "Best by hand": per model, the fastest formulation known (measured; RESULTS.md section
#: 1), whatever its numerics: for the ResNet Flax linen's one-pass variance (unshifted) with
#: the affine normalization and HWIO kernels; for the digits CNN HWIO kernels; the other
#: models' hand-written step is already the fastest known.
BEST = {"resnet": "bn_one_pass+conv_hwio", "cnn": "conv_hwio"}


def _hwio(params):
    """Conv kernels (the 4-d arrays) from OHWI to HWIO."""
    return jax.tree.map(lambda a: jnp.transpose(a, (1, 2, 3, 0)) if a.ndim == 4 else a, params)


def forward(name: str, variant: str | None = None):
    """``f(params, state, x) -> (logits, new_state)`` for model ``name``; ``variant``:
    one of ``VARIANTS`` or ``"best"`` (``BEST``), or several joined by ``+``."""
    parts = set((BEST.get(name, "") if variant == "best" else variant or "").split("+")) - {""}
    hwio = "transposed" if "conv_transposed" in parts else "conv_hwio" in parts
    if name == "resnet":
        how = next((BN_FORMS[v] for v in parts if v in BN_FORMS), AS_MLAXGRAPH)
        return lambda params, state, x: resnet_forward(params, state, x, how, hwio)
    if name == "cnn":
        reduce_window = "pool_reduce_window" in parts
        return lambda params, state, x: (cnn_forward(params, x, hwio, reduce_window), state)
    fwd = _STATELESS[name]
    if name == "transformer" and "attention_scores_scaled" in parts:
        return lambda params, state, x: (transformer_forward(params, x, scale_scores=True), state)
    if name == "lstm" and "lstm_projected_before" in parts:
        return lambda params, state, x: (lstm_forward(params, x, in_loop=False), state)
    return lambda params, state, x: (fwd(params, x), state)


# --- training ---------------------------------------------------------------------------

def loss_fn(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_step_fn(name: str, tx, count_steps: bool = False, accuracy: bool = False,
                 variant: str | None = None):
    """The pure train step ``step((params, state, opt_state), x, y) -> (new, loss)``.

    ``count_steps`` adds an int32 step counter in front of the train state (as
    ``mg.train.TrainState.step``); ``accuracy`` returns ``{"loss", "accuracy"}``
    instead of the loss (as ``mg.train.Trainer(..., metrics=("accuracy",))``). The benchmark uses
    the bare step; the HLO parity test uses the options to compare like with like.
    ``variant``: see ``VARIANTS``.
    """
    fwd = forward(name, variant)

    def step(train_state, x, y):
        if count_steps:
            count, params, state, opt_state = train_state
        else:
            params, state, opt_state = train_state

        def objective(p):
            logits, new_state = fwd(p, state, x)
            return loss_fn(logits, y), (logits, new_state)

        (loss, (logits, new_state)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        new = (optax.apply_updates(params, updates), new_state, opt_state)
        if count_steps:
            new = (count + 1,) + new
        if accuracy:
            hits = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
            return new, {"loss": loss, "accuracy": jnp.mean(hits)}
        return new, loss

    return step


def make_steps_fn(step):
    """``k`` steps on ``lax.scan`` over stacked batches ``xs (k, batch, ...)``."""

    def steps(train_state, xs, ys):
        def body(ts, xy):
            return step(ts, *xy)

        return lax.scan(body, train_state, (xs, ys))

    return steps


def param_count(params) -> int:
    return int(sum(np.prod(np.shape(v)) for v in jax.tree.leaves(params)))


def make(name: str, x, y, key, xs=None, ys=None, count_steps: bool = False,
         accuracy: bool = False, carry_key: bool = False, variant: str | None = None):
    """A ``Run`` of the hand-written train step: ``jax.jit(step, donate_argnums=0)``
    over ``(params, state, opt_state)``; a fresh jitted function every call.

    The options build what ``mg.train.Trainer`` carries besides, one at a time, to
    attribute its cost: a step counter, the accuracy metric, and a PRNG key's raw
    ``uint32`` data passed through the jitted step (``carry_key``, as
    ``TrainState.rng``; the step does not use it).
    """
    from _common import Run

    tx = S.optimizer()
    params, state = init(name, key)
    if "conv_hwio" in (BEST.get(name, "") if variant == "best" else variant or ""):
        params = _hwio(params)
    ts = (params, state, tx.init(params))
    if count_steps:
        ts = (jnp.zeros((), jnp.int32),) + ts
    step_fn = make_step_fn(name, tx, count_steps, accuracy, variant)
    if carry_key:
        inner = step_fn

        def step_fn(train_state, x, y):
            new, out = inner(train_state[:-1], x, y)
            return new + (train_state[-1],), out

        ts = ts + (jax.random.key_data(jax.random.key(1)),)
    jstep = jax.jit(step_fn, donate_argnums=0)
    cell = [ts]

    def step():
        cell[0], out = jstep(cell[0], x, y)
        return out["loss"] if accuracy else out

    system = "hand" + "".join(f"+{o}" for o, on in (("count", count_steps), ("accuracy", accuracy),
                                                     ("key", carry_key)) if on)
    if variant:
        system += f":{variant}"
    run = Run(system, name, step, lambda: jstep.lower(cell[0], x, y), param_count(params),
              state=lambda: cell[0])
    run.aot = (jstep, lambda: (cell[0], x, y))
    if xs is not None:
        jsteps = jax.jit(make_steps_fn(step_fn), donate_argnums=0)

        def steps():
            cell[0], losses = jsteps(cell[0], xs, ys)
            return losses

        run.steps = steps
    return run
