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
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import fmt_time, md_table, median

import jax
import jax.numpy as jnp
from jax import lax

import mlaxgraph as mg
from mlaxgraph import examples
from mlaxgraph.compiler.compile import INIT_COMPILER_OPTIONS as INIT_OPTIONS

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
    q = (jnp.einsum("bld,dhk->blhk", h, a["query"]["kernel"]) + a["query"]["bias"]) / math.sqrt(WIDTH // HEADS)
    k = jnp.einsum("bld,dhk->blhk", h, a["key"]["kernel"]) + a["key"]["bias"]
    v = jnp.einsum("bld,dhk->blhk", h, a["value"]["kernel"]) + a["value"]["bias"]
    w = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k), axis=-1)
    o = jnp.einsum("bqhk,hko->bqo", jnp.einsum("bhqs,bshk->bqhk", w, v), a["out"]["kernel"]) + a["out"]["bias"]
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
    scan = mg.compile(graph, scan_blocks=True)
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    row: dict = {"depth": depth}
    # init as model.init compiles it (its compiler options)
    row["init_scanned"], _ = compile_seconds(scan.init_fn, jax.random.key(0), options=INIT_OPTIONS)
    stacked, state = scan.init(jax.random.key(0))
    row["scanned"], _ = compile_seconds(grad_of(lambda p, x: scan.apply_fn(p, state, x)[0]), stacked, x)
    row["hand_scan"], _ = compile_seconds(grad_of(hand_scanned), stacked["block0..block" + str(depth - 1)], x)
    if unscanned:
        flat = mg.compile(graph)
        row["init_unscanned"], _ = compile_seconds(flat.init_fn, jax.random.key(0), options=INIT_OPTIONS)
        params, _ = flat.init(jax.random.key(0))
        row["unscanned"], _ = compile_seconds(grad_of(lambda p, x: flat.apply_fn(p, {}, x)[0]), params, x)
        row["hand_unrolled"], _ = compile_seconds(grad_of(hand_unrolled(depth)), params, x)
    return row


def step_seconds(compiled, args, repeat: int = 20) -> float:
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return median(times)


def train_and_remat(depth: int) -> dict:
    """Step time of the gradient, scanned vs unscanned, and remat's peak memory."""
    graph = chain(depth)
    x = jnp.ones((BATCH, LENGTH, WIDTH), jnp.float32)
    out: dict = {"depth": depth}
    flat = mg.compile(graph)
    params, _ = flat.init(jax.random.key(0))
    for label, options in [("unscanned", {}), ("scanned", {"scan_blocks": True}),
                           ("scanned_full", {"scan_blocks": True, "remat": "full"}),
                           ("scanned_dots", {"scan_blocks": True, "remat": "dots"})]:
        model = mg.compile(graph, **options)
        p, s = model.stack_weights(params, {})
        _, compiled = compile_seconds(grad_of(lambda q, x, model=model: model.apply_fn(q, {}, x)[0]), p, x)
        memory = compiled.memory_analysis()
        out[label] = {"step_s": step_seconds(compiled, (p, x)),
                      "temp_bytes": int(memory.temp_size_in_bytes),
                      "peak_bytes": int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                        + memory.output_size_in_bytes)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="2,4,8,16,32,64")
    parser.add_argument("--unscanned-max", type=int, default=32)
    parser.add_argument("--step-depth", type=int, default=32)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for depth in [int(d) for d in args.depths.split(",")]:
        row = run_depth(depth, depth <= args.unscanned_max)
        rows.append(row)
        print(json.dumps(row), flush=True)
    steps = train_and_remat(args.step_depth)
    print(json.dumps(steps), flush=True)
    result = {"rows": rows, "steps": steps, "devices": [str(d) for d in jax.devices()]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(report(result))


def report(result: dict) -> str:
    header = ["blocks", "scanned", "hand-written lax.scan", "unscanned", "hand-written unrolled",
              "init scanned", "init unscanned"]
    table = []
    for r in result["rows"]:
        def cell(key):
            return fmt_time(r[key]) if key in r else "–"
        table.append([str(r["depth"]), cell("scanned"), cell("hand_scan"), cell("unscanned"),
                      cell("hand_unrolled"), cell("init_scanned"), cell("init_unscanned")])
    lines = [md_table(header, table)]
    steps = result["steps"]
    lines.append("")
    lines.append(md_table(["compiled gradient, " + str(steps["depth"]) + " blocks", "step (median)",
                           "peak memory", "activations (XLA temp)"],
                          [[k, fmt_time(v["step_s"]), f"{v['peak_bytes'] / 2**20:.1f} MiB",
                            f"{v['temp_bytes'] / 2**20:.1f} MiB"]
                           for k, v in steps.items() if isinstance(v, dict)]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
