"""A decoding step's attention: dot products against products and sums over the cache.

Two measurements, each variant compiled in this process and timed in interleaved rounds
(a random order per round), wall and process CPU time, medians and per-round ratios:

  step         ``dec.step`` of GPT-2 small (random weights, float32) at the given batch
               and cache lengths, its attention as ``ops.CachedAttention`` computes a
               step (products and sums) and as dot products (``_attend_many``, the
               prefill's form); the first step's logits compared.
  attention    the attention alone over 12 layers' caches (batch 8, 256 slots, 64
               features) for heads / key/value heads 12/12, 16/4 and 32/4: where the
               summed form stops paying (``MAX_GROUP_SUMMED``).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_decode_attention.py [--batch 8]
[--lengths 128,256] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import time

import jax
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ops.cached_attention import CachedAttention


def interleaved(fns: dict, rounds: int, calls: int) -> dict:
    """name -> (wall seconds per call, CPU seconds per call) of each round."""
    out: dict = {k: [] for k in fns}
    for _ in range(rounds):
        order = list(fns)
        random.shuffle(order)
        for k in order:
            t, c = time.perf_counter(), time.process_time()
            fns[k](calls)
            out[k].append(((time.perf_counter() - t) / calls, (time.process_time() - c) / calls))
    return out


def report(label: str, res: dict, base: str) -> None:
    for k, rows in res.items():
        wall, cpu = np.array(rows).T
        bw, bc = np.array(res[base]).T
        print(f"{label} {k:22s} wall {np.median(wall) * 1e3:8.2f} ms  cpu {np.median(cpu) * 1e3:8.2f} ms  "
              f"/ {base}: wall {np.median(wall / bw):.3f} cpu {np.median(cpu / bc):.3f}")


def steps(batch: int, length: int, rounds: int) -> None:
    model = mg.compile(mg.models.gpt2())
    params, state = model.init(jax.random.key(0))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 50257, (batch, 16)), jnp.int32)
    summed = CachedAttention._attend_one
    fns, first = {}, {}
    for name in ("dots", "products and sums"):
        CachedAttention._attend_one = summed if name != "dots" else (lambda self, *a: self._attend_many(*a))
        dec = mg.decoder(model, max_length=length)
        logits, cache = dec.prefill(params, state, ids)
        step = jax.jit(dec.step_fn(batch), donate_argnums=(2,))
        token = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
        logits, cache = step(params, state, dataclasses.replace(cache, filled=0), token)
        first[name] = np.asarray(logits)
        box = {"cache": cache}

        def run(calls, step=step, box=box, token=token):
            for _ in range(calls):
                out, box["cache"] = step(params, state, box["cache"], token)
            out.block_until_ready()
        fns[name] = run
    CachedAttention._attend_one = summed
    print(f"batch {batch}, {length} slots: first step's logits max |difference| "
          f"{float(np.abs(first['dots'] - first['products and sums']).max()):.1e}")
    report(f"step b{batch} L{length}", interleaved(fns, rounds, 10), "dots")


def attention(rounds: int) -> None:
    batch, length, head_dim = 8, 256, 64
    for heads, kv in ((12, 12), (16, 4), (32, 4)):
        op = ops.CachedAttention(heads, head_dim, heads * head_dim, max_length=length, batch=batch, num_kv_heads=kv)
        caches = [jax.random.normal(jax.random.key(i), (batch, length, kv, head_dim)) for i in range(24)]
        q = jax.random.normal(jax.random.key(99), (batch, 1, heads, head_dim))
        allowed = jnp.ones((batch, 1, length), bool)
        fns = {}
        for name, form in (("dots", op._attend_many), ("products and sums", op._attend_one)):
            f = jax.jit(lambda q, c, a, form=form: [form(q, c[2 * i], c[2 * i + 1], a, jnp.float32)
                                                    for i in range(12)])
            jax.block_until_ready(f(q, caches, allowed))

            def run(calls, f=f, q=q, caches=caches, allowed=allowed):
                for _ in range(calls):
                    r = f(q, caches, allowed)
                jax.block_until_ready(r)
            fns[name] = run
        report(f"attention {heads}/{kv} heads", interleaved(fns, rounds, 10), "dots")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", default="128,256")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"jax {jax.__version__}; load average {os.getloadavg()}")
    for length in map(int, args.lengths.split(",")):
        steps(args.batch, length, args.rounds)
    attention(args.rounds)
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
