"""BatchNorm folded into the convolutions at inference (``mg.fold_batch_norm``), and
conv + bias + activation in one layer or two (RESULTS.md section 15).

1. ``mg.models.resnet50()`` (1000 classes, ``--size`` x ``--size`` images, NHWC) and the
   benchmarks' ResNet-style CNN (``models_mg.resnet``, its batch of 32), ``apply`` with
   ``inference_mode=True`` per call, folded against unfolded, in interleaved rounds
   (each round times ``--calls`` calls of every variant, in a random order). The
   BatchNorms' statistics are drawn at random first (a fold of init's zeros and ones
   would be a no-op in numbers, not in time). Per variant: median wall and CPU time
   per call; folded / unfolded: the median of the per-round ratios with a bootstrap 95%
   CI, wall and CPU; the optimized HLO's counts (``hlo_stats.summary``); the largest
   difference of the logits; the time of the fold itself and of each first call.
2. ``ops.Conv(..., activation="relu")`` against ``ops.relu(ops.Conv(...)(x))`` and
   ``ops.Linear(..., activation="gelu")`` against ``ops.gelu(ops.Linear(...)(x))``:
   whether XLA's optimized HLO of the two is the same module (metadata and instruction
   names aside), the entry's fusions, and the per-call times as above.

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/bench_fold.py [--rounds N] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import numpy as np
from _common import bootstrap_median_ci, fmt_time, md_table, median
from hlo_stats import summary

import mlaxgraph as mg
import models_mg
from mlaxgraph import ops


def randomized(model, seed: int = 0):
    """``init``'s weights with the BatchNorms' scale, bias and statistics drawn at random."""
    params, state = model.init(jax.random.key(seed))
    rng = np.random.default_rng(seed)

    def draw(path, w):
        name = jax.tree_util.keystr(path)
        if name.endswith(("['scale']", "['var']")):
            return jnp.asarray(rng.uniform(0.5, 1.5, w.shape), w.dtype)
        if name.endswith(("['mean']", "['bias']")):
            return jnp.asarray(rng.normal(0.0, 0.1, w.shape), w.dtype)
        return w

    return (jax.tree_util.tree_map_with_path(draw, params),
            jax.tree_util.tree_map_with_path(draw, state))


def timed(fns: dict, rounds: int, calls: dict) -> tuple[dict, dict]:
    """Per-call wall and CPU times of each ``fns[name]()`` (waiting for its result), one
    entry per round; each round runs every variant ``calls[name]`` times, in random order."""
    wall: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls[name]):
                fns[name]()
            wall[name].append((time.perf_counter() - w0) / calls[name])
            cpu[name].append((time.process_time() - c0) / calls[name])
    return wall, cpu


def ratio(a: list, b: list) -> str:
    r = [x / y for x, y in zip(a, b)]
    lo, hi = bootstrap_median_ci(r)
    return f"{median(r):.3f} ({lo:.3f} – {hi:.3f})"


def hlo_counts(text: str) -> str:
    s = summary(text)
    return f"{s['fusion']} / {s['convolution']} / {s['instructions']}"


# --- 1. the fold ------------------------------------------------------------------------


def fold_case(label: str, graph: mg.Graph, batches: dict[int, int], shape: tuple, rounds: int):
    """Rows for the per-call table and the HLO table of ``graph``, folded and not."""
    model = mg.compile(graph)
    params, state = randomized(model)
    started = time.perf_counter()
    folded, fparams, fstate = mg.fold_batch_norm(graph, params, state)
    fold_time = time.perf_counter() - started
    fmodel = mg.compile(folded)
    norms = sum(1 for _, n in graph.walk() if n.op.op_name == "batch_norm")
    fns, calls, info = {}, {}, {}
    for batch, n in batches.items():
        x = jax.random.normal(jax.random.key(1), (batch, *shape))
        for name, m, p, s in (("unfolded", model, params, state), ("folded", fmodel, fparams, fstate)):
            key = (batch, name)
            started = time.perf_counter()
            y, _ = m.apply(p, s, x, inference_mode=True)
            y.block_until_ready()
            first = time.perf_counter() - started
            hlo = hlo_counts(m.hlo(x, optimized=True, inference_mode=True))
            info[key] = (first, hlo, np.asarray(y))
            fns[key] = (lambda m=m, p=p, s=s, x=x: m.apply(p, s, x, inference_mode=True)[0]
                        .block_until_ready())
            calls[key] = n
    wall, cpu = timed(fns, rounds, calls)
    rows, hlo_rows = [], []
    for batch in batches:
        u, f = (batch, "unfolded"), (batch, "folded")
        diff = np.abs(info[f][2] - info[u][2]).max() / np.abs(info[u][2]).max()
        rows.append([f"{label}, batch {batch}", fmt_time(median(wall[u])), fmt_time(median(wall[f])),
                     ratio(wall[f], wall[u]), fmt_time(median(cpu[u])), fmt_time(median(cpu[f])),
                     ratio(cpu[f], cpu[u]), f"{diff:.1e}"])
        hlo_rows.append([f"{label}, batch {batch}", info[u][1], info[f][1],
                         f"{info[u][0]:.2f} s", f"{info[f][0]:.2f} s"])
    note = (f"{label}: {norms} BatchNorms folded in {fold_time * 1e3:.0f} ms "
            f"({len(list(graph.walk()))} nodes before, {len(list(folded.walk()))} after)")
    return rows, hlo_rows, note


# --- 2. conv + bias + activation --------------------------------------------------------

_METADATA = re.compile(r", metadata=\{[^}]*\}")
_NAME = re.compile(r"%[\w.\-]+")


def canonical(text: str) -> list[str]:
    """The optimized HLO's instructions, metadata and names left out (the layers' named
    scopes and the source lines differ between two graphs of the same program)."""
    lines = []
    for line in text.splitlines():
        if "=" not in line or line.lstrip().startswith(("HloModule", "//")) or line[:1].isdigit():
            continue
        lines.append(_NAME.sub("%_", _METADATA.sub("", line)).strip())
    return lines


def entry_fusions(text: str) -> list[str]:
    """The ENTRY computation's fusions: ``name (kind)``."""
    entry = text[text.index("ENTRY"):]
    return [f"`{m.group(1)}` ({m.group(2)})"
            for m in re.finditer(r"%([\w.\-]+) = \S+ fusion\(.*?kind=(\w+)", entry)]


def activation_cases():
    """(label, one-layer graph, two-layer graph, input)."""
    x = mg.Input(("batch", 32, 32, 64), name="x")
    conv = dict(features=64, kernel_size=(3, 3), padding="SAME", name="conv")
    yield ("Conv 3x3 64->64 + relu, 8x32x32x64",
           mg.Graph(x, ops.Conv(**conv, activation="relu")(x)),
           mg.Graph(x, ops.relu(ops.Conv(**conv)(x))),
           jax.random.normal(jax.random.key(0), (8, 32, 32, 64)))
    x = mg.Input(("batch", 512), name="x")
    yield ("Linear 512->2048 + gelu, batch 256",
           mg.Graph(x, ops.Linear(2048, activation="gelu", name="fc")(x)),
           mg.Graph(x, ops.gelu(ops.Linear(2048, name="fc")(x))),
           jax.random.normal(jax.random.key(0), (256, 512)))


def activation_rows(rounds: int, calls: int):
    rows, notes = [], []
    for label, one, two, x in activation_cases():
        fns, texts = {}, {}
        for name, g in (("one layer", one), ("two layers", two)):
            m = mg.compile(g)
            p, s = m.init(jax.random.key(0))
            texts[name] = m.hlo(x, optimized=True, inference_mode=True)
            m.apply(p, s, x)[0].block_until_ready()
            fns[name] = (lambda m=m, p=p, s=s: m.apply(p, s, x, inference_mode=True)[0]
                         .block_until_ready())
        same = canonical(texts["one layer"]) == canonical(texts["two layers"])
        wall, cpu = timed(fns, rounds, dict.fromkeys(fns, calls))
        a, b = "one layer", "two layers"
        rows.append([label, "same" if same else "**differs**", hlo_counts(texts[a]),
                     fmt_time(median(wall[a])), fmt_time(median(wall[b])), ratio(wall[b], wall[a]),
                     ratio(cpu[b], cpu[a])])
        notes.append(f"{label}: the entry's fusions, " + ", ".join(entry_fusions(texts[a])))
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--size", type=int, default=224, help="ResNet-50's image size")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 64x64 images")
    args = parser.parse_args()
    rounds, size = (2, 64) if args.quick else (args.rounds, args.size)
    load = os.getloadavg()
    print(f"Load average at the start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
          f"(1 / 5 / 15 min); jax {jax.__version__}, {os.cpu_count()} CPUs; {rounds} rounds.\n")
    rows, hlo_rows, notes = [], [], []
    for label, graph, batches, shape in (
            (f"ResNet-50 {size}x{size}", mg.models.resnet50(image_size=size), {1: 3, 8: 1},
             (size, size, 3)),
            ("ResNet-style CNN 16x16x3", models_mg.resnet(), {32: 20}, (16, 16, 3))):
        r, h, n = fold_case(label, graph, batches, shape, rounds)
        rows += r
        hlo_rows += h
        notes.append(n)
    print("`apply(..., inference_mode=True)` per call, folded (`mg.fold_batch_norm`) against "
          "unfolded; ratios folded / unfolded, medians of per-round ratios (95% CI); the "
          "last column: largest difference of the logits, relative to the largest logit.\n")
    print(md_table(["model", "unfolded (wall)", "folded (wall)", "folded / unfolded (wall)",
                    "unfolded (CPU)", "folded (CPU)", "folded / unfolded (CPU)", "max diff"], rows))
    print("\nXLA's optimized HLO of `apply` (fusions / convolutions / all instructions) and the "
          "first call (trace, lower, compile, run; one trial):\n")
    print(md_table(["model", "HLO, unfolded", "HLO, folded", "first call, unfolded",
                    "first call, folded"], hlo_rows))
    print()
    for note in notes:
        print(f"- {note}")
    act_rows, act_notes = activation_rows(rounds * 2, 5 if args.quick else 20)
    print("\nConv + bias + activation in one layer (`activation=`) or as two "
          "(`ops.relu(ops.Conv(...)(x))`): XLA's optimized HLO compared with metadata and "
          "instruction names left out; times per call, two layers / one layer:\n")
    print(md_table(["layer", "optimized HLO", "HLO (fusions / convolutions / instructions)",
                    "one layer", "two layers", "two / one (wall)", "two / one (CPU)"], act_rows))
    print()
    for note in act_notes:
        print(f"- {note}")
    load = os.getloadavg()
    print(f"\nLoad average at the end: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.")


if __name__ == "__main__":
    main()
