"""A Llama written by ``graph.to_onnx`` in its two attention forms, run by onnxruntime:
opset 21 (rotary embeddings, grouped key/value heads and the causal mask decomposed
into primitive operators) against opset 23 (ONNX's Attention and RotaryEmbedding
operators), with mlaxgraph's own ``apply`` of the same graph beside them.

The model: ``mg.models.llama`` with hidden size 512, 4 layers, 8 query heads and 2
key/value heads, intermediate size 1376, vocabulary 8000, random weights; input batch 1
x 256 tokens. Interleaved rounds (each round calls each runtime ``calls`` times, in a
random order); per call the wall time and the process CPU time; the ratios opset 23 /
opset 21 are taken per round, with the median's 95% bootstrap interval.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_onnx_attention.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import numpy as np
from _common import bootstrap_median_ci, fmt_time, md_table, median

import mlaxgraph as mg

CONFIG = {"vocab_size": 8000, "hidden_size": 512, "intermediate_size": 1376,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2}


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(quick: bool = False) -> str:
    import onnxruntime as ort

    rounds, calls = (3, 2) if quick else (9, 5)
    graph = mg.models.llama(CONFIG)
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], size=(1, 256)).astype(np.int32)
    want, _ = model.apply(params, state, ids, inference_mode=True)
    want = np.asarray(want)
    runners, notes = {}, {}
    for opset in (21, 23):
        proto = graph.to_onnx(None, params, state, opset=opset)
        session = ort.InferenceSession(proto.SerializeToString())
        got = session.run(None, {"input_ids": ids})[0]
        notes[opset] = (len(proto.graph.node), float(np.max(np.abs(got - want))))
        runners[f"onnxruntime, opset {opset}"] = (lambda s=session: s.run(None, {"input_ids": ids}))
    runners["mlaxgraph apply"] = lambda: jax.block_until_ready(
        model.apply(params, state, ids, inference_mode=True)[0])
    for fn in runners.values():
        fn()  # warm
    wall: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    ratio_wall, ratio_cpu = [], []
    for _ in range(rounds):
        order = list(runners)
        random.shuffle(order)
        per: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
        for key in order:
            for _ in range(calls):
                per[key].append(_timed(runners[key]))
        for key in runners:
            wall[key] += [w for w, _ in per[key]]
            cpu[key] += [c for _, c in per[key]]
        a, b = per["onnxruntime, opset 23"], per["onnxruntime, opset 21"]
        ratio_wall.append(median([w for w, _ in a]) / median([w for w, _ in b]))
        ratio_cpu.append(median([c for _, c in a]) / median([c for _, c in b]))
    rows = []
    for key in runners:
        opset = int(key[-2:]) if "opset" in key else None
        nodes, error = notes[opset] if opset else ("", 0.0)
        rows.append([key, str(nodes), fmt_time(median(wall[key])), fmt_time(median(cpu[key])),
                     f"{error:.1e}" if opset else "(reference)"])
    lo, hi = bootstrap_median_ci(ratio_wall)
    clo, chi = bootstrap_median_ci(ratio_cpu)
    table = md_table(["runtime", "nodes", "per call (wall)", "per call (CPU)", "max abs diff"], rows)
    return (f"{table}\n\nopset 23 / opset 21 per call: wall {median(ratio_wall):.2f} "
            f"(95% CI {lo:.2f} - {hi:.2f}), CPU {median(ratio_cpu):.2f} (95% CI {clo:.2f} - {chi:.2f}); "
            f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))
