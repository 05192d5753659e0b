"""torchvision's classification models through mg.from_torch, against PyTorch (needs
the torch-test extra: `make test-torch` makes .venv-torch):

    nice .venv-torch/bin/python benchmarks/torch_models.py [--only NAME ...] [--write]

Each model of ``torchvision.models.list_models(module=torchvision.models)`` is built
with random weights (seed 0) in eval mode, exported with ``torch.export`` on one
1 x 3 x 224 x 224 input, imported, compiled and run; its output is compared with
PyTorch's (``allclose`` with rtol 1e-4 and atol 1e-4 times the output's largest
magnitude). Each row goes to benchmarks/torch_models.json (rows of models run
again replace theirs); ``--write`` puts the table of all rows into docs/torch.md
between its markers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _common import write_between  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mlaxgraph as mg  # noqa: E402

ROWS = os.path.join(os.path.dirname(__file__), "torch_models.json")
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "torch.md")
BEGIN, END = "<!-- torchvision table: begin -->", "<!-- torchvision table: end -->"


def check(name: str) -> dict:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = model(x)
    expected = (expected[0] if isinstance(expected, tuple) else expected).numpy()
    row = {"model": name, "params": sum(p.numel() for p in model.parameters())}
    start = time.perf_counter()
    try:
        graph, params, state = mg.from_torch(model, (x,))
        row["import_s"] = time.perf_counter() - start
        compiled = mg.compile(graph)
        start = time.perf_counter()
        out, _ = compiled.apply(params, state, jnp.asarray(x.numpy()), inference_mode=True)
        out = np.asarray(jax.block_until_ready(out[0] if isinstance(out, tuple) else out))
        row["compile_run_s"] = time.perf_counter() - start
    except mg.MlaxGraphError as e:
        row["result"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return row
    except Exception as e:  # noqa: BLE001  (torch's or an unexpected failure, reported as such)
        row["result"] = f"{type(e).__name__} (not an mg error): {str(e).splitlines()[0][:140]}"
        return row
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(out - expected).max())
    ok = np.allclose(out, expected, rtol=1e-4, atol=1e-4 * scale)
    row["max_abs_err"] = err
    row["result"] = "match" if ok else f"MISMATCH (max abs error {err:.3g})"
    return row


def table(rows: list[dict]) -> str:
    ok = sum(r["result"] == "match" for r in rows)
    lines = [f"{ok} of {len(rows)} models import and match PyTorch ({100 * ok / max(1, len(rows)):.0f}%); "
             f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
             f"command: `nice .venv-torch/bin/python benchmarks/torch_models.py --write`.", "",
             "| model | params | result | max abs error | import s | compile + run s |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['result'].replace('|', '/')} | "
                     f"{r.get('max_abs_err', float('nan')):.2g} | {r.get('import_s', float('nan')):.1f} | "
                     f"{r.get('compile_run_s', float('nan')):.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--table", action="store_true", help="run nothing: the table of the rows kept")
    args = parser.parse_args()
    names = [] if args.table else args.only or torchvision.models.list_models(module=torchvision.models)
    known = json.load(open(ROWS)) if os.path.exists(ROWS) else {}
    for name in names:
        if name in args.skip:
            continue
        row = check(name)
        known[name] = row
        with open(ROWS, "w") as f:
            json.dump(known, f, indent=1)
        print(f"{name}: {row['result']} ({row.get('import_s', 0):.1f} s import, "
              f"{row.get('compile_run_s', 0):.1f} s compile + run)", flush=True)
        gc.collect()
        jax.clear_caches()
    order = torchvision.models.list_models(module=torchvision.models)
    text = table([known[n] for n in order if n in known])
    print(text)
    if args.write:
        write_between(DOC, BEGIN, END, text)


if __name__ == "__main__":
    main()
