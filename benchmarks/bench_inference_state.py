"""Inference per call on models with state: the state a call leaves unchanged returned
as outputs of the XLA program (what ``model.apply`` does), against returned as the
arrays given.

At inference a BatchNorm's running statistics pass through unchanged. As outputs of
the jitted program, XLA copies each into a new buffer on every call (and JAX wraps
each in a new array). Variants, timed in interleaved rounds in one process, each call
followed by ``block_until_ready``:

  mlaxgraph       out, state = model.apply(params, state, x, inference_mode=True)
                  (every state leaf an output of the program)
  forwarded       the same function jitted so that each state leaf it returns unchanged
                  (the traced input itself) is not an output; the arrays given are
                  put back in Python
  outputs only    jax.jit of model.apply_fn returning the outputs alone, as a
                  hand-written inference function that returns no state
  one leaf        outputs only, plus one state leaf (one copy in the program)

Ratios to ``mlaxgraph``: median of the per-round ratios with a bootstrap 95% CI.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_inference_state.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median

import jax

import mlaxgraph as mg


#: name -> (graph maker, input shape, calls per round)
MODELS = {
    "ResNet-18, width 8, 32x32, batch 1": (
        lambda: mg.models.resnet18(num_classes=10, image_size=32, width=8), (1, 32, 32, 3), 100),
    "ResNet-50, 224x224, batch 1": (mg.models.resnet50, (1, 224, 224, 3), 4),
}


def measure(name: str, rounds: int) -> dict:
    make, shape, calls = MODELS[name]
    model = mg.compile(make())
    params, state = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), shape)
    fn = model.apply_fn
    forwarding = jax.jit(lambda p, s, x: _unchanged_as_none(fn(p, s, x, inference_mode=True), s))
    outputs_only = jax.jit(lambda p, s, x: fn(p, s, x, inference_mode=True)[0])
    one_leaf = jax.jit(lambda p, s, x: (fn(p, s, x, inference_mode=True)[0], jax.tree.leaves(s)[0]))

    def forwarded():
        out, new = forwarding(params, state, x)
        return out, jax.tree.map(lambda n, o: o if n is None else n, new, state,
                                 is_leaf=lambda v: v is None)

    variants = {
        "mlaxgraph": lambda: model.apply(params, state, x, inference_mode=True),
        "forwarded": forwarded,
        "outputs only": lambda: outputs_only(params, state, x),
        "one leaf": lambda: one_leaf(params, state, x),
    }
    for f in variants.values():
        for _ in range(3):
            jax.block_until_ready(f())
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]
        for k in order:
            f = variants[k]
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(f())
            times[k].append((time.perf_counter() - start) / calls)
    leaves = len(jax.tree.leaves(state))
    result = {"name": name, "state leaves": leaves, "median": {k: median(v) for k, v in times.items()}}
    for k in list(variants)[1:]:
        ratios = [a / b for a, b in zip(times[k], times["mlaxgraph"])]
        result[k] = (median(ratios), *bootstrap_median_ci(ratios))
    return result


def _unchanged_as_none(result, state):
    out, new = result
    return out, jax.tree.map(lambda n, o: None if n is o else n, new, state)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    rows = []
    for name in MODELS:
        r = measure(name, args.rounds)
        m = r["median"]
        rows.append([name, str(r["state leaves"]), fmt_time(m["mlaxgraph"])]
                    + [f"{fmt_time(m[k])}: {r[k][0]:.3f} ({r[k][1]:.3f} – {r[k][2]:.3f})"
                       for k in ("forwarded", "outputs only", "one leaf")])
        print(rows[-1], flush=True)
    print(md_table(["model", "state leaves", "mlaxgraph", "forwarded / mlaxgraph",
                    "outputs only / mlaxgraph", "one leaf / mlaxgraph"], rows))


if __name__ == "__main__":
    main()
