"""The first call of the train step, split by JAX's AOT API: trace (``jitted.trace``),
lower (``.lower()``) and XLA compile (``.compile()``), for mlaxgraph, hand-written JAX,
Flax linen, Haiku, Equinox and Keras 3 on the benchmark models (``models_*.py``).

Fresh model, optimizer and jitted step objects every trial (so nothing is cached:
JAX's trace, lowering and compile caches are keyed by the function and its jaxpr);
systems in random order in each round; process CPU time (XLA's compile threads
included) and wall time. Every system first ran once on the tiny MLP, so what a
library initialises once per process is not charged to whichever goes first. Flax NNX
is left out: ``nnx.jit`` has no ``.trace``.

The goal (issue "ahead of every peer"): mlaxgraph's first call in CPU time at most the
fastest peer's + 5%, per model: the per-round ratio mlaxgraph / fastest peer (the peer
with the smallest median), its median and the 95% CI of the median; met when the CI
reaches 1.05 or below.

Run: ``.venv/bin/python benchmarks/bench_first_call.py [--quick] [--models transformer,mlp]``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import random
import sys
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import hlo_stats
import jax
import jax.numpy as jnp
import models_spec as S
from _common import bootstrap_median_ci, fmt_time, md_table, median

GOAL = 1.05  # mlaxgraph / fastest peer, first call in CPU time
PHASES = ("trace", "lower", "compile")

# system -> (module, make function); the peers only where their library imports
SYSTEMS = {"hand": ("models_hand", "make"), "mlaxgraph": ("models_mg", "make"),
           "linen": ("models_flax", "make_linen"), "haiku": ("models_haiku", "make"),
           "equinox": ("models_equinox", "make"), "keras": ("models_keras", "make")}
TITLES = {"hand": "hand-written JAX", "mlaxgraph": "mlaxgraph", "linen": "Flax linen",
          "haiku": "Haiku", "equinox": "Equinox", "keras": "Keras 3"}
PEERS = ("linen", "haiku", "equinox", "keras")


def makers() -> tuple[dict, dict]:
    found, missing = {}, {}
    for system, (module, fn) in SYSTEMS.items():
        try:
            found[system] = getattr(importlib.import_module(module), fn)
        except Exception as e:  # a peer library missing, or failing with this JAX
            missing[system] = f"{type(e).__name__}: {e}"
    return found, missing


def _data(name: str):
    x, y = S.batch(S.SPECS[name])
    return jnp.asarray(x), jnp.asarray(y)


def one_trial(make, name: str, x, y, seed: int) -> tuple[dict, dict, str]:
    """CPU and wall seconds of each phase of one fresh first call, and the optimized HLO."""
    jitted, args = make(name, x, y, jax.random.key(seed)).aot
    arguments = args()
    gc.collect()
    cpu, wall = {}, {}
    c, w = time.process_time(), time.perf_counter()
    traced = jitted.trace(*arguments)
    cpu["trace"], wall["trace"] = time.process_time() - c, time.perf_counter() - w
    c, w = time.process_time(), time.perf_counter()
    lowered = traced.lower()
    cpu["lower"], wall["lower"] = time.process_time() - c, time.perf_counter() - w
    c, w = time.process_time(), time.perf_counter()
    compiled = lowered.compile()
    cpu["compile"], wall["compile"] = time.process_time() - c, time.perf_counter() - w
    compiled = getattr(compiled, "compiled", compiled)  # Equinox wraps JAX's Compiled
    return cpu, wall, compiled.as_text()


def measure(name: str, make: dict, trials: int, seed: int) -> dict:
    x, y = _data(name)
    cpu = {s: {p: [] for p in PHASES} for s in make}
    wall = {s: {p: [] for p in PHASES} for s in make}
    hlo = {}
    order = list(make)
    rng = random.Random(seed)
    for trial in range(trials):
        rng.shuffle(order)
        for s in order:
            c, w, text = one_trial(make[s], name, x, y, trial + 1)
            for p in PHASES:
                cpu[s][p].append(c[p])
                wall[s][p].append(w[p])
            if s not in hlo:
                counts = hlo_stats.opcode_counts(text)
                hlo[s] = dict(hlo_stats.summary(text), transpose=counts.get("transpose", 0),
                              copy=counts.get("copy", 0))
    return {"model": name, "trials": trials, "cpu": cpu, "wall": wall, "hlo": hlo}


def totals(res: dict, kind: str = "cpu") -> dict:
    """system -> per-trial first-call seconds (trace + lower + compile)."""
    return {s: [sum(v) for v in zip(*(d[p] for p in PHASES))] for s, d in res[kind].items()}


def goal(res: dict) -> dict:
    """mlaxgraph against the fastest peer (smallest median CPU total)."""
    tot = totals(res)
    peers = [s for s in PEERS if s in tot]
    fastest = min(peers, key=lambda s: median(tot[s]))
    ratio = [a / b for a, b in zip(tot["mlaxgraph"], tot[fastest])]
    lo, hi = bootstrap_median_ci(ratio)
    to_hand = {s: median([a / b for a, b in zip(tot[s], tot["hand"])]) for s in tot}
    return {"fastest": fastest, "ratio": median(ratio), "ci": (lo, hi), "met": lo <= GOAL,
            "to_hand": to_hand}


def run(quick: bool = False, models=None, seed: int = 0) -> dict:
    make, missing = makers()
    x, y = _data("tiny_mlp")
    for mk in make.values():  # once per process, untimed
        mk("tiny_mlp", x, y, jax.random.key(0)).step()
    models = tuple(models or (S.MODELS + ("tiny_mlp",)))
    out = {"missing": missing, "models": {}}
    for i, name in enumerate(models):
        trials = (3 if quick else 7) if name != "tiny_mlp" else (5 if quick else 11)
        print(f"   first call: {name} ({trials} rounds)", file=sys.stderr, flush=True)
        out["models"][name] = measure(name, make, trials, seed + i)
    return out


def markdown(out: dict) -> str:
    lines = []
    systems = [s for s in SYSTEMS if s not in out["missing"]]
    rows = []
    for name, res in out["models"].items():
        tot = totals(res)
        g = goal(res)
        cells = [S.SPECS[name].title]
        for s in systems:
            med = {p: median(res["cpu"][s][p]) for p in PHASES}
            cells.append(f"{fmt_time(median(tot[s]))} ({g['to_hand'][s]:.2f}): "
                         + " + ".join(fmt_time(med[p]) for p in PHASES))
        rows.append(cells)
    lines.append(md_table(["model"] + [TITLES[s] for s in systems], rows))
    lines += ["", "mlaxgraph against the fastest peer (per-round ratio of the CPU totals; goal <= "
              f"{GOAL}; met when the 95% CI reaches it), and the optimized HLO of the train step "
              "(fusions / transposes / copies / all instructions):", ""]
    rows = []
    for name, res in out["models"].items():
        g = goal(res)
        hlo = res["hlo"]
        rows.append([name, TITLES[g["fastest"]], f"{g['ratio']:.3f}", f"{g['ci'][0]:.3f} – {g['ci'][1]:.3f}",
                     "**met**" if g["met"] else "**missed**",
                     ", ".join(f"{TITLES[s]} {hlo[s]['fusion']}/{hlo[s]['transpose']}/{hlo[s]['copy']}/"
                               f"{hlo[s]['instructions']}" for s in systems)])
    lines.append(md_table(["model", "fastest peer", "mlaxgraph / fastest", "95% CI", "goal", "HLO"], rows))
    if out["missing"]:
        lines += ["", "Not measured: " + "; ".join(f"{s} ({why})" for s, why in out["missing"].items())]
    return "\n".join(lines)


def goals(out: dict) -> list[list[str]]:
    """The Goals rows: one per model."""
    rows = []
    for name, res in out["models"].items():
        g = goal(res)
        rows.append([f"first call (trace + lower + compile, CPU time), {name}: mlaxgraph / fastest peer "
                     f"<= {GOAL}",
                     f"{g['ratio']:.3f} against {TITLES[g['fastest']]} (95% CI {g['ci'][0]:.3f} – "
                     f"{g['ci'][1]:.3f})", "**met**" if g["met"] else "**MISSED**"])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", type=lambda v: tuple(v.split(",")))
    args = p.parse_args(argv)
    out = run(args.quick, args.models)
    print(markdown(out))
    for row in goals(out):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
