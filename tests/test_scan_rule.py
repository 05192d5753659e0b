"""``scan_blocks=True`` folds a run of equal blocks only where folding pays (the rule
``scan_pays``: runs of ``SCAN_MIN_RUN`` or more, measured by
benchmarks/bench_scan_rule.py); ``scan_blocks="always"`` folds every run of two or more;
anything else is refused by name. The folded model computes what the unfolded one does
(tests/test_scan.py checks that against the reference interpreter)."""

import jax
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.compiler.passes.fold_repeated_blocks import SCAN_MIN_RUN, scan_pays


def _chain(n: int) -> mg.Graph:
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Input(("batch", 4), name="h")
    block = mg.Graph(inner, ops.relu(ops.Linear(4, name="dense")(inner)), name="block")
    h = x
    for i in range(n):
        h = block.as_block(f"b{i}")(h)
    return mg.Graph(x, h, name=f"chain{n}")


def _scans(model) -> list[str]:
    return [n.name for n in model.graph.nodes if n.op.op_name == "scan"]


def test_scan_blocks_true_folds_the_long_runs_and_leaves_the_short_ones():
    short, long = _chain(SCAN_MIN_RUN - 1), _chain(SCAN_MIN_RUN)
    assert not scan_pays(short.node("b0").op.subgraph(), SCAN_MIN_RUN - 1)
    assert _scans(mg.compile(short, scan_blocks=True)) == []
    assert _scans(mg.compile(long, scan_blocks=True)) == [f"b0..b{SCAN_MIN_RUN - 1}"]
    assert _scans(mg.compile(short, scan_blocks="always")) == [f"b0..b{SCAN_MIN_RUN - 2}"]
    assert _scans(mg.compile(short)) == []


def test_the_rule_and_always_compute_the_same():
    graph = _chain(SCAN_MIN_RUN - 1)
    rule, always = mg.compile(graph, scan_blocks=True), mg.compile(graph, scan_blocks="always")
    params, state = rule.init(jax.random.key(0))
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    want = np.maximum(x, 0)
    for i in range(SCAN_MIN_RUN - 1):  # NumPy: the chain of relu(x W + b)
        p = params[f"b{i}"]["dense"]
        want = np.maximum(want @ np.asarray(p["kernel"]) + np.asarray(p["bias"]), 0)
    got, _ = rule.apply(params, state, x)
    folded, _ = always.apply(*always.stack_weights(params, state), x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(folded), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_another_scan_blocks_value_is_refused_by_name(bad):
    with pytest.raises(mg.GraphError, match="scan_blocks is True"):
        mg.compile(_chain(2), scan_blocks=bad)


def test_a_run_of_blocks_with_a_convolution_stays_unrolled():
    x = mg.Input(("batch", 4, 4, 2), name="x")
    inner = mg.Input(("batch", 4, 4, 2), name="h")
    block = mg.Graph(inner, ops.relu(ops.Conv(2, (3, 3), padding="SAME", name="conv")(inner)), name="block")
    h = x
    for i in range(SCAN_MIN_RUN):
        h = block.as_block(f"b{i}")(h)
    graph = mg.Graph(x, h)
    assert _scans(mg.compile(graph, scan_blocks=True)) == []
    assert _scans(mg.compile(graph, scan_blocks="always")) == [f"b0..b{SCAN_MIN_RUN - 1}"]
