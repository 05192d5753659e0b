"""Build and compile time of deep graphs: does the compiler scale linearly?

Graphs of N layers (N = 1,000, 10,000, 50,000) are built through the public API from a
repeating 4-layer unit of width 8 (small, so this measures the compiler, not XLA):

    skip = h;  h = Linear(8)(h);  h = relu(h);  h = Linear(8)(h);  h = add(h, skip)

so N layers are N nodes besides the input (a residual add every 4 layers). Timed, per
trial (fresh graph every trial):

  build   the Python calls above plus ``mg.Graph(inputs=x, outputs=h)``
  passes  ``run_passes(graph, default_passes(mg.Policy()))`` (verify, infer_shapes,
          insert_casts, remove_redundant_casts, eliminate_dead_nodes; verify after
          each); the CPU time of each pass is recorded too (the rest is ``verify``)
  compile ``mg.compile(graph)``: the passes again plus the jitted wrappers (no trace)
  lowering ``model.apply.trace(...)`` (the interpreter runs every layer's JAX code:
          the jaxpr) and ``.lower()`` (StableHLO), on abstract params (shapes from the
          layers' ``param_specs``, so no init and no XLA compile; XLA's own compile of
          a 50,000-layer program is not the compiler's cost); the same chain written as
          a plain JAX loop is traced and lowered too, as the reference

Per-layer time is reported so linear growth shows as a flat column. Where a size would
take too long (the time of the passes is projected from the smaller sizes with a
``a*N + b*N^2`` fit), its passes and compile are skipped and the projection shown;
``--budget inf`` runs everything. With ``--profile N1,N2`` the passes are run under
cProfile at two sizes and the growth of each top function's time is printed.

Run alone: ``.venv/bin/python benchmarks/bench_compile_scale.py [--quick] [--profile 1000,4000]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import fmt_time, md_table, median

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler.passes import default_passes, run_passes

WIDTH = 8
GOAL_LAYERS, GOAL_SECONDS = 10_000, 2.0


def build_graph(n_layers: int, width: int = WIDTH) -> mg.Graph:
    """A chain of ``n_layers`` layers (Linear, relu, Linear, add-residual, repeated)."""
    x = mg.Input(("batch", width), "float32", name="x")
    h = skip = x
    for i in range(n_layers):
        k = i % 4
        if k == 0:
            skip = h
            h = ops.Linear(width)(h)
        elif k == 1:
            h = ops.relu(h)
        elif k == 2:
            h = ops.Linear(width)(h)
        else:
            h = ops.add(h, skip)
    return mg.Graph(inputs=x, outputs=h, name=f"chain{n_layers}")


def abstract_params(graph: mg.Graph) -> tuple[dict, dict]:
    """``(params, state)`` as ``jax.ShapeDtypeStruct`` trees, from the layers' specs."""
    import jax
    import numpy as np

    params, state = {}, {}
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        specs = graph.input_specs_of(node)
        for target, declared in ((params, node.op.param_specs(specs)), (state, node.op.state_specs(specs))):
            if declared:
                target[node.layer] = {k: jax.ShapeDtypeStruct(v.shape, np.float32)
                                      for k, v in declared.items()}
    return params, state


def hand_chain(params: dict, order: list[str], x):
    """The chain of ``build_graph`` written as a plain JAX loop over the same params."""
    import jax

    h = skip = x
    for i, name in enumerate(order):
        k = i % 4
        if k == 0:
            skip = h
            h = h @ params[name]["kernel"] + params[name]["bias"]
        elif k == 1:
            h = jax.nn.relu(h)
        elif k == 2:
            h = h @ params[name]["kernel"] + params[name]["bias"]
        else:
            h = h + skip
    return h


HAND_REFERENCE_MAX = 10_000  # the plain-JAX reference is traced up to this size


def lowering_times(n: int) -> dict:
    """The whole pipeline on a fresh ``n``-layer chain, with Python's cyclic GC off (as
    ``timeit`` does): build, ``mg.compile`` (passes and jit wrappers), trace and lower
    ``model.apply`` (abstract params); and, up to ``HAND_REFERENCE_MAX`` layers, trace
    and lower the plain-JAX chain. With the GC on, a collection scans the whole heap, so
    every per-layer time grows with the graph, plain JAX's as much as mlaxgraph's."""
    import jax
    import jax.numpy as jnp

    perf = time.perf_counter
    out = {}
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = perf()
        graph = build_graph(n)
        t1 = perf()
        model = mg.compile(graph)
        t2 = perf()
        params, state = abstract_params(model.graph)
        x = jax.ShapeDtypeStruct((8, WIDTH), jnp.float32)
        t3 = perf()
        traced = model.apply.trace(params, state, x, inference_mode=True)
        t4 = perf()
        traced.lower()
        t5 = perf()
        out.update(p_build=t1 - t0, p_compile=t2 - t1, trace=t4 - t3, lower=t5 - t4)
        if n <= HAND_REFERENCE_MAX:
            order = [v.layer for v in model.graph.nodes if v.name not in model.graph.inputs]
            fn = jax.jit(lambda p, x: hand_chain(p, order, x))
            t6 = perf()
            traced = fn.trace(params, x)
            t7 = perf()
            traced.lower()
            t8 = perf()
            out.update(hand_trace=t7 - t6, hand_lower=t8 - t7)
    finally:
        if was:
            gc.enable()
    return out


def timed_passes(record: dict):
    """``default_passes`` with each pass wrapped to record its own (CPU) time."""
    out = []
    for name, fn in default_passes(mg.Policy()):
        def wrapped(graph, fn=fn, name=name):
            t0 = time.process_time()
            result = fn(graph)
            record[name] = time.process_time() - t0
            return result
        out.append((name, wrapped))
    return out


def pipeline_seconds(row: dict) -> float:
    """build + mg.compile (passes) + trace + lower of a row timed by ``lowering_times``."""
    return row["p_build"] + row["p_compile"] + row["trace"] + row["lower"]


def one_trial(n: int, do_passes: bool = True, do_compile: bool = True,
              do_lowering: bool = False) -> dict:
    gc.collect()
    perf, cpu = time.perf_counter, time.process_time
    c0, t0 = cpu(), perf()
    graph = build_graph(n)
    t1, c1 = perf(), cpu()
    assert len(graph.nodes) == n + 1
    trial = {"build": t1 - t0, "build_cpu": c1 - c0, "pass_times": {}}
    if do_passes:
        c0, t0 = cpu(), perf()
        compiled = run_passes(graph, timed_passes(trial["pass_times"]))
        t1, c1 = perf(), cpu()
        trial["passes"] = t1 - t0
        trial["passes_cpu"] = c1 - c0
        trial["nodes_after"] = len(compiled.nodes)
        trial["verify"] = trial["passes_cpu"] - sum(trial["pass_times"].values())
    if do_compile:
        t0 = perf()
        mg.compile(graph)
        trial["compile"] = perf() - t0
    if do_lowering:
        del graph
        trial.update(lowering_times(n))
    return trial


def fit_quadratic(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(a, b) of t = a*N + b*N^2 through the two largest measured sizes, b >= 0."""
    if len(points) < 2:
        return None
    (n1, t1), (n2, t2) = sorted(points)[-2:]
    b = max(0.0, (t2 / n2 - t1 / n1) / (n2 - n1))
    a = t2 / n2 - b * n2
    if a < 0:
        a, b = 0.0, t2 / n2 ** 2
    return a, b


def run(quick: bool = False, sizes=None, trials=None, budget: float = 60.0,
        lowering: bool = True) -> dict:
    sizes = sizes or ((1_000, 10_000) if quick else (1_000, 10_000, 50_000))
    trials = trials or {}
    results = []
    measured: list[tuple[int, float]] = []
    for n in sizes:
        k = trials.get(n) or (1 if quick else (5 if n <= 2_000 else 3 if n <= 10_000 else 1))
        fit = fit_quadratic(measured)
        projected = None if fit is None else fit[0] * n + fit[1] * n * n
        run_passes_here = projected is None or projected <= budget
        # Lowering is timed in the first trial only (it costs more than the rest together).
        ts = [one_trial(n, run_passes_here, run_passes_here, lowering and run_passes_here and i == 0)
              for i in range(k)]
        row = {"n": n, "trials": k, "build": median([t["build"] for t in ts]),
               "build_cpu": median([t["build_cpu"] for t in ts]),
               "projected_passes": projected, "skipped": not run_passes_here}
        if run_passes_here:
            row["passes"] = median([t["passes"] for t in ts])
            row["passes_cpu"] = median([t["passes_cpu"] for t in ts])
            row["build_passes_cpu"] = median([t["build_cpu"] + t["passes_cpu"] for t in ts])
            row["compile"] = median([t["compile"] for t in ts])
            row["verify"] = median([t["verify"] for t in ts])
            row["pass_times"] = {name: median([t["pass_times"][name] for t in ts])
                                 for name in ts[0]["pass_times"]}
            row["nodes_after"] = ts[0]["nodes_after"]
            for key in ("p_build", "p_compile", "trace", "lower", "hand_trace", "hand_lower"):
                if key in ts[0]:
                    row[key] = ts[0][key]
            measured.append((n, row["passes"]))
        results.append(row)
    return {"rows": results, "budget": budget, "width": WIDTH,
            "goal": (GOAL_LAYERS, GOAL_SECONDS)}


def _where(func) -> str:
    filename, line, name = func
    for marker in ("/mlaxgraph/", "/site-packages/"):
        if marker in filename:
            filename = filename[filename.index(marker) + 1:]
            break
    else:
        if filename.startswith("/"):
            filename = filename.rsplit("/", 1)[-1]
    return f"{filename}:{line}({name})" if filename != "~" else name


def profile(n: int, what: str = "passes") -> dict:
    """cProfile of ``run_passes`` (or of the build) on an n-layer chain: per function
    (as ``file:line(name)``) calls, own time, cumulative time and callers."""
    run_passes(build_graph(100), default_passes(mg.Policy()))  # warm-up (first-use costs)
    gc.collect()
    prof = cProfile.Profile(time.process_time)  # CPU time: other processes' load is not charged
    if what == "passes":
        graph = build_graph(n)
        prof.enable()
        run_passes(graph, default_passes(mg.Policy()))
        prof.disable()
    else:
        prof.enable()
        build_graph(n)
        prof.disable()
    stats = pstats.Stats(prof)
    funcs = {}
    for func, (cc, nc, tt, ct, callers) in stats.stats.items():
        funcs[_where(func)] = {"ncalls": nc, "tottime": tt, "cumtime": ct,
                               "callers": {_where(c): v[3] for c, v in callers.items()}}
    return {"n": n, "what": what, "total": stats.total_tt, "funcs": funcs}


def profile_growth(small: dict, large: dict) -> list[dict]:
    """Every function in both profiles with how its own and cumulative time grow from
    the small to the large graph, sorted by own time in the large one. Linear code
    grows like the size ratio (exponent 1); code that is linear per call and called
    once per node grows like its square (exponent 2)."""
    k = large["n"] / small["n"]
    rows = []
    for name, lf in large["funcs"].items():
        sf = small["funcs"].get(name)
        if sf is None or sf["tottime"] <= 0 or sf["cumtime"] <= 0 or lf["tottime"] <= 0:
            continue
        own_growth = lf["tottime"] / sf["tottime"]
        cum_growth = lf["cumtime"] / sf["cumtime"]
        rows.append({"func": name, "calls": (sf["ncalls"], lf["ncalls"]),
                     "own": (sf["tottime"], lf["tottime"]), "cum": (sf["cumtime"], lf["cumtime"]),
                     "own_growth": own_growth, "cum_growth": cum_growth,
                     "share": lf["cumtime"] / large["total"],
                     "own_share": lf["tottime"] / large["total"],
                     "own_exp": math.log(own_growth) / math.log(k),
                     "cum_exp": math.log(cum_growth) / math.log(k),
                     "callers": lf["callers"]})
    rows.sort(key=lambda r: -r["own"][1])
    return rows


def markdown(res: dict) -> str:
    goal_n, goal_s = res["goal"]
    rows = []
    for r in res["rows"]:
        n = r["n"]
        if r["skipped"]:
            rows.append([f"{n:,}", r["trials"], fmt_time(r["build"]), f"{r['build'] / n * 1e6:.0f}",
                         f"skipped (projected ≈ {fmt_time(r['projected_passes'])})", "–",
                         "–", "–", "–"])
            continue
        rows.append([f"{n:,}", r["trials"], fmt_time(r["build"]), f"{r['build'] / n * 1e6:.0f}",
                     fmt_time(r["passes"]), f"{r['passes'] / n * 1e6:.0f}",
                     f"{fmt_time(r['build'] + r['passes'])} ({fmt_time(r['build_passes_cpu'])})",
                     fmt_time(r["compile"]), f"{r['compile'] / n * 1e6:.0f}"])
    out = [f"Chains of N layers, width {res['width']} (Linear, relu, Linear, residual add; "
           f"repeated). Medians of the trials; a fresh graph every trial. Wall times; the "
           f"process CPU time of build + passes in parentheses (less sensitive to other "
           f"processes on a shared machine).", "",
           md_table(["layers N", "trials", "build", "build µs/layer", "passes", "passes µs/layer",
                     "build + passes (CPU time)", "`mg.compile`", "compile µs/layer"], rows), ""]
    low = [r for r in res["rows"] if "trace" in r]
    if low:
        rows = []
        for r in low:
            n = r["n"]
            total = pipeline_seconds(r)
            ref = "hand_trace" in r

            def c(v):
                return f"{fmt_time(v)} ({v / n * 1e6:.0f})"

            rows.append([f"{n:,}", c(r["p_build"]), c(r["p_compile"]), c(r["trace"]), c(r["lower"]),
                         c(total), c(r["hand_trace"]) if ref else "–", c(r["hand_lower"]) if ref else "–",
                         f"{r['trace'] / r['hand_trace']:.2f}" if ref else "–"])
        first, last = low[0], low[-1]
        growth = (pipeline_seconds(last) / last["n"]) / (pipeline_seconds(first) / first["n"])
        out += ["The whole pipeline, per size, on a fresh graph with Python's cyclic GC off while "
                "timing (as `timeit` does; with it on, a collection scans the whole heap and every "
                "per-layer time, plain JAX's too, grows with the graph): build, `mg.compile` "
                "(passes + jit wrappers), then `model.apply.trace(params, state, x)` (the interpreter "
                "runs every layer's JAX code under `jax.named_scope`: the jaxpr) and `.lower()` "
                "(StableHLO), on abstract params (`jax.ShapeDtypeStruct`s from the layers' "
                "`param_specs`: no init, no XLA compile). Reference (up to "
                f"{HAND_REFERENCE_MAX:,} layers): the same chain written as a plain JAX loop over the "
                "same params, traced and lowered. Wall time (µs per layer).", "",
                md_table(["layers N", "build", "`mg.compile`", "trace", "lower", "total",
                          "plain JAX trace", "plain JAX lower", "trace: mlaxgraph / plain JAX"], rows), "",
                f"Build + passes + lowering per layer: {pipeline_seconds(first) / first['n'] * 1e6:.0f} µs "
                f"at {first['n']:,} layers, {pipeline_seconds(last) / last['n'] * 1e6:.0f} µs at "
                f"{last['n']:,} (x{growth:.2f}; x1.0 is linear growth).", ""]
    names = []
    for r in res["rows"]:
        for name in r.get("pass_times", {}):
            if name not in names:
                names.append(name)
    rows = []
    for r in res["rows"]:
        if r["skipped"]:
            continue
        n = r["n"]
        rows.append([f"{n:,}"] + [f"{fmt_time(r['pass_times'][k])} ({r['pass_times'][k] / n * 1e6:.0f} µs/layer)"
                                  for k in names]
                    + [f"{fmt_time(r['verify'])} ({r['verify'] / n * 1e6:.0f} µs/layer)"])
    out += ["CPU time of each pass (median; `verify` runs before the first pass and after each):", "",
            md_table(["layers N"] + [f"`{k}`" for k in names] + ["`verify` (x5)"], rows)]
    goal = [r for r in res["rows"] if r["n"] == goal_n and not r["skipped"]]
    if goal:
        t = goal[0]["build"] + goal[0]["passes"]
        out += ["", f"Goal: build + passes for {goal_n:,} layers < {goal_s:g} s: "
                    f"**{fmt_time(t)} — {'met' if t < goal_s else 'MISSED'}** "
                    f"(CPU time {fmt_time(goal[0]['build_passes_cpu'])})."]
    return "\n".join(out)


def profile_markdown(small: dict, large: dict, top: int = 10) -> str:
    growth = profile_growth(small, large)
    n1, n2 = small["n"], large["n"]
    out = [f"cProfile (process CPU time) of `run_passes` on chains of {n1:,} and {n2:,} layers "
           f"(total {small['total']:.2f} s and {large['total']:.2f} s under the profiler). "
           f"The functions with the most own time, then the most cumulative time, at {n2:,} "
           f"layers; 'exponent' is log(time at {n2:,} / time at {n1:,}) / log({n2 / n1:g}): "
           f"1 = linear, 2 = quadratic.", ""]
    shown = growth[:top]
    shown += [r for r in sorted(growth, key=lambda r: -r["cum"][1])[:top] if r not in shown]
    rows = []
    for r in shown:
        rows.append([f"`{r['func']}`", f"{r['calls'][0]:,} → {r['calls'][1]:,}",
                     f"{r['own'][0]:.3f} → {r['own'][1]:.3f}", f"{r['own_exp']:.2f}",
                     f"{r['cum'][0]:.3f} → {r['cum'][1]:.3f}", f"{r['cum_exp']:.2f}",
                     f"{100 * r['share']:.0f}%"])
    out.append(md_table(["function", "calls", "own s", "own exponent", "cumulative s",
                         "cum. exponent", f"cum. share at {n2:,}"], rows))
    culprits = [r for r in growth if r["own_exp"] >= 1.6 and r["own_share"] >= 0.01]
    out += ["", "Superlinear functions (own-time exponent >= 1.6 and >= 1% of the total), "
                "with their callers:", ""]
    if not culprits:
        out.append("- none")
    for r in culprits:
        callers = ", ".join(f"`{c}`" for c in sorted(r["callers"], key=lambda c: -r["callers"][c]))
        out.append(f"- `{r['func']}`: {r['calls'][0]:,} → {r['calls'][1]:,} calls, own time "
                   f"x{r['own_growth']:.1f} for x{n2 / n1:g} layers (exponent {r['own_exp']:.2f}, "
                   f"{100 * r['own_share']:.0f}% of the total at {n2:,}); called by {callers}")
    return "\n".join(out)


def profile_table(prof: dict, top: int = 12, key: str = "cumtime") -> str:
    """The top functions of one profile, by cumulative (or own) time."""
    funcs = prof["funcs"]
    names = sorted(funcs, key=lambda f: -funcs[f][key])[:top]
    rows = [[f"`{f}`", f"{funcs[f]['ncalls']:,}", f"{funcs[f]['tottime']:.3f}",
             f"{funcs[f]['cumtime']:.3f}", f"{100 * funcs[f]['cumtime'] / prof['total']:.0f}%"]
            for f in names]
    return md_table(["function", "calls", "own s", "cumulative s", "cum. share"], rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1,000 and 10,000 layers, one trial")
    p.add_argument("--sizes", type=lambda s: tuple(int(v) for v in s.split(",")),
                   help="comma-separated layer counts")
    p.add_argument("--budget", type=float, default=60.0,
                   help="skip the passes of a size projected to take longer (seconds; inf: never skip)")
    p.add_argument("--profile", type=lambda s: tuple(int(v) for v in s.split(",")), metavar="N1,N2",
                   help="also profile the passes at N1 and N2 layers and compare")
    args = p.parse_args(argv)
    res = run(args.quick, args.sizes, budget=args.budget)
    print(markdown(res))
    if args.profile:
        print()
        print(profile_markdown(profile(args.profile[0]), profile(args.profile[1])))


if __name__ == "__main__":
    main()
