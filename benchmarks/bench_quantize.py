"""Quantization of GPT-2 small (``mg.models.gpt2()``, random weights, seed 0): weight
bytes as stored, logits' error against float32, next-token agreement, per-call time,
and what XLA CPU makes of the int8 dot.

For each scheme (``int8``, ``int8`` with static activation scales calibrated on
``CALIBRATION`` other random prompts (``quantize_weights(..., calibration=...)``),
``int8`` and ``int8_weight_only`` with GPTQ rounding (``method="gptq"``) from
``GPTQ_BATCHES`` batches of ``GPTQ_BATCH`` other random prompts (per-call activation
scales), ``int8_weight_only``, ``int4_weight_only`` with groups of 128 and of 32, ``float8``;
default targets: every Linear, Embedding and attention):

  bytes      the cost table's ``weight_bytes`` (every weight as stored) over float32's
  rel err    ``||logits_q - logits_f32|| / ||logits_f32||`` over ``PROMPTS`` random
             prompts of ``LENGTH`` tokens (ids uniform in the vocabulary)
  agree      the share of positions whose argmax (next token) equals float32's
  wide       rel err and agree again over ``WIDE`` other random prompts (``WIDE x
             LENGTH`` positions: one position is 0.1% of agreement, against 0.8%
             over the ``PROMPTS``)
  per call   median wall time of ``model.apply(params, state, ids, inference_mode=True)``
             (jitted, batch 1, ``LENGTH`` tokens) over ``REPEATS`` calls, interleaved
             with float32's calls, as a ratio to float32's median in the same run

and, from the optimized HLO of the int8, int8_weight_only and float8 models
(``hlo_by_layer``), the operations of ``h.0/mlp.c_fc``: whether the dot is ``s8 x s8
-> s32`` as XLA runs it, or its operands are converted first.

Run: ``nice python benchmarks/bench_quantize.py [NAME ...]`` (names: only the rows
whose name starts with one of them, e.g. ``int8``).
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp

import mlaxgraph as mg

PROMPTS, LENGTH, REPEATS, CALIBRATION, WIDE = 4, 32, 15, 4, 32
GPTQ_BATCHES, GPTQ_BATCH = 4, 32  # 4,096 tokens, none of them in the prompts measured
SCHEMES = [("int8", {}), ("int8", {"calibrated": True}), ("int8", {"gptq": True}),
           ("int8_weight_only", {}), ("int8_weight_only", {"gptq": True}),
           ("int4_weight_only", {}), ("int4_weight_only", {"group_size": 32}), ("float8", {})]


def _timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def main() -> None:
    g = mg.models.gpt2()
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    prompts = jax.random.randint(jax.random.key(1), (PROMPTS, LENGTH), 0, 50257)
    one = prompts[:1]
    base = model.cost_table(batch=1, seq=LENGTH, xla=False).weight_bytes
    ref = model.apply(params, state, prompts, inference_mode=True)[0]
    wide = jax.random.randint(jax.random.key(2), (WIDE, LENGTH), 0, 50257)
    wide_ref = model.apply(params, state, wide, inference_mode=True)[0]
    print(f"float32: {base / 2**20:,.1f} MiB of weights")
    print(f"{'scheme':28s} {'bytes':>8s} {'rel err':>9s} {'agree':>7s} {'per call':>9s}  "
          f"wide: rel err, agree")
    calibration = [jax.random.randint(jax.random.key(10 + i), (1, LENGTH), 0, 50257)
                   for i in range(CALIBRATION)]
    for scheme, kw in SCHEMES:
        name = scheme + "".join(f" (group {v})" if k == "group_size" else f" ({k})"
                                for k, v in kw.items())
        if sys.argv[1:] and not name.startswith(tuple(sys.argv[1:])):
            continue
        calibrated, gptq = kw.pop("calibrated", False), kw.pop("gptq", False)
        qg = mg.quantize(g, scheme, **kw)
        qmodel = mg.compile(qg)
        start = time.perf_counter()
        if gptq:
            batches = [jax.random.randint(jax.random.key(100 + i), (GPTQ_BATCH, LENGTH), 0,
                                          50257) for i in range(GPTQ_BATCHES)]
            qp, qs = mg.quantize_weights(qg, params, state, calibration=batches, method="gptq")
        else:
            qp, qs = mg.quantize_weights(qg, params, state,
                                         calibration=calibration if calibrated else None)
        made = time.perf_counter() - start
        stored = qmodel.cost_table(batch=1, seq=LENGTH, xla=False).weight_bytes
        logits = qmodel.apply(qp, qs, prompts, inference_mode=True)[0]
        err = float(jnp.linalg.norm(logits - ref) / jnp.linalg.norm(ref))
        agree = float(jnp.mean(logits.argmax(-1) == ref.argmax(-1)))
        wide_out = qmodel.apply(qp, qs, wide, inference_mode=True)[0]
        wide_err = float(jnp.linalg.norm(wide_out - wide_ref) / jnp.linalg.norm(wide_ref))
        wide_agree = float(jnp.mean(wide_out.argmax(-1) == wide_ref.argmax(-1)))
        times_q, times_f = [], []
        for fn in (lambda: qmodel.apply(qp, qs, one, inference_mode=True)[0],
                   lambda: model.apply(params, state, one, inference_mode=True)[0]):
            jax.block_until_ready(fn())  # compile
        for _ in range(REPEATS):
            times_q.append(_timed(lambda: qmodel.apply(qp, qs, one, inference_mode=True)[0]))
            times_f.append(_timed(lambda: model.apply(params, state, one, inference_mode=True)[0]))
        q_med, f_med = statistics.median(times_q), statistics.median(times_f)
        print(f"{name:28s} {stored / base:8.3f} {err:9.4f} {agree:7.3f} "
              f"{q_med / f_med:9.2f}  ({q_med * 1e3:.1f} ms vs {f_med * 1e3:.1f} ms; "
              f"quantize_weights {made:.1f} s)  wide: {wide_err:.4f}, {wide_agree:.3f}")
        if scheme in ("int8", "int8_weight_only", "float8"):
            hlo = qmodel.hlo_by_layer(one, inference_mode=True)
            print(f"  optimized HLO of h.0/mlp.c_fc ({scheme}):")
            for op in hlo["h.0/mlp.c_fc"]:
                print("   ", str(op)[:150])


if __name__ == "__main__":
    main()
