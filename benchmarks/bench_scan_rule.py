"""When does folding a run of equal blocks into one ``lax.scan`` pay? The first train
step (trace + lower + XLA compile + one run) and the steady step, scanned
(``scan_blocks="always"``) against unscanned, over run lengths and block sizes; and
ResNet-50's first train step as a new user runs it (``scan_blocks=True``, the rule;
``"always"``; unscanned).

Blocks: a pre-norm Transformer block (``mlaxgraph.examples.transformer_block``) at two
widths, and ResNet-50's bottleneck block (``mlaxgraph.models.resnet``, 1x1 - 3x3 - 1x1
convolutions, each with its BatchNorm) at two widths; a chain of ``n`` calls of one
block, each with its own weights. The train step is ``jax.jit`` of the loss's value
and gradient and an SGD update (the mean of the squared output; BatchNorm's batch
statistics in training), the state donated. Modes interleaved in each round, fresh
objects every trial, process CPU time (XLA's compile threads included).

Run: ``.venv/bin/python benchmarks/bench_scan_rule.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
from _common import bootstrap_median_ci, fmt_time, md_table, median

import mlaxgraph as mg
from mlaxgraph import examples
from mlaxgraph.compiler.passes.fold_repeated_blocks import SCAN_MIN_RUN, scan_pays
from mlaxgraph.models import resnet as zoo_resnet

MODES = ("unscanned", "always")

# name -> (block graph maker, input shape, batch)
BLOCKS = {
    "transformer w64": (lambda: examples.transformer_block(32, 64, 4, 256), (32, 64), 8),
    "transformer w128": (lambda: examples.transformer_block(64, 128, 4, 512), (64, 128), 8),
    "bottleneck 64x16x16": (lambda: zoo_resnet._block(zoo_resnet._Spatial("NHWC"), "bottleneck", 64, 16, 1, False),
                            (16, 16, 64), 8),
    "bottleneck 256x14x14": (lambda: zoo_resnet._block(zoo_resnet._Spatial("NHWC"), "bottleneck", 256, 64, 1, False),
                             (14, 14, 256), 8),
}


def chain(block: mg.Graph, n: int, shape: tuple) -> mg.Graph:
    x = mg.Input(("batch",) + tuple(shape), name="x")
    h = x
    for i in range(n):
        h = block.as_block(f"block{i}")(h)
    return mg.Graph(x, h, name=f"chain{n}")


def train_step(model):
    """``step((params, state), x) -> ((params, state), loss)``: SGD on the mean square."""

    def step(ts, x):
        params, state = ts

        def loss(p):
            y, new_state = model.apply_fn(p, state, x)
            return jnp.mean(jnp.square(y)), new_state

        (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
        params = jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)
        return (params, new_state), value

    return jax.jit(step, donate_argnums=0)


def first_and_steady(graph: mg.Graph, scan, x, steps: int) -> tuple[float, float, float]:
    """(first step CPU seconds, its wall seconds, steady step wall seconds)."""
    model = mg.compile(graph, scan_blocks=scan)
    ts = model.init(jax.random.key(0))
    step = train_step(model)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    ts, loss = step(ts, x)
    jax.block_until_ready(loss)
    first_cpu, first_wall = time.process_time() - c0, time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        ts, loss = step(ts, x)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
    return first_cpu, first_wall, median(times)


def sweep(lengths, trials: int, steps: int, blocks=None, seed: int = 0) -> list[dict]:
    rows = []
    rng = random.Random(seed)
    for name in blocks or BLOCKS:
        make, shape, batch = BLOCKS[name]
        block = make()
        layers = sum(1 for _ in block.walk()) - len(block.inputs)
        x = jax.random.normal(jax.random.key(1), (batch,) + shape)
        for n in lengths:
            print(f"   scan rule: {name}, {n} blocks", file=sys.stderr, flush=True)
            graph = chain(block, n, shape)
            res = {m: {"first": [], "step": []} for m in MODES}
            order = list(MODES)
            for _ in range(trials):
                rng.shuffle(order)
                for m in order:
                    cpu, _, st = first_and_steady(graph, False if m == "unscanned" else m, x, steps)
                    res[m]["first"].append(cpu)
                    res[m]["step"].append(st)
            first_ratio = [a / b for a, b in zip(res["always"]["first"], res["unscanned"]["first"])]
            step_ratio = [a / b for a, b in zip(res["always"]["step"], res["unscanned"]["step"])]
            rows.append({"block": name, "layers": layers, "n": n,
                         "first": {m: median(res[m]["first"]) for m in MODES},
                         "step": {m: median(res[m]["step"]) for m in MODES},
                         "first_ratio": median(first_ratio), "first_ci": bootstrap_median_ci(first_ratio),
                         "step_ratio": median(step_ratio), "step_ci": bootstrap_median_ci(step_ratio),
                         "rule": scan_pays(block, n)})
            print(f"   {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def resnet50(trials: int, image: int = 64, batch: int = 8, seed: int = 1) -> dict:
    """ResNet-50's first train step: unscanned, ``scan_blocks=True`` (the rule) and
    ``"always"``; CPU seconds per trial, modes interleaved."""
    graph = zoo_resnet.resnet50(num_classes=10, image_size=image)
    x = jax.random.normal(jax.random.key(1), (batch, image, image, 3))
    modes = {"unscanned": False, "scan_blocks=True (the rule)": True, "scan_blocks=\"always\"": "always"}
    res = {m: [] for m in modes}
    steps = {m: [] for m in modes}
    order = list(modes)
    rng = random.Random(seed)
    for _ in range(trials):
        rng.shuffle(order)
        for m in order:
            print(f"   scan rule: resnet50, {m}", file=sys.stderr, flush=True)
            cpu, _, st = first_and_steady(graph, modes[m], x, 3)
            res[m].append(cpu)
            steps[m].append(st)
    runs = [len(node.op.names) for node in mg.compile(graph, scan_blocks="always").graph.nodes
            if node.op.op_name == "scan"]
    return {"image": image, "batch": batch, "trials": trials, "runs": runs,
            "first": {m: median(v) for m, v in res.items()},
            "ratio": {m: median([a / b for a, b in zip(v, res["unscanned"])]) for m, v in res.items()},
            "step": {m: median(v) for m, v in steps.items()}}


def run(quick: bool = False) -> dict:
    lengths = (2, 3, 4, 6, 8) if not quick else (2, 4, 8)
    trials = 3 if not quick else 2
    return {"rows": sweep(lengths, trials, steps=5), "resnet50": resnet50(trials=3 if not quick else 1)}


def markdown(res: dict) -> str:
    out = [f"Scanned (`scan_blocks=\"always\"`) against unscanned, per block and run length: the "
           f"first train step in process CPU time and the steady step in wall time (medians of "
           f"{len(res['rows'][0]['first']) and 'the'} interleaved trials, fresh objects each; "
           f"ratio scanned / unscanned with the 95% CI of the median of per-trial ratios; below 1 "
           f"the scan is faster). Last column: what `scan_blocks=True` does with such a run "
           f"(the rule: fold runs of {SCAN_MIN_RUN} or more of blocks without a convolution).", ""]
    rows = []
    for r in res["rows"]:
        rows.append([r["block"], str(r["layers"]), str(r["n"]),
                     f"{fmt_time(r['first']['unscanned'])} / {fmt_time(r['first']['always'])}",
                     f"{r['first_ratio']:.2f} ({r['first_ci'][0]:.2f} – {r['first_ci'][1]:.2f})",
                     f"{fmt_time(r['step']['unscanned'])} / {fmt_time(r['step']['always'])}",
                     f"{r['step_ratio']:.2f} ({r['step_ci'][0]:.2f} – {r['step_ci'][1]:.2f})",
                     "fold" if r["rule"] else "unrolled"])
    out.append(md_table(["block", "layers", "run", "first step CPU, unscanned / scanned",
                         "first: scanned / unscanned", "steady step, unscanned / scanned",
                         "step: scanned / unscanned", "`scan_blocks=True`"], rows))
    r50 = res["resnet50"]
    out += ["", f"ResNet-50 (`mg.models.resnet50`, {r50['image']}x{r50['image']} images, batch "
                f"{r50['batch']}; its runs of equal bottlenecks: {', '.join(map(str, r50['runs']))} "
                f"blocks), first train step, median of {r50['trials']} interleaved trials:", ""]
    out.append(md_table(["mode", "first step (CPU)", "ratio to unscanned", "steady step"],
                        [[m, fmt_time(v), f"{r50['ratio'][m]:.2f}", fmt_time(r50['step'][m])]
                         for m, v in r50["first"].items()]))
    return "\n".join(out)


def goals(res: dict) -> list[list[str]]:
    """The Goals rows: the rule agrees with the sweep (a run it folds reaches its first
    train step sooner scanned, a run it leaves unrolled does not; a ratio whose CI
    includes 1 agrees either way), and ResNet-50 as a new user compiles it."""
    rows = res["rows"]
    agree = [r for r in rows if (r["first_ci"][0] <= 1.0) if r["rule"]] + \
        [r for r in rows if (r["first_ci"][1] >= 1.0) if not r["rule"]]
    wrong = [f"{r['block']} x{r['n']} ({r['first_ratio']:.2f})" for r in rows if r not in agree]
    out = [[f"scan rule (fold runs of >= {SCAN_MIN_RUN}): agrees with the measured first train step, "
            f"scanned / unscanned, for every block and run length",
            f"{len(agree)} of {len(rows)} agree" + (f"; not: {', '.join(wrong)}" if wrong else ""),
            "**met**" if not wrong else "**MISSED**"]]
    if "resnet50" in res:
        r50 = res["resnet50"]
        ratio = r50["ratio"]["scan_blocks=True (the rule)"]
        always = r50["ratio"]['scan_blocks="always"']
        out.append(["scan rule: ResNet-50's first train step, `scan_blocks=True` / unscanned <= 1.05",
                    f"{ratio:.2f} (`\"always\"`: {always:.2f})",
                    "**met**" if ratio <= 1.05 else "**MISSED**"])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--blocks", help="comma-separated block names (default: all)")
    p.add_argument("--lengths", help="comma-separated run lengths")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--no-resnet", action="store_true")
    args = p.parse_args(argv)
    if args.blocks or args.lengths:
        lengths = tuple(int(v) for v in (args.lengths or "2,3,4,6,8").split(","))
        res = {"rows": sweep(lengths, args.trials, 5, args.blocks.split(",") if args.blocks else None)}
        for r in res["rows"]:
            print(r)
        if not args.no_resnet:
            print(resnet50(args.trials))
        return
    print(markdown(run(args.quick)))


if __name__ == "__main__":
    main()
