"""LoRA on the scanned 12-block GPT-2 small: the train step's memory and time against
full fine-tuning, in one run.

GPT-2 small (``mg.models.gpt2()``, 124M weights, float32), compiled with
``scan_blocks=True`` (the 12 blocks one ``lax.scan``), trained with AdamW on
next-token cross-entropy, batch ``--batch`` of ``--seq`` tokens:

  full    every weight trains (``mg.train.Trainer(model, optax.adamw(...))``)
  lora    ``mg.lora(g, "h.*/attn/qkv", rank=8, alpha=16)`` (PEFT's default target for
          GPT-2, ``c_attn``), ``Trainer(..., trainable="**/*.lora_*")``: its ``init``
          keeps the frozen Linear layers of the scanned run per block
          (``mlaxgraph.compiler.indexed``)
  lora_stacked  the same Trainer given every frozen weight stacked (the model's own
          layout): each block's MLP kernels sliced out of the stack in the loop

For each, from XLA's ``memory_analysis`` of the compiled train step: the arguments'
bytes, the temporaries', and the peak (arguments + temporaries + outputs - aliased,
the train state being donated); the optimizer state's bytes; the adapters' bytes. Goals:
lora's peak at most 0.6x full's; its optimizer state only the adapters'; the base
weights never copied (lora's peak at most its weights' bytes + 5%, activations
included, at the default small batch); step time at most full's (interleaved rounds,
median of the per-round ratio and a bootstrap 95% CI).

QLoRA (``--qlora int8_weight_only,int4_weight_only,float8,int8``): the same adapters on
``mg.quantize(g, scheme)`` (every Linear, Embedding and attention layer), the step's
memory only, beside the float rows.

``--loss-chunk N`` adds the row ``lora_chunked``: ``lora`` with
``Trainer(..., loss_chunk=N)`` (the loss computed with the tied output head N positions
at a time, so the 50,257-wide logits and their gradient are never whole), its memory
and its step time against ``lora``'s in the same rounds.

``--remat full`` compiles both models with ``remat="full"`` (each block recomputed in
the backward pass).

Run: ``.venv/bin/python benchmarks/bench_lora.py [--batch 1] [--seq 64] [--rounds 5]
[--remat full] [--loss-chunk N] [--qlora SCHEMES] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import numpy as np
import optax

import mlaxgraph as mg
from _common import bootstrap_median_ci, median


def _bytes(tree) -> int:
    return int(sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)))


def _memory(trainer, ts, ids) -> dict:
    compiled = trainer.train_step.lower(ts, ids, ids).compile()
    m = compiled.memory_analysis()
    return {"argument_bytes": int(m.argument_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes), "alias_bytes": int(m.alias_size_in_bytes),
            "peak_bytes": int(m.argument_size_in_bytes + m.temp_size_in_bytes
                              + m.output_size_in_bytes - m.alias_size_in_bytes)}


def _qlora_memory(g, scheme: str, ids) -> dict:
    """The QLoRA step's memory: ``lora``'s adapters on ``mg.quantize(g, scheme)``."""
    graph = mg.lora(mg.quantize(g, scheme), "h.*/attn/qkv", rank=8, alpha=16)
    try:
        trainer = mg.train.Trainer(mg.compile(graph, scan_blocks=True), optax.adamw(1e-4),
                                   loss="softmax_cross_entropy", trainable="**/*.lora_*")
    except mg.GraphError as e:  # int8 or float8 activations: no usable adapter gradient
        return {"refused": str(e)}
    ts = jax.eval_shape(trainer.init_fn, jax.random.key(0))  # shapes: the memory needs no values
    return {**_memory(trainer, ts, ids), "param_bytes": _bytes(ts.params)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/lora_results.json")
    parser.add_argument("--qlora", type=lambda v: tuple(v.split(",")), default=())
    parser.add_argument("--remat", default=None, help="the models' remat (\"full\", \"dots\")")
    parser.add_argument("--loss-chunk", type=int, default=None,
                        help="adds lora_chunked: lora with Trainer(loss_chunk=N)")
    args = parser.parse_args()

    g = mg.models.gpt2()
    adapted_graph = mg.lora(g, "h.*/attn/qkv", rank=8, alpha=16)
    base = mg.compile(g, scan_blocks=True, remat=args.remat)
    adapted = mg.compile(adapted_graph, scan_blocks=True, remat=args.remat)
    ids = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, 50257)
    runs = {}
    # lora_stacked: the same Trainer given every frozen weight stacked (the model's own
    # layout) instead of its frozen Linear layers per block (compiler.indexed)
    rows = [("full", base, None), ("lora", adapted, "**/*.lora_*"),
            ("lora_stacked", adapted, "**/*.lora_*")]
    if args.loss_chunk:
        rows.append(("lora_chunked", adapted, "**/*.lora_*"))
    for label, model, trainable in rows:
        trainer = mg.train.Trainer(model, optax.adamw(1e-4), loss="softmax_cross_entropy",
                                   trainable=trainable,
                                   loss_chunk=args.loss_chunk if label == "lora_chunked" else None)
        ts = trainer.init(jax.random.key(0))
        if label == "lora_stacked":
            ts = ts.replace(params=model.stack_weights(model.unstack_weights(ts.params)[0])[0])
        row = _memory(trainer, ts, ids)
        row["param_bytes"] = _bytes(ts.params)
        row["opt_state_bytes"] = _bytes(ts.opt_state)
        row["adapter_bytes"] = _bytes(mg.lora_params(ts.params))
        runs[label] = {"trainer": trainer, "ts": ts, "row": row}
        ts, metrics = trainer.train_step(ts, ids, ids)   # compile and warm
        jax.block_until_ready(metrics["loss"])
        runs[label]["ts"] = ts
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.rounds):
        for label, run in runs.items():
            start = time.perf_counter()
            run["ts"], metrics = run["trainer"].train_step(run["ts"], ids, ids)
            jax.block_until_ready(metrics["loss"])
            times[label].append(time.perf_counter() - start)
    full, lora, stacked = runs["full"]["row"], runs["lora"]["row"], runs["lora_stacked"]["row"]
    ratios = [b / a for a, b in zip(times["full"], times["lora"])]
    low, high = bootstrap_median_ci(ratios)
    per_block = [a / b for a, b in zip(times["lora"], times["lora_stacked"])]
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {jax.device_count()} "
                   f"{jax.default_backend()} device(s), jax {jax.__version__}",
        "batch": args.batch, "seq": args.seq, "rounds": args.rounds, "remat": args.remat,
        "full": {**full, "step_s": median(times["full"])},
        "lora": {**lora, "step_s": median(times["lora"])},
        "lora_stacked": {**stacked, "step_s": median(times["lora_stacked"])},
        "lora_stacked_peak_over_weights": stacked["peak_bytes"] / stacked["param_bytes"],
        "per_block_step_ratio": median(per_block),
        "per_block_step_ratio_ci": list(bootstrap_median_ci(per_block)),
        "peak_ratio": lora["peak_bytes"] / full["peak_bytes"],
        "lora_peak_over_weights": lora["peak_bytes"] / lora["param_bytes"],
        "lora_temp_over_full_temp": lora["temp_bytes"] / full["temp_bytes"],
        "step_ratio": median(ratios), "step_ratio_ci": [low, high],
    }
    if args.loss_chunk:
        chunked = runs["lora_chunked"]["row"]
        over = [a / b for a, b in zip(times["lora_chunked"], times["lora"])]
        result.update({
            "loss_chunk": args.loss_chunk,
            "lora_chunked": {**chunked, "step_s": median(times["lora_chunked"])},
            "lora_chunked_peak_over_weights": chunked["peak_bytes"] / chunked["param_bytes"],
            "chunked_step_ratio": median(over),
            "chunked_step_ratio_ci": list(bootstrap_median_ci(over))})
    result["qlora"] = {scheme: _qlora_memory(g, scheme, ids) for scheme in args.qlora}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
