"""The MLP's train step (784-256-256-10, batch 128, Adam, the state donated) with the
Dense written in two ways over the same ``(in, out)`` kernels: ``x @ W`` (mlaxgraph's
``ops.Linear``, and the hand-written, Flax, Haiku and Keras models) and
``dot_general(W, x).T`` (the product computed as ``(out, batch)`` and transposed, what
Equinox's ``vmap`` of ``W @ v`` over ``(out, in)`` kernels lowers to). Prints XLA's temp
bytes of each compiled step (``memory_analysis``), the largest difference of the
parameters after one step from the same start, and the step time in interleaved rounds
(median per-round ratio, 95% CI of the median).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_dense_form.py [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import optax
from _common import bootstrap_median_ci, median
from jax import lax

SIZES = ((784, 256), (256, 256), (256, 10))
BATCH = 128
FORMS = {
    "x @ W": lambda h, k: lax.dot_general(h, k, (((h.ndim - 1,), (0,)), ((), ()))),
    "dot_general(W, x).T": lambda h, k: jnp.moveaxis(
        lax.dot_general(k, h, (((0,), (h.ndim - 1,)), ((), ()))), 0, -1),
}


def init(key):
    keys = jax.random.split(key, len(SIZES))
    return {f"l{i}": {"k": jax.random.normal(k, s) * 0.05, "b": jnp.zeros(s[1])}
            for i, (k, s) in enumerate(zip(keys, SIZES))}


def make_step(dense, tx):
    def forward(p, h):
        for i in range(len(SIZES)):
            h = dense(h, p[f"l{i}"]["k"]) + p[f"l{i}"]["b"]
            if i < len(SIZES) - 1:
                h = jax.nn.relu(h)
        return h

    def step(ts, x, y):
        p, o = ts
        loss, g = jax.value_and_grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y).mean())(p)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    return jax.jit(step, donate_argnums=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    tx = optax.adam(1e-3)
    x = jax.random.normal(jax.random.key(2), (BATCH, SIZES[0][0]))
    y = jax.random.randint(jax.random.key(3), (BATCH,), 0, SIZES[-1][1])
    steps, after = {}, {}
    for name, dense in FORMS.items():
        jstep = make_step(dense, tx)
        params = init(jax.random.key(0))
        temp = jstep.lower((params, tx.init(params)), x, y).compile().memory_analysis().temp_size_in_bytes
        print(f"{name}: temp {temp:,} bytes")
        (after[name], _), _ = jstep((params, tx.init(params)), x, y)
        fresh = init(jax.random.key(0))
        steps[name] = [jstep, (fresh, tx.init(fresh))]
    a, b = (jax.tree.leaves(after[n]) for n in FORMS)
    print(f"parameters after one step, largest difference: "
          f"{max(float(jnp.abs(u - v).max()) for u, v in zip(a, b)):.1e}")
    times = {n: [] for n in steps}
    for _ in range(args.rounds):
        order = list(steps)
        random.shuffle(order)
        for n in order:
            jstep, ts = steps[n]
            ts, loss = jstep(ts, x, y)
            loss.block_until_ready()
            t = time.perf_counter()
            for _ in range(args.steps):
                ts, loss = jstep(ts, x, y)
            loss.block_until_ready()
            times[n].append((time.perf_counter() - t) / args.steps)
            steps[n][1] = ts
    base, other = FORMS
    ratio = [u / v for u, v in zip(times[other], times[base])]
    lo, hi = bootstrap_median_ci(ratio)
    print(", ".join(f"{n}: {median(t) * 1e3:.2f} ms a step" for n, t in times.items())
          + f"; {other} / {base}: {median(ratio):.3f} (95% CI {lo:.3f} – {hi:.3f}); "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
