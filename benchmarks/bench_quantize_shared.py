"""One Quantize node for the layers that read one value: a Llama in ``"int8"`` whose
gate and up projections read one cast of their shared input, against the same graph
with a cast each (as ``mg.quantize`` made it before), in interleaved rounds.

Model: ``mg.models.llama`` with 4 layers, hidden 512, MLP 1,376, 8 heads (2 key/value
heads), vocabulary 8,192, random weights (absmax); one call is a forward pass in
inference mode over ``--batch`` x ``--seq`` tokens. Each round times ``--calls`` calls
of each form in a random order; the table gives the medians per call and the median of
the per-round ratios (shared / a cast each) with a bootstrap 95% CI. The two forms'
logits are checked equal.

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/bench_quantize_shared.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import time
from unittest import mock

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
import jax
import numpy as np
from _common import bootstrap_median_ci, fmt_time, md_table, median

import mlaxgraph as mg
from mlaxgraph.ir.surgery import layer_paths

CONFIG = {"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1376,
          "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192,
          "max_position_embeddings": 256}


class _NoSharing(dict):
    """The rule's memo of casts, forgetting each: every layer gets a cast of its own."""

    def __setitem__(self, key, value):
        pass


def _casts(graph) -> int:
    return sum(node.op.op_name == "quantize" for _, node in layer_paths(graph))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    g = mg.models.llama(CONFIG)
    params, state = mg.compile(g).init(jax.random.key(0))
    shared = mg.quantize(g, "int8")
    rule = importlib.import_module("mlaxgraph.adapters.quantize")._Quantize
    with mock.patch.object(rule, "prepare", lambda self, graph: _NoSharing()):
        each = mg.quantize(g, "int8")
    weights = {"a cast each": mg.quantize_weights(each, params, state),
               "one shared cast": mg.quantize_weights(shared, params, state)}
    ids = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, CONFIG["vocab_size"])
    forms = {"a cast each": mg.compile(each), "one shared cast": mg.compile(shared)}
    outs = {name: np.asarray(m.apply(*weights[name], ids, inference_mode=True)[0])
            for name, m in forms.items()}
    assert np.array_equal(*outs.values()), "the two forms' logits differ"
    times: dict[str, list[float]] = {name: [] for name in forms}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(forms)
        rng.shuffle(order)
        for name in order:
            model, (qp, qs) = forms[name], weights[name]
            start = time.perf_counter()
            for _ in range(args.calls):
                model.apply(qp, qs, ids, inference_mode=True)[0].block_until_ready()
            times[name].append((time.perf_counter() - start) / args.calls)
    ratios = [b / a for a, b in zip(times["a cast each"], times["one shared cast"])]
    lo, hi = bootstrap_median_ci(ratios)
    rows = [[name, _casts(each if name == "a cast each" else shared), fmt_time(median(t))]
            for name, t in times.items()]
    print(md_table(["form", "Quantize nodes", "per call (median)"], rows))
    print(f"\nshared / a cast each: {median(ratios):.3f} (95% CI {lo:.3f} - {hi:.3f}); "
          f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
