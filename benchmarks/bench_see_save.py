"""Scale of the views of a graph: summary(), to_dot(), to_json() and from_json() of deep
graphs (the same chains as bench_compile_scale). Goal: each under 2 s at 10,000 layers."""

from __future__ import annotations

import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import fmt_time, md_table, median

import mlaxgraph as mg
from bench_compile_scale import build_graph

GOAL_LAYERS, GOAL_SECONDS = 10_000, 2.0
VIEWS = {
    "summary()": lambda g: g.summary(),
    "str(graph)": str,
    "to_dot()": lambda g: g.to_dot(),
    "to_json()": lambda g: g.to_json(),
}


def run(quick: bool = False) -> dict:
    sizes = (1_000, 10_000)
    trials = 1 if quick else 3
    rows = []
    for n in sizes:
        graph = build_graph(n)
        row = {"n": n}
        for label, view in VIEWS.items():
            times = []
            for _ in range(trials):
                t = time.perf_counter()
                out = view(graph)
                times.append(time.perf_counter() - t)
            row[label] = median(times)
            if label == "to_json()":
                text = out
        times = []
        for _ in range(trials):
            t = time.perf_counter()
            loaded = mg.Graph.from_json(text)
            times.append(time.perf_counter() - t)
        assert loaded == graph
        row["from_json()"] = median(times)
        rows.append(row)
    return {"rows": rows, "trials": trials}


def markdown(res: dict) -> str:
    labels = list(VIEWS) + ["from_json()"]
    rows = [[f"{r['n']:,}"] + [fmt_time(r[k]) for k in labels] for r in res["rows"]]
    return (f"Chains of N layers, width 8 (as in section 2); median of {res['trials']} "
            f"trial(s), wall time. `from_json()` verifies and re-infers the loaded graph.\n\n"
            + md_table(["layers N"] + [f"`{k}`" for k in labels], rows))


def goal(res: dict) -> list[str]:
    row = next(r for r in res["rows"] if r["n"] == GOAL_LAYERS)
    worst = max(VIEWS, key=lambda k: row[k])
    measured = ", ".join(f"{k} {fmt_time(row[k])}" for k in ("summary()", "to_dot()", "to_json()"))
    return [f"summary(), to_dot(), to_json() of {GOAL_LAYERS:,} layers, each < {GOAL_SECONDS:g} s",
            measured, "**met**" if row[worst] < GOAL_SECONDS else "**MISSED**"]


if __name__ == "__main__":
    result = run()
    print(markdown(result))
    print(goal(result))
