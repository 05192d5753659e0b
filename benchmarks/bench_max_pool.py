"""Pooling's two formulations, side by side: ``ops.MaxPool`` as it computes (a select
over the window's strided slices) and as it computed before (``lax.reduce_window``,
whose gradient is XLA's ``select_and_scatter``; every peer's form), by setting
``mlaxgraph.ops.pooling.MAX_SLICED_TAPS`` to 0 for the second; and ``ops.AvgPool``'s
window sums the same two ways (a sum of slices, or ``reduce_window`` with ``add``; the
counts without ``count_include_pad`` are a constant in both).

1. The gradient of one pooling layer, jitted, for the windows the models use (median
   per call, interleaved).
2. ResNet-50's train step (``mg.models.resnet50()``, batch 8 at 64 x 64, AdamW): step
   time per interleaved round (ratio and 95% CI), XLA's compile CPU time, temporaries,
   and the loss after the same steps.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_max_pool.py [--rounds 8]
[--no-resnet50]``. The digits CNN's train step against the peers is ``bench_train.py``
(the ``pool_reduce_window`` variant of the hand-written model).
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import optax
from _common import bootstrap_median_ci, median

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ops import pooling

LAYERS = {
    "2x2, 128 x 8 x 8 x 32 (digits CNN)": ((128, 8, 8, 32), ops.MaxPool((2, 2))),
    "2x2, 32 x 28 x 28 x 16": ((32, 28, 28, 16), ops.MaxPool((2, 2))),
    "3x3 stride 2 pad 1, 8 x 32 x 32 x 64 (ResNet stem)":
        ((8, 32, 32, 64), ops.MaxPool((3, 3), strides=2, padding=((1, 1), (1, 1)))),
    "3x3 stride 1 SAME, 32 x 28 x 28 x 16": ((32, 28, 28, 16), ops.MaxPool((3, 3), strides=1,
                                                                          padding="SAME")),
    # AvgPool's window sums (window_sum): the same switch, MAX_SLICED_TAPS
    "AvgPool 2x2, 32 x 28 x 28 x 16": ((32, 28, 28, 16), ops.AvgPool((2, 2))),
    "AvgPool 3x3 stride 2 SAME, 8 x 32 x 32 x 64":
        ((8, 32, 32, 64), ops.AvgPool((3, 3), strides=2, padding="SAME")),
    "AvgPool 3x3 stride 1 SAME, 32 x 28 x 28 x 16":
        ((32, 28, 28, 16), ops.AvgPool((3, 3), strides=1, padding="SAME")),
    "AvgPool 3x3 stride 1 SAME, pads not counted, 32 x 28 x 28 x 16":
        ((32, 28, 28, 16), ops.AvgPool((3, 3), strides=1, padding="SAME", count_include_pad=False)),
}


def _compiled(taps: int, fn, *args):
    pooling.MAX_SLICED_TAPS = taps
    try:  # a new function each time: jax reuses a function's trace
        return jax.jit(lambda *a: fn(*a)).lower(*args).compile()
    finally:
        pooling.MAX_SLICED_TAPS = SLICED


SLICED = pooling.MAX_SLICED_TAPS


def layers(rounds: int) -> None:
    print("| layer | gradient, reduce_window | gradient, slices | slices / reduce_window (95% CI) | equal to the bit |")
    print("|---|---|---|---|---|")
    for name, (shape, layer) in LAYERS.items():
        x = jnp.maximum(jax.random.normal(jax.random.key(0), shape), 0)  # ReLU's ties

        def grad(v, layer=layer):
            return jax.grad(lambda v: jnp.sum(layer.apply({}, {}, (v,), rng=None,
                                                          inference_mode=False)[0][0] ** 3))(v)
        runs = {"reduce_window": _compiled(0, grad, x), "slices": _compiled(SLICED, grad, x)}
        same = bool(jnp.array_equal(runs["reduce_window"](x), runs["slices"](x)))
        times = {k: [] for k in runs}
        ratios = []
        for r in range(rounds * 5):
            got = {}
            for k in (runs if r % 2 == 0 else list(runs)[::-1]):
                start = time.perf_counter()
                for _ in range(10):
                    out = runs[k](x)
                jax.block_until_ready(out)
                got[k] = (time.perf_counter() - start) / 10
                times[k].append(got[k])
            ratios.append(got["slices"] / got["reduce_window"])
        lo, hi = bootstrap_median_ci(ratios)
        print(f"| {name} | {median(times['reduce_window']) * 1e6:.1f} µs | "
              f"{median(times['slices']) * 1e6:.1f} µs | {median(ratios):.3f} ({lo:.3f} – {hi:.3f}) | "
              f"{'yes' if same else 'no'} |", flush=True)


def resnet50(rounds: int) -> None:
    x = jax.random.normal(jax.random.key(1), (8, 64, 64, 3))
    y = jnp.zeros((8,), jnp.int32)
    runs = {}
    for label, taps in (("reduce_window", 0), ("slices", SLICED)):
        pooling.MAX_SLICED_TAPS = taps
        try:
            trainer = mg.Trainer(mg.compile(mg.models.resnet50()), optax.adamw(1e-4),
                                 loss="softmax_cross_entropy")
            ts = trainer.init(jax.random.key(0))
            start = time.process_time()
            compiled = trainer.train_step.lower(ts, x, y).compile()
            seconds = time.process_time() - start
        finally:
            pooling.MAX_SLICED_TAPS = SLICED
        ts, metrics = compiled(ts, x, y)
        jax.block_until_ready(metrics)
        runs[label] = {"step": compiled, "ts": ts, "times": [], "compile": seconds,
                       "temp": compiled.memory_analysis().temp_size_in_bytes}
    ratios = []
    for r in range(rounds):
        got = {}
        for label in (runs if r % 2 == 0 else list(runs)[::-1]):
            run = runs[label]
            start = time.perf_counter()
            run["ts"], metrics = run["step"](run["ts"], x, y)
            run["loss"] = float(jax.block_until_ready(metrics["loss"]))
            got[label] = time.perf_counter() - start
            run["times"].append(got[label])
        ratios.append(got["slices"] / got["reduce_window"])
    lo, hi = bootstrap_median_ci(ratios)
    print("\n| ResNet-50 train step | step | compile (CPU) | temporaries | loss after the steps |")
    print("|---|---|---|---|---|")
    for label, run in runs.items():
        print(f"| {label} | {median(run['times']) * 1e3:.1f} ms | {run['compile']:.2f} s | "
              f"{run['temp'] / 2 ** 20:.1f} MiB | {run['loss']:.6f} |")
    print(f"\nslices / reduce_window, step: {median(ratios):.3f} (95% CI {lo:.3f} – {hi:.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--no-resnet50", action="store_true")
    args = p.parse_args()
    layers(args.rounds)
    if not args.no_resnet50:
        resnet50(args.rounds)


if __name__ == "__main__":
    main()
