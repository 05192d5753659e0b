"""Decoding GPT-2 small quantized: the time per token of the cached step, each scheme
against float32 in the same rounds, and the greedy tokens' agreement with float32's.

``mg.models.gpt2()`` with random weights (``init(jax.random.key(0))``), quantized by
``mg.quantize`` and ``mg.quantize_weights`` (absmax); ``mg.decoder(model,
max_length=128)``; a prompt of 16 random tokens (batch 1 or 8), prefilled, then steps
of one token. Per round and scheme: a new prefill (not timed), then ``steps`` steps, each followed by
``block_until_ready``; schemes interleaved, in a rotating order. Reported: the median
per-token step time, its per-round ratio to float32's (median, bootstrap 95% CI), and
the fraction of the 32 greedy tokens (``mg.generate``) equal to float32's.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_decode_quantized.py [--batch 1]
[--rounds 7] [--steps 32]``.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median

import jax
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg

SCHEMES = ("float32", "int8", "int8_weight_only", "int4_weight_only")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args(argv)
    g = mg.models.gpt2()
    params, state = mg.compile(g).init(jax.random.key(0))
    prompt = np.asarray(jax.random.randint(jax.random.key(1), (args.batch, 16), 0, 50257))
    runs = {}
    for scheme in SCHEMES:
        qg = g if scheme == "float32" else mg.quantize(g, scheme)
        qp, qs = (params, state) if scheme == "float32" else mg.quantize_weights(qg, params, state)
        dec = mg.decoder(qg, max_length=128)
        logits, cache = dec.prefill(qp, qs, prompt)
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        jax.block_until_ready(dec.step(qp, qs, cache, token))  # compiled before timing
        ids = mg.generate(mg.compile(qg), qp, qs, prompt, max_new_tokens=32)
        runs[scheme] = (dec, qp, qs, cache, token, np.asarray(ids)[:, 16:])
        print(scheme, "ready", flush=True)
    times: dict[str, list[float]] = {s: [] for s in SCHEMES}
    for r in range(args.rounds):
        for scheme in SCHEMES[r % len(SCHEMES):] + SCHEMES[:r % len(SCHEMES)]:
            dec, qp, qs, _, token, _ = runs[scheme]
            _, cache = dec.prefill(qp, qs, prompt)  # a fresh cache each round, not timed
            jax.block_until_ready(cache)
            start = time.perf_counter()
            for _ in range(args.steps):
                logits, cache = dec.step(qp, qs, cache, token)
                jax.block_until_ready(logits)
            times[scheme].append((time.perf_counter() - start) / args.steps)
    rows = []
    reference = runs["float32"][-1]
    for scheme in SCHEMES:
        ratios = [a / b for a, b in zip(times[scheme], times["float32"])]
        low, high = bootstrap_median_ci(ratios)
        agree = float(np.mean(runs[scheme][-1] == reference))
        rows.append([f"`{scheme}`", fmt_time(median(times[scheme])),
                     f"{median(ratios):.3f} ({low:.3f} – {high:.3f})", f"{agree:.3f}"])
    print(md_table([f"scheme (batch {args.batch})", "per token (step)", "/ float32 (95% CI)",
                    "greedy tokens equal to float32's"], rows))


if __name__ == "__main__":
    main()
