"""The Trainer's step compiled with XLA options against XLA's defaults
(``Trainer(..., compiler_options={})``), on the benchmark models and two zoo models
(GPT-2 small, scanned, batch 2 x 64 tokens; ResNet-50, batch 8 at 64 x 64), in the same
process: per model, the step time ratio (median of per-round ratios of interleaved
rounds, 95% CI of the median), XLA's peak memory (``memory_analysis``: arguments +
temporaries + outputs - aliased) and the copies in the step's entry computation. Both
steps start from the same train state; their losses are compared at the end.

``gpt2_lora`` (not in the default list): section 7's LoRA step on the scanned GPT-2.

``--options`` is a JSON mapping of the options to measure; by default the Trainer's
own choice (region-based copy analysis for a model without convolutions), which for a
convolutional model is XLA's defaults, so ``--options`` names them to measure them there.
``--base trainer`` measures against the Trainer's own choice instead of XLA's defaults,
with ``--options`` added to that choice.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_step_options.py [--models mlp,gpt2]
[--options '{"xla_cpu_copy_insertion_use_region_analysis": true}'] [--base trainer]
[--rounds 30]``.
"""

from __future__ import annotations

import argparse
import json
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import models_mg
import models_spec as S
import optax
from _common import bootstrap_median_ci, median

import mlaxgraph as mg

ZOO = ("gpt2", "gpt2_lora", "resnet50")


def _model(name: str):
    """(compiled model, inputs, targets, optimizer, trainable) of a benchmark or zoo
    model; ``gpt2_lora``: section 7's LoRA (``h.*/attn/qkv``, rank 8), 1 x 64 tokens."""
    if name in ("gpt2", "gpt2_lora"):
        lora = name == "gpt2_lora"
        ids = jax.random.randint(jax.random.key(1), (1 if lora else 2, 64), 0, 50257)
        graph = mg.models.gpt2()
        graph = mg.lora(graph, "h.*/attn/qkv", rank=8, alpha=16) if lora else graph
        return (mg.compile(graph, scan_blocks=True), ids, ids, optax.adamw(1e-4),
                "**/*.lora_*" if lora else None)
    if name == "resnet50":
        x = jax.random.normal(jax.random.key(1), (8, 64, 64, 3))
        return (mg.compile(mg.models.resnet50()), x, jnp.zeros((8,), jnp.int32),
                optax.adamw(1e-4), None)
    x, y = S.batch(S.SPECS[name])
    return (mg.compile(models_mg.GRAPHS[name]()), jnp.asarray(x), jnp.asarray(y),
            S.optimizer(), None)


def _peak(compiled) -> int:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes)


def _copies(compiled) -> int:
    text = compiled.as_text()
    return sum(" copy(" in line for line in text[text.index("ENTRY"):].splitlines())


def measure(name: str, options, rounds: int, base: str = "xla") -> dict:
    model, x, y, tx, trainable = _model(name)
    runs = {}
    if base == "trainer":
        from mlaxgraph.compiler.xla_options import step_compiler_options

        own = step_compiler_options(model.program)
        pairs = (("xla", own), ("options", {**own, **(options or {})}))
    else:
        pairs = (("xla", {}), ("options", options))
    for label, opts in pairs:
        trainer = mg.train.Trainer(model, tx, loss="softmax_cross_entropy", trainable=trainable,
                                   compiler_options=opts)
        ts = trainer.init(jax.random.key(0))
        compiled = trainer.train_step.lower(ts, x, y).compile()
        runs[label] = {"trainer": trainer, "ts": ts, "options": trainer.compiler_options,
                       "peak": _peak(compiled), "copies": _copies(compiled), "times": []}
    first = [_one(run, x, y) for run in runs.values()]   # compiled; one step each
    steps = 1 if name in ZOO else max(1, int(0.02 / first[0]))
    for run in runs.values():
        _one(run, x, y, steps)
    ratios = []
    for r in range(rounds):
        order = ("xla", "options") if r % 2 == 0 else ("options", "xla")
        got = {label: _one(runs[label], x, y, steps) for label in order}
        for label, t in got.items():
            runs[label]["times"].append(t)
        ratios.append(got["options"] / got["xla"])
    low, high = bootstrap_median_ci(ratios)
    same = bool(runs["xla"]["loss"] == runs["options"]["loss"])  # the same steps taken
    return {"model": name, "options": runs["options"]["options"],
            "step_xla_s": median(runs["xla"]["times"]),
            "step_options_s": median(runs["options"]["times"]),
            "ratio": median(ratios), "ci": [low, high],
            "peak_xla": runs["xla"]["peak"], "peak_options": runs["options"]["peak"],
            "copies_xla": runs["xla"]["copies"], "copies_options": runs["options"]["copies"],
            "same_loss": same}


def _one(run: dict, x, y, steps: int = 1) -> float:
    """Seconds per step over ``steps`` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        run["ts"], metrics = run["trainer"].train_step(run["ts"], x, y)
    run["loss"] = jax.block_until_ready(metrics["loss"])
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=lambda v: tuple(v.split(",")),
                   default=S.MODELS + ("tiny_mlp", "gpt2", "resnet50"))
    p.add_argument("--options", type=json.loads, default=None)
    p.add_argument("--base", choices=("xla", "trainer"), default="xla")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    base = "XLA's defaults" if args.base == "xla" else "the Trainer's options"
    print(f"| model | options | step, {base} | step, options | ratio (95% CI) | "
          "peak memory, base -> options | copies | same loss |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        rounds = min(args.rounds, 8) if name in ZOO else args.rounds
        r = measure(name, args.options, rounds, args.base)
        print(f"| {name} | `{json.dumps(r['options'])}` | {r['step_xla_s'] * 1e3:.3f} ms | "
              f"{r['step_options_s'] * 1e3:.3f} ms | {r['ratio']:.3f} ({r['ci'][0]:.3f} – "
              f"{r['ci'][1]:.3f}) | {r['peak_xla']:,} -> {r['peak_options']:,} B "
              f"(x{r['peak_options'] / r['peak_xla']:.3f}) | {r['copies_xla']} -> "
              f"{r['copies_options']} | {'yes' if r['same_loss'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
