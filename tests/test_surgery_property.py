"""A property of the rewriter: random graphs (test_property's strategy), random
rewrites that change nothing a model computes (a layer replaced by itself, an
identity inserted after a layer, then removed again) leave the NumPy reference
interpreter's outputs, and the compiled model's, unchanged."""

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import mlaxgraph as mg
import test_property as tp
from mlaxgraph import ops


def reference_outputs(graph, params, state, arrays):
    outs, _ = tp.reference(graph, params, state, [tp.as_reference_input(a) for a in arrays],
                           False, set())
    return outs


@settings(max_examples=25, **tp.SETTINGS)
@given(prog=tp.programs(max_steps=6), choice=st.data())
def test_rewrites_that_change_nothing_leave_outputs_unchanged(prog, choice):
    graph, _ = tp.build(prog)
    paths = graph.select()
    if not paths:
        return
    model = mg.compile(graph)
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    rng = np.random.default_rng(0)
    params = tp.random_weights(shapes[0], rng, state=False)
    state = tp.random_weights(shapes[1], rng, state=True)
    arrays = tp.make_inputs(prog, tp.BINDINGS[0], rng)
    want = reference_outputs(graph, params, state, arrays)

    path = choice.draw(st.sampled_from(paths), label="path")
    same = graph.replace(path, lambda layer, *xs: layer(*xs))
    assert same == graph  # the layer called again is the same node
    probed = graph.insert_after(path, lambda *ys: tuple(ops.Identity(name="probe")(y) for y in ys)
                                if len(ys) > 1 else ops.Identity(name="probe")(ys[0]))
    probe = [p for p in probed.select("**") if p.rsplit("/", 1)[-1].startswith("probe")]
    assert probe, probed
    restored = probed.remove(probe)
    for changed in (probed, restored):
        got = reference_outputs(changed, params, state, arrays)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert restored == graph
    out, _ = mg.compile(probed).apply(params, state, *arrays, inference_mode=True)
    out = out if isinstance(out, tuple) else (out,)
    for o, w in zip(out, want):
        tp.assert_close(o, w, f"probed {path}")
