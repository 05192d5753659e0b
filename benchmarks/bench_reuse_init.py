"""``init(key, reuse=...)`` adding LoRA adapters to GPT-2 medium: its wall and CPU
seconds (first call, compile included: what a user waits for) for two checkouts of
mlaxgraph, in interleaved rounds, each call in a fresh process.

GPT-2 medium (``mg.models.gpt2({"n_layer": 24, "n_embd": 1024, "n_head": 16})``,
355M weights); ``mg.lora(g, "h.*/attn/qkv", rank=8)`` adds 48 weights (0.4M values).
Each process initializes the base model, then times the adapted model's
``init(key, reuse=(params, state))`` until its arrays are ready.

Run: ``.venv/bin/python benchmarks/bench_reuse_init.py --before /path/to/old/checkout
[--rounds 3]`` (``--after`` defaults to this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(root: str) -> None:
    sys.path.insert(0, root)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import time

    import jax

    import mlaxgraph as mg

    assert mg.__file__.startswith(root), mg.__file__
    g = mg.models.gpt2({"n_layer": 24, "n_embd": 1024, "n_head": 16})
    params, state = mg.compile(g).init(jax.random.key(0))
    jax.block_until_ready(params)
    adapted = mg.compile(mg.lora(g, "h.*/attn/qkv", rank=8))
    wall, cpu = time.perf_counter(), time.process_time()
    p2, _ = adapted.init(jax.random.key(1), reuse=(params, state))
    jax.block_until_ready(p2)
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=os.path.dirname(HERE))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    sys.path.insert(0, HERE)
    from _common import bootstrap_median_ci, median

    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for label in order:
            root = getattr(args, label)
            out = subprocess.run([sys.executable, __file__, "--before", "-", "--child", root],
                                 capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": root})
            runs[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(label, runs[label][-1], flush=True)
    for what in ("wall", "cpu"):
        ratios = [a[what] / b[what] for a, b in zip(runs["after"], runs["before"])]
        low, high = bootstrap_median_ci(ratios)
        print(f"{what}: before {median([r[what] for r in runs['before']]):.2f} s, after "
              f"{median([r[what] for r in runs['after']]):.2f} s, after/before "
              f"{median(ratios):.3f} (95% CI {low:.3f} - {high:.3f})")
    print("load average:", os.getloadavg())


if __name__ == "__main__":
    main()
