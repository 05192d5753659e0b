"""Helpers shared by the test files: tolerant comparison in float64, trees of arrays in
float64 or as shapes, random weights with the names and shapes ``model.init`` makes
(without compiling init), one-layer graphs and families of them compiled as one graph,
and the ``file:line`` a layer built on the next line will report.

Each test file keeps its own tolerances and passes them (``functools.partial(close,
rtol=RTOL, atol=ATOL)``); the defaults here are the common ones."""

from __future__ import annotations

import sys

import _reference as ref
import jax
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg

RTOL = 1e-5
ATOL = 1e-5


def close(got, want, rtol=RTOL, atol=ATOL, scale=None):
    """``got`` equals ``want`` within ``rtol`` and ``atol``, both compared in float64.
    With ``scale``, ``atol`` is relative to ``max(scale, max |want|)``: for outputs whose
    magnitude varies from case to case."""
    want = np.asarray(want, np.float64)
    if scale is not None:
        atol = atol * max(scale, np.abs(want).max())
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


def f64(tree):
    """Every array of ``tree`` as a float64 NumPy array."""
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def shapes(tree):
    """Every array of ``tree`` as its shape (a tuple)."""
    return jax.tree.map(lambda a: tuple(a.shape), tree)


def randomized(tree, seed=0, scale=1.0, positive=()):
    """The same pytree of arrays with random float32 values: ``scale`` times standard
    normals, or uniforms in [0.5, 1.5) for the leaves whose last key is in ``positive``
    (variances)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    values = {}
    for i, (path, leaf) in enumerate(leaves):
        if path[-1].key in positive:
            values[path] = ref.rand(leaf.shape, seed + i, 0.5, 1.5)
        else:
            values[path] = ref.rand(leaf.shape, seed + i) * np.float32(scale)
    return jax.tree_util.tree_map_with_path(lambda p, _: jnp.asarray(values[p]), tree)


def random_init(model, seed=0, scale=1.0):
    """Random float32 params and state with the names and shapes ``model.init`` makes
    (normals times ``scale``; BatchNorm's variances uniform in [0.5, 1.5)).

    ``jax.eval_shape(model.init, key)`` traces init without compiling it (compiling the
    random initializers costs about a second per shape on CPU); the tests that check
    init's values call ``model.init`` itself."""
    params, state = jax.eval_shape(model.init, jax.random.key(0))
    return (randomized(params, seed, scale),
            randomized(state, seed + 100, scale, positive=("var",)))


def one_layer(call, *inputs, policy=None):
    """A compiled graph of ``call(*inputs)``; each input a (shape, dtype) pair."""
    xs = [mg.Input(shape, dtype, name=f"x{i}") for i, (shape, dtype) in enumerate(inputs)]
    y = call(*xs)
    return mg.compile(mg.Graph(xs[0] if len(xs) == 1 else xs, y, name="one_layer"), policy=policy)


def family(cases, *, seed=0, policy=None, scale=1.0):
    """Many one-layer cases compiled as ONE graph, so a family of cases costs one XLA
    compilation (they dominate the run time on CPU): one input per case input, the
    case's outputs in order. ``cases``: name -> (call, [(graph_shape, dtype), ...]).
    Returns (model, params, state, {name: (input positions, output positions)}), the
    weights from ``random_init(model, seed, scale)``."""
    inputs, outputs, index = [], [], {}
    for name, (call, specs) in cases.items():
        xs = [mg.Input(shape, dtype, name=f"in_{name}_{i}") for i, (shape, dtype) in enumerate(specs)]
        ys = call(*xs)
        ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
        index[name] = (list(range(len(inputs), len(inputs) + len(xs))),
                       list(range(len(outputs), len(outputs) + len(ys))))
        inputs += xs
        outputs += ys
    model = mg.compile(mg.Graph(inputs, outputs, name="family"), policy=policy)
    params, state = random_init(model, seed, scale)
    return model, params, state, index


def next_line() -> str:
    """``this_file.py:N`` for the line after the caller's."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"
