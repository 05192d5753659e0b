"""Decoding GPT-2 small with LoRA adapters unmerged against the same adapters merged:
the time per token of the cached step, in the same rounds.

``mg.models.gpt2()`` with random weights; ``mg.lora(g, ["h.*/attn/qkv", "h.*/attn/out",
"h.*/mlp.c_fc"], rank=8)`` with random ``B`` (PEFT's GPT-2 targets and an MLP's);
``mg.merge_lora`` folds the same adapters into the weights. ``mg.decoder(...,
max_length=128)``, a prompt of 16 random tokens (batch 1 or 8) prefilled, then
``steps`` steps of one token, each followed by ``block_until_ready``. Reported: the
median per-token step time of each and the per-round ratio unmerged / merged (median,
bootstrap 95% CI), and whether the 32 greedy tokens (``mg.generate``) agree.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_decode_lora.py [--batch 1]
[--rounds 7] [--steps 32]``.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import numpy as np
from _common import bootstrap_median_ci, fmt_time, median

import mlaxgraph as mg

TARGETS = ["h.*/attn/qkv", "h.*/attn/out", "h.*/mlp.c_fc"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args(argv)
    g = mg.models.gpt2()
    params, state = mg.compile(g).init(jax.random.key(0))
    adapted = mg.lora(g, TARGETS, rank=8, alpha=16)
    aparams, _ = mg.compile(adapted).init(jax.random.key(1), reuse=(params, state))
    keys = iter(jax.random.split(jax.random.key(2), 256))
    aparams = jax.tree_util.tree_map_with_path(
        lambda path, w: jax.random.normal(next(keys), w.shape, w.dtype) * 0.02
        if "lora_B" in jax.tree_util.keystr(path) else w, aparams)
    merged, mparams = mg.merge_lora(adapted, aparams)
    prompt = np.asarray(jax.random.randint(jax.random.key(3), (args.batch, 16), 0, 50257))
    runs = {}
    for label, graph, weights in (("merged", merged, mparams), ("unmerged", adapted, aparams)):
        dec = mg.decoder(graph, max_length=128)
        logits, cache = dec.prefill(weights, state, prompt)
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        jax.block_until_ready(dec.step(weights, state, cache, token))  # compiled before timing
        ids = np.asarray(mg.generate(mg.compile(graph), weights, state, prompt, max_new_tokens=32))
        runs[label] = (dec, weights, token, ids)
    times: dict[str, list[float]] = {label: [] for label in runs}
    ratios = []
    for r in range(args.rounds):
        got = {}
        for label in (("merged", "unmerged") if r % 2 == 0 else ("unmerged", "merged")):
            dec, weights, token, _ = runs[label]
            _, cache = dec.prefill(weights, state, prompt)  # a fresh cache, not timed
            jax.block_until_ready(cache)
            start = time.perf_counter()
            for _ in range(args.steps):
                logits, cache = dec.step(weights, state, cache, token)
                jax.block_until_ready(logits)
            got[label] = (time.perf_counter() - start) / args.steps
            times[label].append(got[label])
        ratios.append(got["unmerged"] / got["merged"])
    low, high = bootstrap_median_ci(ratios)
    agree = float(np.mean(runs["merged"][3] == runs["unmerged"][3]))
    print(f"batch {args.batch}: merged {fmt_time(median(times['merged']))}, unmerged "
          f"{fmt_time(median(times['unmerged']))} per token; unmerged / merged "
          f"{median(ratios):.3f} (95% CI {low:.3f} – {high:.3f}); greedy tokens agreeing {agree:.3f}")


if __name__ == "__main__":
    main()
