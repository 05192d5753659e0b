"""One int8 convolution on XLA's CPU backend: ``lax.conv_general_dilated`` with ``s8``
operands and an ``s32`` result, against the same sums as one ``s8 x s8 -> s32``
``dot_general`` over the input's patches (``mlaxgraph.ops.patches.patch_conv``, what
``QuantizedConv`` runs for ``"int8"``) and a float32 convolution of the same shapes,
in interleaved rounds.

Shapes (NHWC input, OHWI kernel 3x3, stride 1, SAME): the digits CNN's convolution
(128 x 8 x 8 x 1, 32 filters) and three ResNet-like ones. Each round times ``--calls``
calls of each variant in a random order; the table gives the medians per call, the
median of the per-round ratios to float32 with a bootstrap 95% CI, and the ratio of
median CPU times. The dot's result is checked equal to the convolution's.

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/bench_int8_conv.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
import jax
import jax.numpy as jnp
from _common import bootstrap_median_ci, fmt_time, md_table, median
from jax import lax

from mlaxgraph.ops.patches import patch_conv

SHAPES = [(128, 8, 1, 32), (32, 16, 32, 64), (8, 32, 64, 64), (16, 16, 128, 128)]
DIMS = ("NHWC", "OHWI", "NHWC")


def variants(batch: int, size: int, channels: int, features: int) -> dict:
    key = jax.random.key(0)
    xf = jax.random.normal(key, (batch, size, size, channels))
    wf = jax.random.normal(jax.random.key(1), (features, 3, 3, channels))
    xq = jax.random.randint(key, xf.shape, -127, 128, dtype=jnp.int8)
    wq = jax.random.randint(jax.random.key(1), wf.shape, -127, 128, dtype=jnp.int8)
    f32 = jax.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                        dimension_numbers=DIMS))
    s8 = jax.jit(lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=DIMS, preferred_element_type=jnp.int32))
    dot = jax.jit(lambda x, w: patch_conv(x, w, strides=(1, 1), padding="SAME",
                                          dilation=(1, 1), groups=1, channels_last=True,
                                          preferred_element_type=jnp.int32))
    assert bool((s8(xq, wq) == dot(xq, wq)).all()), "the dot over patches differs"
    return {"float32 convolution": lambda: f32(xf, wf).block_until_ready(),
            "s8 convolution": lambda: s8(xq, wq).block_until_ready(),
            "s8 dot over patches": lambda: dot(xq, wq).block_until_ready()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    rows = []
    for shape in SHAPES:
        fns = variants(*shape)
        for fn in fns.values():
            fn()
        wall: dict = {k: [] for k in fns}
        cpu: dict = {k: [] for k in fns}
        rng = random.Random(0)
        for _ in range(args.rounds):
            order = list(fns)
            rng.shuffle(order)
            for name in order:
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.calls):
                    fns[name]()
                wall[name].append((time.perf_counter() - w0) / args.calls)
                cpu[name].append((time.process_time() - c0) / args.calls)
        ref = "float32 convolution"
        for name in fns:
            ratios = [a / b for a, b in zip(wall[name], wall[ref])]
            lo, hi = bootstrap_median_ci(ratios)
            rows.append([f"{shape[0]}x{shape[1]}x{shape[1]}x{shape[2]} -> {shape[3]}", name,
                         fmt_time(median(wall[name])), f"{median(ratios):.2f} ({lo:.2f} – {hi:.2f})",
                         f"{median(cpu[name]) / median(cpu[ref]):.2f}"])
    print(f"\n{args.rounds} rounds of {args.calls} calls, load average {os.getloadavg()[0]:.1f}")
    print(md_table(["input -> filters", "variant", "per call (median)", "wall / float32 (95% CI)",
                    "CPU time / float32"], rows))


if __name__ == "__main__":
    main()
