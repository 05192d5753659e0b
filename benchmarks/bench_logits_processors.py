"""What Hugging Face's logits processors cost in ``mg.generate``: GPT-2 small
(``mg.models.gpt2()``, random weights, float32), a 16-token prompt, 64 new tokens,
greedy, against the same generate without them, in the same rounds.

Each round runs every variant once, in a random order (each compiled by a first call
before timing); the time per new token is the call's wall time over 64; the ratio per
round to plain greedy, its median and a bootstrap 95% CI.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_logits_processors.py [--rounds N]
[--batch B]``.
"""

from __future__ import annotations

import argparse
import random
import time

import _common  # noqa: F401  (sys.path)
import jax
import numpy as np
from _common import bootstrap_median_ci, fmt_time, median

import mlaxgraph as mg

NEW = 64
VARIANTS = {
    "greedy": "greedy",
    "RepetitionPenalty(1.2)": mg.sampling.RepetitionPenalty(1.2),
    "NoRepeatNGram(3)": mg.sampling.NoRepeatNGram(3),
    "RepetitionPenalty(1.2) + NoRepeatNGram(3) + BadWords(4 sequences) + MinNewTokens(8)":
        (mg.sampling.RepetitionPenalty(1.2) + mg.sampling.NoRepeatNGram(3)
         + mg.sampling.BadWords([[50256], [11], [13, 198], [262, 318, 257]])
         + mg.sampling.MinNewTokens(8)),
}


def run(rounds: int = 9, batch: int = 1) -> str:
    """The table (Markdown) of one run."""
    model = mg.compile(mg.models.gpt2())
    params, state = model.init(jax.random.key(0))
    prompt = np.asarray(jax.random.randint(jax.random.key(1), (batch, 16), 0, 50257))

    def generate(sampler):
        out = mg.generate(model, params, state, prompt, max_new_tokens=NEW, sampler=sampler,
                          eos_token_id=50256)
        return out.block_until_ready()

    for sampler in VARIANTS.values():
        generate(sampler)  # compile
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            generate(VARIANTS[name])
            times[name].append((time.perf_counter() - start) / NEW)
    lines = [f"GPT-2 small, batch {batch}, 16-token prompt, {NEW} new tokens, {rounds} rounds "
             f"(greedy: the most likely token left)", "",
             "| sampler | per new token (median) | / plain greedy, per round | 95% CI |",
             "|---|---|---|---|"]
    for name in VARIANTS:
        ratios = [t / g for t, g in zip(times[name], times["greedy"])]
        low, high = bootstrap_median_ci(ratios)
        lines.append(f"| `{name}` | {fmt_time(median(times[name]))} | {median(ratios):.3f} | "
                     f"{low:.3f} – {high:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    print(run(args.rounds, args.batch))


if __name__ == "__main__":
    main()
