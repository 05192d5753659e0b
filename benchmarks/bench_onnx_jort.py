"""ONNX files on jaxonnxruntime (google/jaxonnxruntime), the other JAX runtime of ONNX, beside
section 10's mlaxgraph and onnxruntime: the zoo's ResNet-50 (batch 8) and GPT-2 small
(1 x 128 tokens) written by ``graph.to_onnx`` at the oldest opset each can be written at (19 and 20:
jaxonnxruntime implements most operators' versions up to about 19), per call and import + compile time.

jaxonnxruntime pins its own dependencies, so it lives in its own environment
(``make bench-jort`` makes ``.venv-jort``: ``pip install jaxonnxruntime``, which keeps
jax 0.10.2). This script runs in both: in ``.venv`` it writes the files, times
mlaxgraph, then runs itself under ``.venv-jort`` (``--peer FILE INPUTS``) for
jaxonnxruntime's times, one system after the other (two processes: not interleaved).
jaxonnxruntime's function (``call_onnx.call_onnx_model``) is jitted with its weights as
an argument, as a user would.

Run: ``.venv/bin/python benchmarks/bench_onnx_jort.py [--calls N] [--jort .venv-jort/bin/python]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time


def _peer(path: str, inputs: str, calls: int) -> None:
    import jax
    import numpy as np
    import onnx
    from jaxonnxruntime import call_onnx

    data = np.load(inputs)
    xs = [data[k] for k in sorted(data.files)]
    start = time.perf_counter()
    model = onnx.load(path)
    fn, params = call_onnx.call_onnx_model(model, xs)
    t_import = time.perf_counter() - start
    jitted = jax.jit(lambda params, xs: fn(model_params=params, inputs=xs))
    start = time.perf_counter()
    out = jax.block_until_ready(jitted(params, xs))
    t_compile = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(jitted(params, xs))
        times.append(time.perf_counter() - start)
    first = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
    np.save(inputs + ".out.npy", first)
    print(json.dumps({"import": t_import, "compile": t_compile, "times": times}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--jort", default=".venv-jort/bin/python")
    parser.add_argument("--peer", nargs=2)
    args = parser.parse_args()
    if args.peer:
        _peer(*args.peer, args.calls)
        return
    import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
    import jax
    import numpy as np
    from _common import fmt_time, md_table, median

    import mlaxgraph as mg

    # the oldest opset each file can be written at (GPT-2's Gelu is an operator from 20)
    cases = [("ResNet-50, batch 8", mg.models.resnet50, 19,
              lambda rng: [rng.normal(size=(8, 224, 224, 3)).astype(np.float32)]),
             ("GPT-2 small, 1 x 128 tokens", mg.models.gpt2, 20,
              lambda rng: [rng.integers(0, 50257, size=(1, 128)).astype(np.int32)])]
    rng = np.random.default_rng(0)
    scratch = tempfile.TemporaryDirectory()  # removed when this returns
    folder = pathlib.Path(scratch.name)
    rows = []
    for name, make, opset, example in cases:
        graph = make()
        params, state = mg.compile(graph).init(jax.random.key(0))
        path = folder / "model.onnx"
        graph.to_onnx(path, params, state, opset=opset)
        del params, state
        xs = example(rng)
        inputs = str(folder / "inputs.npz")
        np.savez(inputs, *xs)
        bound = {str(d): x.shape[i] for spec, x in zip(graph.input_specs, xs)
                 for i, d in enumerate(spec.shape) if not isinstance(d, int)}
        start = time.perf_counter()
        back, p, s = mg.from_onnx(path, dims=bound)
        t_import = time.perf_counter() - start
        start = time.perf_counter()
        model = mg.compile(back)
        want = jax.block_until_ready(model.apply(p, s, *xs, inference_mode=True)[0])
        t_compile = time.perf_counter() - start
        ours = []
        for _ in range(args.calls):
            start = time.perf_counter()
            jax.block_until_ready(model.apply(p, s, *xs, inference_mode=True)[0])
            ours.append(time.perf_counter() - start)
        run = subprocess.run([args.jort, __file__, "--peer", str(path), inputs, "--calls",
                              str(args.calls)], capture_output=True, text=True)
        if run.returncode:
            rows.append([name, fmt_time(t_import), fmt_time(t_compile), fmt_time(median(ours)),
                         "failed: " + (run.stderr.strip().splitlines() or ["?"])[-1][:160],
                         "", "", "", ""])
            continue
        peer = json.loads(run.stdout.strip().splitlines()[-1])
        error = float(np.max(np.abs(np.load(inputs + ".out.npy") - np.asarray(want))))
        rows.append([name, fmt_time(t_import), fmt_time(t_compile), fmt_time(median(ours)),
                     fmt_time(peer["import"]), fmt_time(peer["compile"]),
                     fmt_time(median(peer["times"])),
                     f"{median(ours) / median(peer['times']):.2f}", f"{error:.1e}"])
        print(rows[-1], file=sys.stderr, flush=True)
    print(md_table(["model", "import (mg)", "compile + 1st call (mg)", "per call (mg)",
                    "import (jort)", "jit + 1st call (jort)", "per call (jort)",
                    "mg / jort per call", "max abs diff"], rows))


if __name__ == "__main__":
    main()
