"""Deep models: compile time against depth, scanned and unscanned, next to the same
model written by hand (unrolled, and on ``lax.scan`` over stacked weights); init's
compile time; the train step of the scanned model against the unscanned one; and
rematerialization's peak memory and step time.

The model: a chain of N pre-norm Transformer blocks (``mlaxgraph.examples.
transformer_block``: length 64, width 128, 4 heads, MLP 512), batch 8, the loss the
mean of the squared output. "Compile" is trace + lower + XLA compile of the loss's
gradient (``jax.jit(jax.grad(loss)).lower(...).compile()``), timed once per system
and depth in a fresh jit (no cache), systems interleaved per depth.

Run: ``.venv/bin/python benchmarks/bench_deep.py [--depths 2,4,8,16,32,64]
[--unscanned-max 32] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
from _common import fmt_time, md_table, median
from jax import lax

import mlaxgraph as mg
from mlaxgraph import examples
from mlaxgraph.compiler.xla_options import init_compiler_options

LENGTH, WIDTH, HEADS, MLP, BATCH = 64, 128, 4, 512, 8
EPS = 1e-5


def chain(depth: int) -> mg.Graph:
    block = examples.transformer_block(LENGTH, WIDTH, HEADS, MLP)
    x = mg.Input(("batch", LENGTH, WIDTH), name="x")
    h = x
    for i in range(depth):
        h = block.as_block(f"block{i}")(h)
    return mg.Graph(x, h, name=f"chain{depth}")


# --- the same model by hand ----------------------------------------------------------


def _ln(p, x):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + EPS) * p["scale"] + p["bias"]


def _dense(p, x):
    return x @ p["kernel"] + p["bias"]


def hand_block(p, x):
    a = p["attention"]
    h = _ln(p["ln_attention"], x)
    # as mlaxgraph's MultiHeadAttention: 2-d projections, heads first
    def heads(w):
        y = h @ w["kernel"].reshape(WIDTH, WIDTH) + w["bias"].reshape(WIDTH)
        return jnp.swapaxes(y.reshape(y.shape[:-1] + (HEADS, WIDTH // HEADS)), 1, 2)

    q = heads(a["query"]) * (1.0 / math.sqrt(WIDTH // HEADS))
    k, v = heads(a["key"]), heads(a["value"])
    w = jax.nn.softmax(jnp.einsum("bhqk,bhsk->bhqs", q, k), axis=-1)
    o = jnp.swapaxes(jnp.einsum("bhqs,bhsk->bhqk", w, v), 1, 2)
    o = o.reshape(o.shape[:2] + (WIDTH,)) @ a["out"]["kernel"].reshape(WIDTH, WIDTH) + a["out"]["bias"]
    h = x + o
    m = jax.nn.gelu(_dense(p["mlp_in"], _ln(p["ln_mlp"], h)), approximate=False)
    return h + _dense(p["mlp_out"], m)


def hand_unrolled(depth):
    def forward(params, x):
        for i in range(depth):
            x = hand_block(params[f"block{i}"], x)
        return x
    return forward


def hand_scanned(params_stacked, x):
    return lax.scan(lambda h, p: (hand_block(p, h), None), x, params_stacked)[0]


# --- timing --------------------------------------------------------------------------


def compile_seconds(fn, *args, options=None) -> tuple[float, object]:
    gc.collect()
    start = time.perf_counter()
    compiled = jax.jit(fn, compiler_options=options).lower(*args).compile()
    return time.perf_counter() - start, compiled


def grad_of(forward):
    return jax.grad(lambda p, x: jnp.mean(jnp.square(forward(p, x))))


def run_depth(depth: int, unscanned: bool) -> dict:
    graph = chain(depth)
    scan = mg.compile(graph, scan_blocks="always")
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    row: dict = {"depth": depth}
    # init as model.init compiles it (its compiler options)
    row["init_scanned"], _ = compile_seconds(scan.init_fn, jax.random.key(0), options=init_compiler_options())
    stacked, state = scan.init(jax.random.key(0))
    row["scanned"], _ = compile_seconds(grad_of(lambda p, x: scan.apply_fn(p, state, x)[0]), stacked, x)
    row["hand_scan"], _ = compile_seconds(grad_of(hand_scanned), stacked["block0..block" + str(depth - 1)], x)
    if unscanned:
        flat = mg.compile(graph)
        row["init_unscanned"], _ = compile_seconds(flat.init_fn, jax.random.key(0), options=init_compiler_options())
        params, _ = flat.init(jax.random.key(0))
        row["unscanned"], _ = compile_seconds(grad_of(lambda p, x: flat.apply_fn(p, {}, x)[0]), params, x)
        row["hand_unrolled"], _ = compile_seconds(grad_of(hand_unrolled(depth)), params, x)
    return row


def paired_unrolled(depth: int, rounds: int) -> list[dict]:
    """Fresh compiles of the unscanned model's gradient and the hand-unrolled one's,
    ``rounds`` pairs, the order alternating; each pair with its ratio."""
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    flat = mg.compile(chain(depth))
    params, _ = flat.init(jax.random.key(0))
    compile_seconds(grad_of(hand_unrolled(2)), {k: params[k] for k in ("block0", "block1")}, x)
    pairs = []
    for r in range(rounds):
        pair: dict = {}
        for who in (("ours", "hand") if r % 2 == 0 else ("hand", "ours")):
            fn = (grad_of(lambda p, x: flat.apply_fn(p, {}, x)[0]) if who == "ours"
                  else grad_of(hand_unrolled(depth)))
            pair[who], _ = compile_seconds(fn, params, x)
        pair["ratio"] = pair["ours"] / pair["hand"]
        pairs.append(pair)
    return pairs


def _time_once(compiled, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - start


def train_and_remat(depth: int, rounds: int = 15) -> dict:
    """The compiled gradient step, unscanned, scanned and scanned with remat: its time
    (the systems interleaved in each round; medians) and XLA's peak memory."""
    graph = chain(depth)
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    out: dict = {"depth": depth}
    flat = mg.compile(graph)
    params, _ = flat.init(jax.random.key(0))
    runs = {}
    for label, options in [("unscanned", {}), ("scanned", {"scan_blocks": "always"}),
                           ("scanned_full", {"scan_blocks": "always", "remat": "full"}),
                           ("scanned_dots", {"scan_blocks": "always", "remat": "dots"})]:
        model = mg.compile(graph, **options)
        p, _ = model.stack_weights(params, {})
        _, compiled = compile_seconds(grad_of(lambda q, x, model=model: model.apply_fn(q, {}, x)[0]), p, x)
        memory = compiled.memory_analysis()
        out[label] = {"temp_bytes": int(memory.temp_size_in_bytes),
                      "peak_bytes": int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                        + memory.output_size_in_bytes)}
        runs[label] = (compiled, (p, x))
        _time_once(compiled, (p, x))
    times: dict = {label: [] for label in runs}
    for _ in range(rounds):
        for label, (compiled, args) in runs.items():
            times[label].append(_time_once(compiled, args))
    for label in runs:
        out[label]["step_s"] = median(times[label])
        out[label]["ratio"] = median([t / u for t, u in zip(times[label], times["unscanned"])])
    return out


def planner(depth: int, fractions=(1.0, 0.7, 0.5, 0.3), rounds: int = 10) -> dict:
    """The memory planner at budgets from 30% to 100% of the scanned model's peak without
    remat: what it chose, the measured peak, and its step time against the best
    hand-picked choice (none, dots or full) that fits the same budget."""
    graph = chain(depth)
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    base = mg.compile(graph, scan_blocks="always", memory_budget=2**50, dims={"batch": BATCH})
    peak = base.memory_plan().baseline_peak
    hand: dict = {}
    params, _ = mg.compile(graph).init(jax.random.key(0))
    for remat in ("none", "dots", "full"):
        model = mg.compile(graph, scan_blocks="always", remat=remat)
        p, _ = model.stack_weights(params, {})
        _, compiled = compile_seconds(grad_of(lambda q, x, model=model: model.apply_fn(q, {}, x)[0]), p, x)
        memory = compiled.memory_analysis()
        hand[remat] = {"compiled": compiled, "args": (p, x),
                       "peak": int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                   + memory.output_size_in_bytes - memory.alias_size_in_bytes)}
    rows = []
    for fraction in fractions:
        budget = int(peak * fraction)
        try:
            model = mg.compile(graph, scan_blocks="always", memory_budget=budget, dims={"batch": BATCH})
        except mg.GraphError as e:
            rows.append({"fraction": fraction, "budget": budget, "error": str(e)})
            continue
        plan = model.memory_plan()
        p, _ = model.stack_weights(params, {})
        _, compiled = compile_seconds(grad_of(lambda q, x, model=model: model.apply_fn(q, {}, x)[0]), p, x)
        fitting = [k for k, v in hand.items() if v["peak"] <= budget]
        best = None
        times: dict = {"plan": [], **{k: [] for k in fitting}}
        for _ in range(rounds):
            times["plan"].append(_time_once(compiled, (p, x)))
            for k in fitting:
                times[k].append(_time_once(hand[k]["compiled"], hand[k]["args"]))
        if fitting:
            best = min(fitting, key=lambda k: median(times[k]))
        rows.append({"fraction": fraction, "budget": budget, "choice": dict(plan.choice),
                     "measured": plan.measured_peak, "step_s": median(times["plan"]),
                     "best": best, "best_step_s": median(times[best]) if best else None,
                     "ratio": median([a / b for a, b in zip(times["plan"], times[best])]) if best else None})
    return {"depth": depth, "peak_none": peak, "rows": rows,
            "hand_peaks": {k: v["peak"] for k, v in hand.items()}}


def goals(result: dict) -> list[tuple[str, str, bool]]:
    """(goal, measured, met) of the deep-models goals."""
    rows = {r["depth"]: r for r in result["rows"]}
    out = []
    top = max(d for d in rows if "unscanned" in rows[d])
    if 2 in rows and 32 in rows:
        r = rows[32]["scanned"] / rows[2]["scanned"]
        out.append(("gradient compile, scanned: 32 blocks / 2 blocks <= 1.3", f"{r:.2f}", r <= 1.3))
    if 32 in rows:
        r = rows[32]["scanned"] / rows[32]["hand_scan"]
        out.append(("gradient compile, 32 blocks: scanned / hand-written lax.scan <= 1.1", f"{r:.2f}", r <= 1.1))
    if top in rows:
        r = rows[top]["unscanned"] / rows[top]["scanned"]
        out.append((f"gradient compile, {top} blocks: unscanned / scanned >= 20", f"{r:.1f}", r >= 20))
        r = rows[top]["unscanned"] / rows[top]["hand_unrolled"]
        out.append((f"gradient compile, {top} blocks: unscanned / hand-written unrolled (what is ours)",
                    f"{r:.2f}", r <= 1.1))
    if 32 in rows:
        out.append(("init compile, 32 blocks, scanned < 1 s", fmt_time(rows[32]["init_scanned"]),
                    rows[32]["init_scanned"] < 1.0))
        if "init_unscanned" in rows[32]:
            out.append(("init compile, 32 blocks, unscanned < 3 s", fmt_time(rows[32]["init_unscanned"]),
                        rows[32]["init_unscanned"] < 3.0))
    steps = result.get("steps")
    if steps:
        r = steps["scanned"]["ratio"]
        out.append((f"gradient step, {steps['depth']} blocks: scanned / unscanned <= 1.05", f"{r:.3f}", r <= 1.05))
        m = steps["scanned_full"]["peak_bytes"] / steps["scanned"]["peak_bytes"]
        out.append((f"remat full, {steps['depth']} blocks: peak memory / no remat <= 0.4", f"{m:.2f}", m <= 0.4))
        t = median([steps["scanned_full"]["step_s"] / steps["scanned"]["step_s"]])
        out.append((f"remat full, {steps['depth']} blocks: step time / no remat <= 1.4", f"{t:.2f}", t <= 1.4))
    plan = result.get("planner")
    if plan:
        fits = all("error" not in r and r["measured"] <= r["budget"] for r in plan["rows"])
        ratios = [r["ratio"] for r in plan["rows"] if r.get("ratio")]
        worst = max(ratios) if ratios else float("nan")
        out.append(("planner: every budget from 30% to 100% fits (XLA's measure)",
                    ", ".join(f"{int(r['fraction'] * 100)}%: " + ("error" if "error" in r else
                              f"{r['measured'] / 2**20:.1f}/{r['budget'] / 2**20:.1f} MiB") for r in plan["rows"]),
                    fits))
        out.append(("planner: step time / best hand-picked choice that fits <= 1.05", f"{worst:.3f}",
                    worst <= 1.05))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="2,4,8,16,32,64")
    parser.add_argument("--unscanned-max", type=int, default=32)
    parser.add_argument("--step-depth", type=int, default=32)
    parser.add_argument("--json")
    parser.add_argument("--pairs", type=int, default=0, help="only re-measure the unscanned "
                        "gradient compile against the hand-unrolled one, in this many "
                        "interleaved pairs at --unscanned-max blocks")
    args = parser.parse_args()
    if args.pairs:
        for pair in paired_unrolled(args.unscanned_max, args.pairs):
            print(json.dumps(pair), flush=True)
        return
    result = run([int(d) for d in args.depths.split(",")], args.unscanned_max, args.step_depth)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))


def run(depths, unscanned_max: int = 32, step_depth: int = 32) -> dict:
    # One compile first, so that no depth pays the process's first compilation.
    compile_seconds(grad_of(hand_scanned), jax.tree.map(lambda a: a[None], mg.compile(chain(1)).init(
        jax.random.key(0))[0]["block0"]), jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32))
    rows = []
    for depth in depths:
        row = run_depth(depth, depth <= unscanned_max)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    steps = train_and_remat(step_depth)
    print(json.dumps(steps), file=sys.stderr, flush=True)
    plan = planner(step_depth)
    return {"rows": rows, "steps": steps, "planner": plan}


def _cell(row: dict, key: str) -> str:
    return fmt_time(row[key]) if key in row else "–"


def markdown(result: dict) -> str:
    header = ["blocks", "scanned", "hand-written lax.scan", "unscanned", "hand-written unrolled",
              "init, scanned", "init, unscanned"]
    table = [[str(r["depth"])] + [_cell(r, k) for k in ("scanned", "hand_scan", "unscanned", "hand_unrolled",
                                                        "init_scanned", "init_unscanned")]
             for r in result["rows"]]
    lines = ["Trace + lower + XLA compile of the loss's gradient (one fresh compile per system and "
             "depth; the unscanned model and the hand-unrolled one stop at the depth shown), and of "
             "`model.init`:", "", md_table(header, table), ""]
    steps = result["steps"]
    lines.append(f"The compiled gradient step at {steps['depth']} blocks, the systems interleaved in "
                 f"each round (median; ratio: median of the per-round ratios to the unscanned step):")
    lines.append("")
    lines.append(md_table(["model", "step (median)", "ratio to unscanned", "peak memory", "XLA temp"],
                          [[k.replace("_", " remat "), fmt_time(v["step_s"]), f"{v['ratio']:.3f}",
                            f"{v['peak_bytes'] / 2**20:.1f} MiB", f"{v['temp_bytes'] / 2**20:.1f} MiB"]
                           for k, v in steps.items() if isinstance(v, dict)]))
    plan = result.get("planner")
    if plan:
        lines += ["", f"The memory planner (`memory_budget`, scanned, {plan['depth']} blocks; the peak "
                      f"without remat {plan['peak_none'] / 2**20:.1f} MiB; hand-picked peaks: "
                      + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in plan["hand_peaks"].items()) + "):", ""]
        rows = []
        for r in plan["rows"]:
            if "error" in r:
                rows.append([f"{int(r['fraction'] * 100)}%", f"{r['budget'] / 2**20:.1f} MiB", r["error"], "", "", ""])
                continue
            rows.append([f"{int(r['fraction'] * 100)}%", f"{r['budget'] / 2**20:.1f} MiB",
                         ", ".join(f"{k} {v}" for k, v in r["choice"].items()) or "nothing",
                         f"{r['measured'] / 2**20:.1f} MiB", r["best"] or "–",
                         f"{r['ratio']:.3f}" if r.get("ratio") else "–"])
        lines.append(md_table(["budget", "bytes", "planner's choice", "measured peak",
                               "best hand-picked that fits", "step time / best"], rows))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
