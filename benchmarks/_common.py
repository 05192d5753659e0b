"""Shared helpers of the benchmark scripts: import path, statistics, formatting.

The scripts run from a checkout with ``.venv/bin/python benchmarks/<script>.py``; the
repository root is put on ``sys.path`` so they work whether or not mlaxgraph is
installed in the venv (``make bench`` installs it in editable mode first).
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# CPU only; avoids probing for accelerators (and the warnings that come with it).
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def quantiles(xs: Sequence[float]) -> tuple[float, float]:
    """(25th, 75th) percentile, inclusive method (works for 1 sample too)."""
    if len(xs) == 1:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def bootstrap_median_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap confidence interval of the median."""
    import random

    rng = random.Random(seed)
    n = len(xs)
    meds = sorted(statistics.median(rng.choices(xs, k=n)) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def fmt_time(seconds: float) -> str:
    """A duration with a sensible unit."""
    if seconds != seconds:  # nan
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Run:
    """One model trained by one system, ready to be timed.

    Attributes:
      system, model: names.
      step: ``step() -> loss``: one train step on the run's own training state (the
        state is replaced by the step's result, as a training loop does); returns the
        loss array without waiting for it.
      lower: ``lower()`` -> the train step lowered for the run's current arguments
        (``.compile().memory_analysis()`` and ``.compile().as_text()`` work on it).
      param_count: trainable parameters.
      steps: for systems with a fused multi-step: ``steps() -> losses`` running ``k``
        steps on ``lax.scan`` over stacked batches in one dispatch (else None).
      notes: how this system's version differs from the others (shown in RESULTS.md).
    """

    def __init__(self, system: str, model: str, step, lower, param_count: int, steps=None,
                 notes: str = "", state=None):
        self.system, self.model = system, model
        self.step, self.lower, self.param_count = step, lower, param_count
        self.steps, self.notes = steps, notes
        self.state = state  # () -> the current training state (for result checks)
        self.aot = None     # (jitted step, () -> its arguments), for the trace/lower/compile split


def write_between(path: str, begin: str, end: str, text: str) -> None:
    """Replace what stands between the markers ``begin`` and ``end`` of the page at
    ``path`` (a generated table in the docs) by ``text``."""
    with open(path, encoding="utf-8") as f:
        head, _, rest = f.read().partition(begin)
    _, _, tail = rest.partition(end)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")
