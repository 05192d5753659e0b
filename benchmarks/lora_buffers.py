"""Which buffers make the scanned LoRA train step's temporaries: XLA's buffer assignment
of the compiled step, its largest allocations and the values that share each one.

GPT-2 small, ``scan_blocks=True``, ``mg.lora(g, "h.*/attn/qkv", rank=8, alpha=16)``, the
``Trainer`` step of ``bench_lora.py`` (AdamW, ``trainable="**/*.lora_*"``), batch 1 x
``--seq`` tokens, with ``loss_chunk=--loss-chunk`` and each ``--remat`` given. For each:
XLA's ``memory_analysis`` (arguments, temporaries, peak over the weights) and, from the
buffer assignment XLA writes with ``--xla_dump_to``, the ``--top`` largest allocations
that are neither parameters nor outputs (the temporaries), each with its size, and the
instructions whose values live in it (name, shape, the op name JAX gave it). It runs on
whatever backend JAX has (``JAX_PLATFORMS=cuda`` on a GPU machine).

``--options`` compares XLA option sets for the step (each a JSON object given to
``Trainer(compiler_options=...)``; ``{}`` is mlaxgraph's default) and ``--rounds N``
times the steps, interleaved, the ratio to the first row's per round.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/lora_buffers.py [--seq 64]
[--loss-chunk 16] [--remat none,full] [--top 12] [--options '{}' '{...}'] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

DUMP = tempfile.mkdtemp(prefix="lora-buffers-")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import optax  # noqa: E402
from _common import bootstrap_median_ci  # noqa: E402

import mlaxgraph as mg  # noqa: E402
from mlaxgraph.compiler.xla_options import step_compiler_options  # noqa: E402

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(r"^\s+value: <\d+ (\S+) @\S*> \(size=(\d+),offset=(\d+)\): (\S+)")
_OP_NAME = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*op_name="([^"]*)"')


def _op_names(hlo_text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in map(_OP_NAME.match, hlo_text.splitlines()) if m}


def temporaries(assignment: str, top: int) -> list[tuple[int, int, list[tuple[str, str, int]]]]:
    """The temporaries' largest pieces: in each allocation that holds no parameter, no
    output and no constant, the values grouped by their offset in it, as
    (bytes, offset, [(instruction, shape, bytes) ...]), largest first."""
    pieces: dict[tuple[int, int], list[tuple[str, str, int]]] = {}
    allocation = None
    for line in assignment.splitlines():
        m = _ALLOCATION.match(line)
        if m:
            flags = m.group(3)
            temporary = not any(k in flags for k in ("parameter", "output", "constant"))
            allocation = int(m.group(1)) if temporary else None
        elif allocation is not None and (v := _VALUE.match(line)):
            pieces.setdefault((allocation, int(v.group(3))), []).append(
                (v.group(1), v.group(4), int(v.group(2))))
    found = [(max(n for _, _, n in values), offset, values)
             for (_, offset), values in pieces.items()]
    return sorted(found, key=lambda a: -a[0])[:top]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--loss-chunk", type=int, default=16)
    parser.add_argument("--remat", default="none,full")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--options", nargs="*", default=["{}"],
                        help="XLA option sets (JSON objects) for the step, compared in one run")
    parser.add_argument("--full-options", nargs="*", default=[],
                        help="option sets for full fine-tuning's step (remat none), timed beside")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved timed steps")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()}")
    g = mg.lora(mg.models.gpt2(), "h.*/attn/qkv", rank=8, alpha=16)
    ids = jax.random.randint(jax.random.key(1), (1, args.seq), 0, 50257)
    runs = {}
    configs = [(remat, text, "**/*.lora_*") for remat in args.remat.split(",") for text in args.options]
    configs += [("none", text, None) for text in args.full_options]
    for remat, text, trainable in configs:
        model = mg.compile(g, scan_blocks=True, remat=None if remat == "none" else remat)
        # the given options on top of mlaxgraph's own for the step
        options = {**step_compiler_options(model.program), **json.loads(text)}
        shutil.rmtree(DUMP, ignore_errors=True)
        try:
            trainer = mg.train.Trainer(model, optax.adamw(1e-4), loss="softmax_cross_entropy",
                                       trainable=trainable, loss_chunk=args.loss_chunk,
                                       compiler_options=options)
        except mg.ConfigError as e:
            print(f"\n== {text}: {e}")
            continue
        ts = trainer.init(jax.random.key(0))
        compiled = trainer.train_step.lower(ts, ids, ids).compile()
        m = compiled.memory_analysis()
        weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(ts.params))
        peak = (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
                - m.alias_size_in_bytes)
        label = f"{'lora' if trainable else 'full'} remat={remat} options={text}"
        print(f"\n== {label}, loss_chunk={args.loss_chunk}, {args.seq} tokens: weights "
              f"{weights / 1e6:.1f} MB, arguments {m.argument_size_in_bytes / 1e6:.1f} MB, "
              f"temporaries {m.temp_size_in_bytes / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB "
              f"({peak / weights:.3f} x weights)")
        # the step is the largest program compiled since the folder was emptied
        assignments = glob.glob(os.path.join(DUMP, "*buffer-assignment.txt"))
        if assignments:
            path = max(assignments, key=os.path.getsize)
            hlo = path.replace("-buffer-assignment.txt", ".txt")
            ops = _op_names(open(hlo).read()) if os.path.exists(hlo) else {}
            for size, offset, values in temporaries(open(path).read(), args.top):
                print(f"{size / 1e6:9.2f} MB at offset {offset}")
                for name, shape, _ in sorted(values, key=lambda v: -v[2])[:6]:
                    print(f"            {name:<40} {shape:<28} {ops.get(name, '')[-90:]}")
        ts, metrics = trainer.train_step(ts, ids, ids)
        jax.block_until_ready(metrics["loss"])
        runs[label] = [trainer, ts, []]
    for _ in range(args.rounds):
        for run in runs.values():
            start = time.perf_counter()
            run[1], metrics = run[0].train_step(run[1], ids, ids)
            jax.block_until_ready(metrics["loss"])
            run[2].append(time.perf_counter() - start)
    if args.rounds:
        first = next(iter(runs.values()))[2]
        print(f"\nstep, median of {args.rounds} interleaved rounds (ratio to the first row's, per round):")
        for label, run in runs.items():
            ratios = [b / a for a, b in zip(first, run[2])]
            low, high = bootstrap_median_ci(ratios)
            print(f"  {label}: {statistics.median(run[2]) * 1e3:.2f} ms "
                  f"({statistics.median(ratios):.3f}; {low:.3f} - {high:.3f})")


if __name__ == "__main__":
    main()
