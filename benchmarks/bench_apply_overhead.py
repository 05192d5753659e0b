"""Per-call overhead of ``model.apply`` against a hand-written ``jax.jit`` function.

A tiny MLP (16 -> 32 -> 32 -> 4, relu, batch 8) is built with mlaxgraph and written
again by hand over the SAME params dict (``x @ kernel + bias``, ``jax.nn.relu``: the
math the Linear and relu layers lower to). The work per call is negligible, so the
per-call time is JAX's dispatch plus whatever the library adds around it.

Variants, timed in paired, interleaved rounds in one process (each round runs every
variant ``calls`` times, in a random order per round; each call is followed by
``block_until_ready``):

  mlaxgraph     out, state = model.apply(params, state, x, inference_mode=True)
  hand          out = hand(params, x)                    (plain jax.jit)
  hand_sig      out, state = hand_sig(params, state, x, inference_mode=True)
                (hand-written, but with mlaxgraph's signature: a state dict in and
                out and a static keyword; isolates the cost of the signature itself)

The ratio mlaxgraph/hand is computed per round (both measured within the same round,
so machine noise hits both) and summarised by its median and interquartile range.

Also measured: the first call (trace + lower + XLA compile + run) with fresh function
objects in every trial, and the same split by JAX's AOT API (trace / lower / compile).

Run alone: ``.venv/bin/python benchmarks/bench_apply_overhead.py [--quick]``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median, quantiles

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg
from mlaxgraph import ops

SIZES = (16, 32, 32, 4)
BATCH = 8


def build_graph() -> mg.Graph:
    x = mg.Input(("batch", SIZES[0]), "float32", name="x")
    h = ops.relu(ops.Linear(SIZES[1], name="fc1")(x))
    h = ops.relu(ops.Linear(SIZES[2], name="fc2")(h))
    y = ops.Linear(SIZES[3], name="fc3")(h)
    return mg.Graph(inputs=x, outputs=y, name="mlp")


def _forward(params, x):
    """The same math as the graph: dot + bias, relu, twice, then dot + bias."""
    h = jax.nn.relu(x @ params["fc1"]["kernel"] + params["fc1"]["bias"])
    h = jax.nn.relu(h @ params["fc2"]["kernel"] + params["fc2"]["bias"])
    return h @ params["fc3"]["kernel"] + params["fc3"]["bias"]


def make_hand():
    """A fresh jitted function object (fresh closure: no trace cache hit)."""

    def hand(params, x):
        return _forward(params, x)

    return jax.jit(hand)


def make_hand_sig():
    """Hand-written, with mlaxgraph's apply signature."""

    def hand_sig(params, state, x, inference_mode=False):
        return _forward(params, x), state

    return jax.jit(hand_sig, static_argnames=("inference_mode",))


def _primitives(closed_jaxpr) -> collections.Counter:
    """Primitive names of a jaxpr, nested jaxprs (custom_jvp, pjit) included."""
    count: collections.Counter = collections.Counter()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            count[eqn.primitive.name] += 1
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(closed_jaxpr.jaxpr)
    return count


def _steady_state(model, params, state, x, hand, hand_sig, rounds, calls, warmup, seed):
    apply = model.apply

    def run_mlaxgraph(n):
        for _ in range(n):
            out, _s = apply(params, state, x, inference_mode=True)
            out.block_until_ready()

    # Every variant keeps its output in a local until the next call, as a loop over
    # batches does: dropping the output inside the call's own statement
    # (``hand(params, x).block_until_ready()``) frees its buffer on the critical path
    # and measures about 10 µs slower per call on this CPU, whatever the function.
    def run_hand(n):
        for _ in range(n):
            out = hand(params, x)
            out.block_until_ready()

    def run_hand_sig(n):
        for _ in range(n):
            out, _s = hand_sig(params, state, x, inference_mode=True)
            out.block_until_ready()

    variants = {"mlaxgraph": run_mlaxgraph, "hand": run_hand, "hand_sig": run_hand_sig}
    rng = random.Random(seed)
    for _ in range(3):  # warm-up, interleaved too
        for fn in variants.values():
            fn(warmup // 3)

    per_call = {name: [] for name in variants}
    per_call_cpu = {name: [] for name in variants}
    order = list(variants)
    perf, cpu = time.perf_counter, time.process_time
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # as timeit does: a collection inside one variant's slot is noise
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                fn = variants[name]
                c0, t0 = cpu(), perf()
                fn(calls)
                t1, c1 = perf(), cpu()
                per_call[name].append((t1 - t0) / calls)
                per_call_cpu[name].append((c1 - c0) / calls)
    finally:
        if gc_was_enabled:
            gc.enable()
    return per_call, per_call_cpu


def _first_calls(graph, params, state, x, trials, seed):
    """First-call time (trace + lower + compile + run) with fresh objects every trial,
    and the AOT split; the two variants alternate in a random order per trial."""
    rng = random.Random(seed)
    out = {k: [] for k in ("mg_compile", "mg_first", "hand_first",
                           "mg_trace", "mg_lower", "mg_xla", "hand_trace", "hand_lower", "hand_xla")}
    perf = time.perf_counter

    def mg_first():
        t0 = perf()
        model = mg.compile(graph)
        t1 = perf()
        y, _ = model.apply(params, state, x, inference_mode=True)
        y.block_until_ready()
        t2 = perf()
        out["mg_compile"].append(t1 - t0)
        out["mg_first"].append(t2 - t1)

    def hand_first():
        f = make_hand()
        t0 = perf()
        f(params, x).block_until_ready()
        out["hand_first"].append(perf() - t0)

    def mg_aot():
        model = mg.compile(graph)
        t0 = perf()
        traced = model.apply.trace(params, state, x, inference_mode=True)
        t1 = perf()
        lowered = traced.lower()
        t2 = perf()
        lowered.compile()
        t3 = perf()
        out["mg_trace"].append(t1 - t0)
        out["mg_lower"].append(t2 - t1)
        out["mg_xla"].append(t3 - t2)

    def hand_aot():
        f = make_hand()
        t0 = perf()
        traced = f.trace(params, x)
        t1 = perf()
        lowered = traced.lower()
        t2 = perf()
        lowered.compile()
        t3 = perf()
        out["hand_trace"].append(t1 - t0)
        out["hand_lower"].append(t2 - t1)
        out["hand_xla"].append(t3 - t2)

    # One discarded trial first: process-wide caches (jax.nn.relu's own jit, XLA's
    # thread pools, lazily imported modules) are warmed for both sides alike.
    for fn in (mg_first, hand_first, mg_aot, hand_aot):
        fn()
    for values in out.values():
        values.clear()
    fns = [mg_first, hand_first, mg_aot, hand_aot]
    for _ in range(trials):
        rng.shuffle(fns)
        for fn in fns:
            fn()
    return out


def run(quick: bool = False, rounds: int | None = None, calls: int | None = None,
        trials: int | None = None, seed: int = 0) -> dict:
    rounds = rounds or (40 if quick else 200)
    calls = calls or (100 if quick else 200)
    trials = trials or (3 if quick else 7)
    warmup = 300 if quick else 3000

    graph = build_graph()
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, SIZES[0]), jnp.float32)
    hand, hand_sig = make_hand(), make_hand_sig()

    # Same numbers, same math.
    y_mg, _ = model.apply(params, state, x, inference_mode=True)
    y_hand = hand(params, x)
    max_abs_diff = float(np.max(np.abs(np.asarray(y_mg) - np.asarray(y_hand))))
    prims_mg = _primitives(jax.make_jaxpr(lambda p, s, x: model.apply_fn(p, s, x, inference_mode=True))(params, state, x))
    prims_hand = _primitives(jax.make_jaxpr(_forward)(params, x))

    per_call, per_call_cpu = _steady_state(model, params, state, x, hand, hand_sig, rounds, calls,
                                           warmup, seed)
    ratio = [a / b for a, b in zip(per_call["mlaxgraph"], per_call["hand"])]
    ratio_cpu = [a / b for a, b in zip(per_call_cpu["mlaxgraph"], per_call_cpu["hand"])]
    ratio_sig = [a / b for a, b in zip(per_call["mlaxgraph"], per_call["hand_sig"])]
    ratio_sig_hand = [a / b for a, b in zip(per_call["hand_sig"], per_call["hand"])]

    first = _first_calls(graph, params, state, x, trials, seed + 1)

    return {
        "config": {"sizes": SIZES, "batch": BATCH, "rounds": rounds, "calls": calls,
                   "warmup": warmup, "trials": trials, "seed": seed},
        "max_abs_diff": max_abs_diff,
        "same_primitives": prims_mg == prims_hand,
        "primitives_mg": dict(prims_mg),
        "primitives_hand": dict(prims_hand),
        "per_call": per_call,
        "per_call_cpu": per_call_cpu,
        "ratio": ratio,
        "ratio_cpu": ratio_cpu,
        "ratio_vs_sig": ratio_sig,
        "ratio_sig_vs_hand": ratio_sig_hand,
        "first": first,
        "goal_ratio": 1.05,
    }


def summary(res: dict) -> dict:
    """Medians and spreads of a ``run`` result."""
    s = {}
    for name, xs in res["per_call"].items():
        q1, q3 = quantiles(xs)
        s[name] = (median(xs), q1, q3)
    for key in ("ratio", "ratio_cpu", "ratio_vs_sig", "ratio_sig_vs_hand"):
        q1, q3 = quantiles(res[key])
        s[key] = (median(res[key]), q1, q3)
        s[key + "_ci"] = bootstrap_median_ci(res[key])
    s["first"] = {k: median(v) for k, v in res["first"].items() if v}
    s["first_spread"] = {k: quantiles(v) for k, v in res["first"].items() if v}
    s["goal_met"] = s["ratio"][0] <= res["goal_ratio"]
    return s


def markdown(res: dict) -> str:
    s = summary(res)
    c = res["config"]
    sizes = " -> ".join(map(str, c["sizes"]))
    out = [f"MLP {sizes} (relu), batch {c['batch']}, float32. {c['rounds']} rounds x "
           f"{c['calls']} calls per variant, random order in each round, after "
           f"{c['warmup']} warm-up calls each; every call followed by `block_until_ready`; "
           f"gc disabled while timing. Outputs agree to {res['max_abs_diff']:.1e} (max abs diff); "
           f"jaxpr primitives {'identical' if res['same_primitives'] else 'DIFFERENT'} "
           f"({', '.join(f'{k} x{v}' for k, v in sorted(res['primitives_mg'].items()))}).",
           ""]
    rows = []
    labels = {"mlaxgraph": "mlaxgraph `model.apply(params, state, x, inference_mode=True)`",
              "hand": "hand-written `jax.jit` `hand(params, x)`",
              "hand_sig": "hand-written `jax.jit` with apply's signature `(params, state, x, inference_mode=True) -> (y, state)`"}
    for name in ("mlaxgraph", "hand", "hand_sig"):
        m, q1, q3 = s[name]
        rows.append([labels[name], fmt_time(m), f"{fmt_time(q1)} – {fmt_time(q3)}"])
    out.append(md_table(["per call (steady state)", "median of rounds", "IQR of rounds"], rows))
    out.append("")
    rows = []
    for key, label in (("ratio", "**mlaxgraph / hand-written** (goal <= 1.05)"),
                       ("ratio_cpu", "mlaxgraph / hand-written, process CPU time instead of wall time"),
                       ("ratio_vs_sig", "mlaxgraph / hand-written with apply's signature"),
                       ("ratio_sig_vs_hand", "hand-written with apply's signature / hand-written")):
        m, q1, q3 = s[key]
        lo, hi = s[key + "_ci"]
        rows.append([label, f"{m:.3f}", f"{lo:.3f} – {hi:.3f}", f"{q1:.3f} – {q3:.3f}"])
    out.append(md_table(["per-round ratio", "median", "95% CI of the median (bootstrap)",
                         "IQR of rounds"], rows))
    out.append("")
    f, fs = s["first"], s["first_spread"]

    def cell(k):
        q1, q3 = fs[k]
        return f"{fmt_time(f[k])} ({fmt_time(q1)} – {fmt_time(q3)})"

    out.append(f"First call with fresh function objects, median (IQR) of {c['trials']} trials "
               f"after one discarded warm-up trial:")
    out.append("")
    rows = [
        ["first call: trace + lower + compile + run", cell("mg_first"), cell("hand_first"),
         f"{f['mg_first'] / f['hand_first']:.2f}"],
        ["  AOT split: trace (`.trace`)", cell("mg_trace"), cell("hand_trace"),
         f"{f['mg_trace'] / f['hand_trace']:.2f}"],
        ["  AOT split: lower to StableHLO (`.lower`)", cell("mg_lower"), cell("hand_lower"),
         f"{f['mg_lower'] / f['hand_lower']:.2f}"],
        ["  AOT split: XLA compile (`.compile`)", cell("mg_xla"), cell("hand_xla"),
         f"{f['mg_xla'] / f['hand_xla']:.2f}"],
        ["`mg.compile(graph)` (passes + jit wrappers, no trace)", cell("mg_compile"), "–", "–"],
    ]
    out.append(md_table(["first call", "mlaxgraph", "hand-written", "ratio"], rows))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short run")
    p.add_argument("--rounds", type=int)
    p.add_argument("--calls", type=int)
    p.add_argument("--trials", type=int)
    args = p.parse_args(argv)
    res = run(args.quick, args.rounds, args.calls, args.trials)
    print(markdown(res))


if __name__ == "__main__":
    main()
