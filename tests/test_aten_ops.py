"""The aten op family against NumPy: each operator built as a layer with its
arguments, compiled in a graph and run, compared with the NumPy computation written
here; and its shape inference with a symbolic batch."""

from __future__ import annotations

import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph.aten import op_class

T = ("$tensor", 0)
U = ("$tensor", 1)
rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
Y = rng.standard_normal((2, 3, 4)).astype(np.float32)
IMG = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)


def _max_pool(x, k, s, p, d, ceil):
    """NCHW max pooling by PyTorch's rules: -inf padding, dilation, and with ``ceil`` one
    more window where it starts inside the input or its left padding."""
    n = x.shape[-1]
    span = d * (k - 1) + 1
    out = -(-(n + 2 * p - span) // s) + 1 if ceil else (n + 2 * p - span) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    xp = np.pad(x, ((0, 0), (0, 0), (p, p + s), (p, p + s)), constant_values=-np.inf)
    y = np.full(x.shape[:2] + (out, out), -np.inf, np.float32)
    for i in range(out):
        for j in range(out):
            for a in range(k):
                for b in range(k):
                    y[:, :, i, j] = np.maximum(y[:, :, i, j], xp[:, :, i * s + a * d, j * s + b * d])
    return y


def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


CASES = [
    ("aten.add.Tensor", (T, U), {"alpha": 2}, [X, Y], lambda: X + 2 * Y),
    ("aten.sub.Tensor", (T, 1.5), {}, [X], lambda: X - 1.5),
    ("aten.mul.Tensor", (T, U), {}, [X, Y], lambda: X * Y),
    ("aten.div.Tensor_mode", (T, U), {"rounding_mode": "floor"}, [X, Y], lambda: np.floor(X / Y)),
    ("aten.relu.default", (T,), {}, [X], lambda: np.maximum(X, 0)),
    ("aten.gelu.default", (T,), {"approximate": "tanh"}, [X],
     lambda: 0.5 * X * (1 + np.tanh(np.sqrt(2 / np.pi) * (X + 0.044715 * X ** 3)))),
    ("aten.where.self", (T, U, ("$tensor", 2)), {}, [X > 0, X, Y], lambda: np.where(X > 0, X, Y)),
    ("aten.mean.dim", (T, (-1,), True), {}, [X], lambda: X.mean(-1, keepdims=True)),
    ("aten.sum.dim_IntList", (T, (0, 2)), {}, [X], lambda: X.sum((0, 2))),
    ("aten.amax.default", (T, (1,)), {}, [X], lambda: X.max(1)),
    ("aten.var.correction", (T, (2,)), {"correction": 1, "keepdim": False}, [X], lambda: X.var(2, ddof=1)),
    ("aten.softmax.int", (T, 1), {}, [X], lambda: _softmax(X, 1)),
    ("aten.view.default", (T, (2, -1)), {}, [X], lambda: X.reshape(2, 12)),
    ("aten.permute.default", (T, (2, 0, 1)), {}, [X], lambda: X.transpose(2, 0, 1)),
    ("aten.slice.Tensor", (T, 2, 1, 9223372036854775807, 2), {}, [X], lambda: X[:, :, 1::2]),
    ("aten.select.int", (T, 1, -1), {}, [X], lambda: X[:, -1]),
    ("aten.cat.default", ((T, U), 1), {}, [X, Y], lambda: np.concatenate([X, Y], 1)),
    ("aten.expand.default", (T, (3, -1, -1, -1)), {}, [X], lambda: np.broadcast_to(X, (3, 2, 3, 4))),
    ("aten.constant_pad_nd.default", (T, (1, 2)), {"value": 0.5}, [X],
     lambda: np.pad(X, ((0, 0), (0, 0), (1, 2)), constant_values=0.5)),
    ("aten.bmm.default", (T, U), {}, [X, Y.transpose(0, 2, 1).copy()], lambda: X @ Y.transpose(0, 2, 1)),
    # nn.RMSNorm: eps None is float32's machine epsilon, as PyTorch takes it
    ("aten.rms_norm.default", (T, (4,), U), {"eps": 1e-3}, [X, Y[0, 0]],
     lambda: X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-3) * Y[0, 0]),
    ("aten.rms_norm.default", (T, (3, 4)), {}, [X],
     lambda: X / np.sqrt((X ** 2).mean((1, 2), keepdims=True) + np.finfo(np.float32).eps)),
    # t[:, 0] = 5.0 traces as fill.Tensor of a 0-d tensor
    ("aten.fill.Tensor", (T, U), {}, [X, np.float32(5.0)], lambda: np.full_like(X, 5.0)),
    ("aten.slice_scatter.default", (T, U, 2, 0, 2), {}, [X, Y[:, :, :2].copy() * 0 + 7],
     lambda: np.concatenate([np.full_like(X[:, :, :2], 7), X[:, :, 2:]], 2)),
    ("aten.avg_pool2d.default", (T, (2, 2)), {}, [IMG],
     lambda: IMG.reshape(1, 2, 3, 2, 3, 2).mean((3, 5))),
    ("aten.max_pool2d.default", (T, (3, 3), (3, 3)), {}, [IMG],
     lambda: IMG.reshape(1, 2, 2, 3, 2, 3).max((3, 5))),
    ("aten.max_pool2d.default", (T, (2, 2), (1, 1), (0, 0), (2, 2)), {}, [IMG],
     lambda: _max_pool(IMG, 2, 1, 0, 2, False)),
    ("aten.max_pool2d.default", (T, (3, 3), (2, 2), (1, 1), (1, 1), True), {}, [IMG[:, :, :5, :5]],
     lambda: _max_pool(IMG[:, :, :5, :5], 3, 2, 1, 1, True)),
    ("aten.max_pool2d.default", (T, (2, 2), (2, 2), (0, 0), (1, 1), True), {}, [IMG[:, :, :5, :5]],
     lambda: _max_pool(IMG[:, :, :5, :5], 2, 2, 0, 1, True)),
    ("aten.adaptive_avg_pool2d.default", (T, (1, 1)), {}, [IMG], lambda: IMG.mean((2, 3), keepdims=True)),
    ("aten.topk.default", (T, 2), {}, [X], lambda: -np.sort(-X, -1)[..., :2]),
    ("aten.einsum.default", ("bij,bkj->bik", (T, U)), {}, [X, Y], lambda: np.einsum("bij,bkj->bik", X, Y)),
]


@pytest.mark.parametrize("name,args,kwargs,inputs,expected", CASES, ids=[c[0] for c in CASES])
def test_aten_op_against_numpy(name, args, kwargs, inputs, expected):
    layer = op_class(name)(args=args, kwargs=tuple(sorted(kwargs.items())))
    xs = [mg.Input(a.shape, a.dtype, name=f"x{i}") for i, a in enumerate(inputs)]
    out = layer(*xs)
    out = out[0] if isinstance(out, tuple) else out
    model = mg.compile(mg.Graph(xs, out, name="g"))
    got, _ = model.apply({}, {}, *inputs, inference_mode=True)
    np.testing.assert_allclose(np.asarray(got), expected(), rtol=1e-5, atol=1e-5)


def test_shape_inference_keeps_a_symbolic_batch():
    x = mg.Input(("batch", 3, 4))
    y = op_class("aten.view.default")(args=(T, (x.shape[0], -1)))(x)
    assert str(y.spec) == "f32[batch,12]"
    z = op_class("aten.sum.dim_IntList")(args=(T, (1,)))(y)
    assert str(z.spec) == "f32[batch]"
    model = mg.compile(mg.Graph(x, z, name="g"))
    got, _ = model.apply({}, {}, np.ones((5, 3, 4), np.float32), inference_mode=True)
    np.testing.assert_array_equal(np.asarray(got), np.full(5, 12.0))


def test_an_arange_over_a_symbolic_size_gives_integers_as_torch():
    # torch: arange of int bounds (a SymInt size among them) is int64, of a float bound
    # float32
    x = mg.Input(("batch", "seq"), "int32")
    positions = op_class("aten.arange.default")(args=(x.shape[1],))()
    assert str(positions.spec) == "i32[seq]"
    assert str(op_class("aten.arange.default")(args=(2.5,))().spec) == "f32[3]"
    shifted = op_class("aten.add.Tensor")(args=(T, U))(x, positions)
    model = mg.compile(mg.Graph(x, shifted, name="g"))
    got, _ = model.apply({}, {}, np.zeros((2, 5), np.int32), inference_mode=True)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(np.arange(5), (2, 5)))


def test_an_op_refusing_its_inputs_is_a_shape_error():
    x = mg.Input((2, 3))
    with pytest.raises(mg.ShapeError, match="aten.view.default cannot take"):
        op_class("aten.view.default")(args=(T, (4, 4)))(x)
