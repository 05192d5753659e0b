"""Quantized inference per call: mlaxgraph's ``int8`` against a hand-written int8 JAX
version of the same arithmetic and Keras 3's ``model.quantize("int8")``, in the same
interleaved rounds.

Models (inference, float32 inputs, random weights):

  mlp     the benchmark MLP 784-256-256-10 (ReLU), batch 128
  cnn     the digits CNN 8x8x1 (conv 3x3 32, ReLU, max pool, linear 10), batch 128
  gpt2    GPT-2 small (``mg.models.gpt2()``), batch 1 x 32 tokens, the logits

Systems:

  mlaxgraph f32    ``mg.compile(g).apply`` of the float model (jitted by apply)
  mlaxgraph int8   ``mg.quantize(g, "int8")`` and ``mg.quantize_weights``: per-call
                   per-token scales (per example for the conv)
  hand int8        written below in plain JAX, reading the same int8 weights and
                   computing as mlaxgraph's int8 does (symmetric int8 per token, or
                   with a zero point after a ReLU / GELU; s8 x s8 -> s32
                   ``dot_general``, the convolution as one such dot over its
                   patches; scaled back), one ``jax.jit``; its outputs are checked
                   against mlaxgraph's
  hand int8,       (cnn) the same with the s8 convolution ``conv_general_dilated``
    s8 convolution   instead of the dot over patches (same sums)
  hand int8,       the same with every input quantized symmetric (no zero point
    symmetric      after the ReLU / GELU), the cost of the zero points' correction
                   (not mlaxgraph's arithmetic: its outputs differ)
  keras int8       the same architecture in Keras 3 (``benchmarks/models_keras.py``,
                   JAX backend) after ``model.quantize("int8")``, called as its
                   ``predict_step`` does: ``jax.jit`` of ``model.stateless_call``.
                   Keras 3.15 quantizes ``Dense`` (and ``EinsumDense``, ``Embedding``)
                   but not ``Conv2D``: its CNN keeps a float convolution. GPT-2 has no
                   Keras row: keras_hub (its GPT-2) is not installed, and a GPT-2
                   rebuilt here from Keras layers would not be Keras's model.

Each round runs ``CALLS`` calls of every system in a random order (wall time and
process CPU time per call); the tables give the median per call, the median of the
per-round ratios to ``hand int8`` with a bootstrap 95% CI, and the CPU-time ratio.

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/bench_quantize_peers.py [--rounds N]
[MODEL ...]``.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import time

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import models_hand  # noqa: E402
import models_mg  # noqa: E402
import models_spec as S  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import mlaxgraph as mg  # noqa: E402

CALLS = {"mlp": 20, "cnn": 20, "gpt2": 3}


# --- the hand-written int8 arithmetic ----------------------------------------------------


def _symmetric(x, axes=(-1,)):
    """int8 values and the float scale of ``x``, absmax over ``axes``."""
    amax = jnp.max(jnp.abs(x), axis=axes, keepdims=True)
    scale = jnp.where(amax > 0, amax * jnp.float32(1 / 127), jnp.float32(1))
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8), scale


def _asymmetric(x):
    """int8 values, scale and zero point of ``x`` per token, its range [min, max]."""
    low = jnp.minimum(jnp.min(x, -1, keepdims=True), 0)
    high = jnp.maximum(jnp.max(x, -1, keepdims=True), 0)
    span = high - low
    scale = jnp.where(span > 0, span * jnp.float32(1 / 255), jnp.float32(1))
    zero = jnp.clip(jnp.round(-low / scale).astype(jnp.int32) - 128, -128, 127)
    q = jnp.clip(jnp.round(x / scale) + zero.astype(jnp.float32), -128, 127).astype(jnp.int8)
    return q, scale, zero


def _dot(q, w):
    return lax.dot_general(q, w, (((q.ndim - 1,), (0,)), ((), ())),
                           preferred_element_type=jnp.int32)


def linear(x, p, zero_point=False):
    """An int8 Linear: ``x`` quantized per token, s8 x s8 -> s32, scaled, the bias."""
    if zero_point:
        q, s, z = _asymmetric(x)
        acc = _dot(q, p["kernel"]) - z * p["kernel_sum"]  # the column sums, stored
    else:
        q, s = _symmetric(x)
        acc = _dot(q, p["kernel"])
    y = acc.astype(jnp.float32) * s * p["kernel_scale"]
    return y + p["bias"].reshape(-1) if "bias" in p else y


def hand_mlp(p, x, zero_point=True):
    h = jax.nn.relu(linear(x, p["dense"]))
    h = jax.nn.relu(linear(h, p["dense_1"], zero_point=zero_point))
    return linear(h, p["logits"], zero_point=zero_point)


def _patches_conv(q, kernel):
    """A 3x3 SAME convolution, stride 1, as one s8 x s8 -> s32 dot: the nine shifted
    slices of the padded input side by side, against the kernel's taps and channels."""
    h, w = q.shape[1:3]
    padded = jnp.pad(q, ((0, 0), (1, 1), (1, 1), (0, 0)))
    taps = [padded[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)]
    patches = jnp.concatenate(taps, axis=-1)  # (N, H, W, 9 * C), tap-major
    return _dot(patches, kernel.reshape(kernel.shape[0], -1).T)


def hand_cnn(p, x, convolution=False):
    """``convolution``: the s8 convolution ``lax.conv_general_dilated`` instead of the
    dot over patches (same sums)."""
    q, s = _symmetric(x, (1, 2, 3))
    c = p["conv"]
    if convolution:
        acc = lax.conv_general_dilated(q, c["kernel"], (1, 1), "SAME",
                                       dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                       preferred_element_type=jnp.int32)
    else:
        acc = _patches_conv(q, c["kernel"])
    h = jax.nn.relu(acc.astype(jnp.float32) * s * c["kernel_scale"] + c["bias"])
    h = models_hand._max_pool_2x2(h)  # as ops.MaxPool: a select over the strided slices
    return linear(h.reshape(h.shape[0], -1), p["logits"])


def _layer_norm(x, p, eps=1e-5):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _rows(table, ids):
    return table["embedding"][ids].astype(jnp.float32) * table["embedding_scale"][ids][..., None]


def hand_gpt2(p, ids, zero_point=True, n_layer=12, n_head=12):
    """GPT-2's forward over a whole prompt with mlaxgraph's int8 weights."""
    n = ids.shape[1]
    x = _rows(p["wte"], ids) + _rows(p["wpe"], jnp.arange(n))[None]
    causal = jnp.tril(jnp.ones((n, n), bool))
    for i in range(n_layer):
        b = p[f"h.{i}"]
        a = b["attn"]
        h = _layer_norm(x, b["ln_1"])
        q, k, v = (linear(h, a[name]).reshape(h.shape[:2] + (n_head, -1))
                   for name in ("query", "key", "value"))
        scores = jnp.einsum("bqhk,bshk->bhqs", q * (1 / math.sqrt(q.shape[-1])), k)
        w = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(jnp.float32).min), -1)
        att = jnp.einsum("bhqs,bshk->bqhk", w, v).reshape(h.shape)
        x = x + linear(att, a["out"])
        h = _layer_norm(x, b["ln_2"])
        m = jax.nn.gelu(linear(h, b["mlp.c_fc"]), approximate=True)
        x = x + linear(m, b["mlp.c_proj"], zero_point=zero_point)
    q, s = _symmetric(_layer_norm(x, p["ln_f"]))
    acc = jnp.einsum("bld,vd->blv", q, p["wte"]["embedding"], preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * s * p["wte"]["embedding_scale"]


# --- the systems ----------------------------------------------------------------------------


def systems(name: str) -> dict:
    """name -> a function running one call and waiting for it."""
    if name == "gpt2":
        g = mg.models.gpt2()
        x = np.asarray(jax.random.randint(jax.random.key(1), (1, 32), 0, 50257))
        hand = hand_gpt2
    else:
        g = getattr(models_mg, name)()
        x, _ = S.batch(S.SPECS[name])
        hand = {"mlp": hand_mlp, "cnn": hand_cnn}[name]
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    qg = mg.quantize(g, "int8")
    qmodel = mg.compile(qg)
    qp, qs = mg.quantize_weights(qg, params, state)
    hand_fn = jax.jit(hand)
    want = qmodel.apply(qp, qs, x, inference_mode=True)[0]
    got = hand_fn(qp, x)
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert err < 1e-4, f"{name}: the hand-written int8 model differs from mlaxgraph's ({err})"
    out = {
        "mlaxgraph f32": lambda: model.apply(params, state, x, inference_mode=True)[0],
        "mlaxgraph int8": lambda: qmodel.apply(qp, qs, x, inference_mode=True)[0],
        "hand int8": lambda: hand_fn(qp, x),
    }
    if name != "cnn":  # without the zero points: every input symmetric (as Keras's)
        symmetric = jax.jit(lambda p, v: hand(p, v, zero_point=False))
        out["hand int8, symmetric"] = lambda: symmetric(qp, x)
    if name == "cnn":  # the s8 convolution (what XLA CPU runs on s32 operands)
        s8_conv = jax.jit(lambda p, v: hand_cnn(p, v, convolution=True))
        out["hand int8, s8 convolution"] = lambda: s8_conv(qp, x)
    if name != "gpt2":
        import models_keras

        km = models_keras.build(name)
        km.quantize("int8")
        trainable = [v.value for v in km.trainable_variables]
        frozen = [v.value for v in km.non_trainable_variables]
        call = jax.jit(lambda t, f, v: km.stateless_call(t, f, v, training=False)[0])
        out["keras int8"] = lambda: call(trainable, frozen, x)
    return {k: (lambda fn=fn: jax.block_until_ready(fn())) for k, fn in out.items()}


def interleaved(variants: dict, rounds: int, calls: int, seed: int = 0) -> tuple[dict, dict]:
    """Per-call wall and CPU seconds of each variant per round, random order, GC off."""
    wall: dict = {k: [] for k in variants}
    cpu: dict = {k: [] for k in variants}
    order = list(variants)
    rng = random.Random(seed)
    for fn in variants.values():  # compile
        fn()
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    variants[name]()
                wall[name].append((time.perf_counter() - w0) / calls)
                cpu[name].append((time.process_time() - c0) / calls)
    finally:
        gc.enable()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=["mlp", "cnn", "gpt2"])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    for name in args.models:
        variants = systems(name)
        wall, cpu = interleaved(variants, args.rounds, CALLS[name])
        rows = []
        for system in variants:
            ratios = [a / b for a, b in zip(wall[system], wall["hand int8"])]
            lo, hi = bootstrap_median_ci(ratios)
            cpu_ratio = median(cpu[system]) / median(cpu["hand int8"])
            rows.append([system, fmt_time(median(wall[system])),
                         f"{median(ratios):.2f} ({lo:.2f} – {hi:.2f})", f"{cpu_ratio:.2f}"])
        print(f"\n{name}: {args.rounds} rounds of {CALLS[name]} calls, load average "
              f"{os.getloadavg()[0]:.1f}")
        print(md_table(["system", "per call (median)", "wall / hand int8 (95% CI)",
                        "CPU time / hand int8"], rows))


if __name__ == "__main__":
    main()
