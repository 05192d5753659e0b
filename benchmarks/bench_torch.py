"""Import, compile and per-call time of PyTorch models through mg.from_torch, against
torch eager on the same CPU (needs the torch-test extra, .venv-torch):

    nice .venv-torch/bin/python benchmarks/bench_torch.py [--repeats 20]

ResNet-50 (torchvision, random weights, eval, 1 x 3 x 224 x 224) and GPT-2 small
(transformers' GPT2LMHeadModel from GPT2Config(), random weights, eval, 1 x 128 ids).
Import: ``mg.from_torch(module, args)`` (torch.export included); compile: the first
``apply`` (tracing and XLA compilation); per call: the median of ``--repeats`` calls
after it, mlaxgraph's and torch eager's (``torch.no_grad``) alternated in one loop, so
both see the same load; the ratio is mlaxgraph's median over torch's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mlaxgraph as mg  # noqa: E402


def models():
    import torchvision
    import transformers

    torch.manual_seed(0)
    yield "ResNet-50", torchvision.models.resnet50().eval(), torch.randn(1, 3, 224, 224)
    config = transformers.GPT2Config(use_cache=False)
    yield "GPT-2 small", transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 50257, (1, 128))


def run(name, module, x, repeats, scan_blocks=False):
    start = time.perf_counter()
    graph, params, state = mg.from_torch(module, (x,))
    imported = time.perf_counter() - start
    model = mg.compile(graph, scan_blocks=scan_blocks)
    if scan_blocks:
        params, state = model.stack_weights(params, state)
    xj = jnp.asarray(x.numpy().astype(np.int32) if x.dtype == torch.int64 else x.numpy())
    start = time.perf_counter()
    jax.block_until_ready(model.apply(params, state, xj, inference_mode=True))
    compiled = time.perf_counter() - start
    ours, theirs = [], []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(model.apply(params, state, xj, inference_mode=True))
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            module(x)
            theirs.append(time.perf_counter() - start)
    a, b = statistics.median(ours), statistics.median(theirs)
    label = name + (" (scan_blocks=True)" if scan_blocks else "")
    print(f"| {label} | {imported:.1f} | {compiled:.1f} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f} |",
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, jax {jax.__version__}, {os.cpu_count()} CPUs")
    print("| model | import s | compile s | mlaxgraph per call ms (median) | torch eager ms (median) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, module, x in models():
        run(name, module, x, args.repeats)
        if name.startswith("GPT-2"):
            run(name, module, x, args.repeats, scan_blocks=True)


if __name__ == "__main__":
    main()
