"""A product that contracts a vocabulary-sized dim: ``g @ table`` with ``g`` of
``(chunk, V)`` and ``table`` of ``(V, d)``, the input's gradient of a tied output head
(GPT-2: V = 50,257, d = 768), in a ``lax.scan`` over chunks as the chunked loss runs it.

XLA GPU's Triton GEMM with split-K pads the contracted dim to a multiple of its tiles,
and the padded operand is a copy (a 155 MB ``pad`` of GPT-2's table). The forms:

  plain      ``g @ table``
  highest    the same with ``precision=HIGHEST``
  split      the contraction in two: the first ``V - V % 1024`` rows, then the rest
  batched    ``V`` as ``(a, b)`` with ``a * b == V`` (GPT-2: 29 x 1,733), a batched
             product then a sum over ``a``

For each: XLA's ``memory_analysis`` temporaries, the largest instruction outputs of the
optimized HLO's entry and loop bodies, the result against ``plain``'s (max relative
difference), and the time per call (median of ``--rounds`` interleaved calls).

Run: ``JAX_PLATFORMS=cuda python3 benchmarks/vocab_contraction.py [--vocab 50257]
[--chunks 4] [--chunk 16] [--rounds 30]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

_SHAPE = re.compile(r"= (\w+)\[([\d,]*)\]")


def _largest(hlo: str, top: int = 3) -> list[str]:
    found = []
    for line in hlo.splitlines():
        m = _SHAPE.search(line)
        if m and m.group(2) and "parameter(" not in line:
            size = int(np.prod([int(d) for d in m.group(2).split(",")]))
            found.append((size, line.strip()[:150]))
    return [line for _, line in sorted(found, reverse=True)[:top]]


def _factor(v: int) -> tuple[int, int]:
    a = next((a for a in range(2, int(v ** 0.5) + 1) if v % a == 0), 1)
    return a, v // a


def forms(vocab: int):
    cut = vocab - vocab % 1024

    def plain(g, t):
        return g @ t

    def highest(g, t):
        return jnp.matmul(g, t, precision=lax.Precision.HIGHEST)

    def split(g, t):
        return g[:, :cut] @ t[:cut] + g[:, cut:] @ t[cut:]

    a, b = _factor(vocab)

    def batched(g, t):
        gb = g.reshape(g.shape[0], a, b)
        tb = t.reshape(a, b, t.shape[-1])
        return lax.dot_general(gb, tb, (((2,), (1,)), ((1,), (0,)))).sum(axis=0)

    return {"plain": plain, "highest": highest, "split": split, "batched": batched}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()}")
    table = jax.random.normal(jax.random.key(0), (args.vocab, args.dim), jnp.float32) * 0.02
    gs = jax.random.normal(jax.random.key(1), (args.chunks, args.chunk, args.vocab), jnp.float32)
    compiled, results = {}, {}
    for name, form in forms(args.vocab).items():
        def step(table, gs, form=form):
            return lax.scan(lambda carry, g: (carry, form(g, table)), None, gs)[1]
        c = jax.jit(step).lower(table, gs).compile()
        compiled[name] = c
        results[name] = np.asarray(c(table, gs))
        m = c.memory_analysis()
        print(f"\n{name}: temporaries {m.temp_size_in_bytes / 1e6:.2f} MB")
        for line in _largest(c.as_text()):
            print("   ", line)
    times: dict[str, list[float]] = {name: [] for name in compiled}
    for _ in range(args.rounds):
        for name, c in compiled.items():
            start = time.perf_counter()
            c(table, gs).block_until_ready()
            times[name].append(time.perf_counter() - start)
    ref = results["plain"]
    print(f"\nper call, median of {args.rounds} interleaved rounds; max |x - plain| / max |plain|:")
    for name in compiled:
        diff = float(np.max(np.abs(results[name] - ref)) / np.max(np.abs(ref)))
        ratio = statistics.median(b / a for a, b in zip(times["plain"], times[name]))
        print(f"  {name:<8} {statistics.median(times[name]) * 1e6:9.1f} us  ({ratio:.3f} of "
              f"plain)  diff {diff:.2e}")


if __name__ == "__main__":
    main()
