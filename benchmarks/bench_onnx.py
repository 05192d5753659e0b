"""ONNX models on mlaxgraph against onnxruntime: ResNet-50 (batch 8, 224 x 224) and
GPT-2 small (batch 1, 128 tokens), per call, plus the import and compile time.

The models are the zoo's (``mg.models.resnet50()``, ``mg.models.gpt2()``, random
weights) written as ONNX by ``graph.to_onnx`` (torch is not installed here, so no
``torch.onnx.export`` files): onnxruntime runs the file, mlaxgraph reads it back with
``mg.from_onnx`` (GPT-2's symbolic dims bound with ``dims=``) and runs it with
``mg.compile``. Both in one process, on the CPU, in interleaved rounds (each round
calls each runtime ``calls`` times, in a random order; mlaxgraph's outputs waited on
with ``block_until_ready``); the ratio mlaxgraph / onnxruntime is taken per round.

  import    ``mg.from_onnx(path)`` (parse, fold, type the graph) against
            ``onnxruntime.InferenceSession(path)`` (parse, optimize the graph)
  compile   ``mg.compile`` + the first ``apply`` (trace, lower, XLA compile, run)
  per call  the median of the calls after the first

Run alone: ``.venv/bin/python benchmarks/bench_onnx.py [--quick]``.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import tempfile
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
import jax
import numpy as np
from _common import fmt_time, md_table, median, quantiles

import mlaxgraph as mg


def _cases():
    yield ("ResNet-50, batch 8", lambda: mg.models.resnet50(),
           lambda rng: [rng.normal(size=(8, 224, 224, 3)).astype(np.float32)])
    yield ("GPT-2 small, 1 x 128 tokens", lambda: mg.models.gpt2(),
           lambda rng: [rng.integers(0, 50257, size=(1, 128)).astype(np.int32)])


def run(quick: bool = False) -> str:
    import onnxruntime as ort

    rounds, calls = (2, 2) if quick else (5, 3)
    rng = np.random.default_rng(0)
    rows = []
    scratch = tempfile.TemporaryDirectory()  # removed when run() returns
    folder = pathlib.Path(scratch.name)
    for name, make, example in _cases():
        graph = make()
        params, state = mg.compile(graph).init(jax.random.key(0))
        path = folder / "model.onnx"
        graph.to_onnx(path, params, state)
        size = path.stat().st_size
        del params, state
        xs = example(rng)
        start = time.perf_counter()
        bound = {str(d): x.shape[i] for spec, x in zip(graph.input_specs, xs)
                 for i, d in enumerate(spec.shape) if not isinstance(d, int)}
        back, p, s = mg.from_onnx(path, dims=bound)
        t_import = time.perf_counter() - start
        start = time.perf_counter()
        session = ort.InferenceSession(str(path))
        t_ort_import = time.perf_counter() - start
        feeds = {i.name: x for i, x in zip(session.get_inputs(), xs)}
        start = time.perf_counter()
        model = mg.compile(back)
        first, _ = model.apply(p, s, *xs, inference_mode=True)
        jax.block_until_ready(first)
        t_compile = time.perf_counter() - start
        start = time.perf_counter()
        want = session.run(None, feeds)[0]
        t_ort_first = time.perf_counter() - start
        error = float(np.max(np.abs(np.asarray(first) - want)))

        def ours(model=model, p=p, s=s, xs=xs):
            out, _ = model.apply(p, s, *xs, inference_mode=True)
            jax.block_until_ready(out)

        def theirs(session=session, feeds=feeds):
            session.run(None, feeds)

        times: dict[str, list[float]] = {"mlaxgraph": [], "onnxruntime": []}
        ratios = []
        for _ in range(rounds):
            order = list(times)
            random.shuffle(order)
            per_round: dict[str, list[float]] = {k: [] for k in times}
            for key in order:
                fn = ours if key == "mlaxgraph" else theirs
                for _ in range(calls):
                    start = time.perf_counter()
                    fn()
                    per_round[key].append(time.perf_counter() - start)
            for key in times:
                times[key] += per_round[key]
            ratios.append(median(per_round["mlaxgraph"]) / median(per_round["onnxruntime"]))
        low, high = quantiles(ratios)
        rows.append([name, f"{size / 2**20:.0f} MiB", fmt_time(t_import), fmt_time(t_ort_import),
                     fmt_time(t_compile), fmt_time(t_ort_first),
                     fmt_time(median(times["mlaxgraph"])), fmt_time(median(times["onnxruntime"])),
                     f"{median(ratios):.2f} ({low:.2f} - {high:.2f})", f"{error:.1e}"])
        print(rows[-1], flush=True)
    return md_table(["model", "file", "import (mg)", "session (ort)", "compile + 1st call (mg)",
                     "1st call (ort)", "per call (mg)", "per call (ort)",
                     "ratio mg / ort (IQR)", "max abs diff"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))
