"""The ``onnx`` family's tensor operators: shapes, slicing, gathering and scattering,
padding, tiling, splitting, index tensors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..core.errors import ShapeError
from .dtypes import canonical, int64
from .layer import define


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _attr_or_input(a, value, name, since):
    return _ints(value) if a.opset >= since and value is not None else (
        _ints(a.get(name)) if a.get(name) is not None else None)


@define("Reshape", static=(1,), flops="none")
def _reshape(a, x, shape=None):
    target = _ints(shape) if shape is not None else _ints(a["shape"])
    if not a.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return jnp.reshape(x, target)


@define("Transpose", flops="none")
def _transpose(a, x):
    perm = a.get("perm")
    return jnp.transpose(x, None if perm is None else tuple(perm))


define("Concat", flops="none")(lambda a, *xs: jnp.concatenate(xs, axis=a["axis"]))


@define("Flatten", flops="none")
def _flatten(a, x):
    axis = a.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis])) if all(isinstance(d, int) for d in x.shape[:axis]) \
        else -1
    return jnp.reshape(x, (lead, -1) if lead != -1 else (-1, int(np.prod(x.shape[axis:]))))


@define("Squeeze", static=(1,), flops="none")
def _squeeze(a, x, axes=None):
    axes = _attr_or_input(a, axes, "axes", 13)
    if axes is None:
        symbolic = [str(d) for d in x.shape if not isinstance(d, int)]
        if symbolic:  # which dims it removes depends on their sizes
            raise ShapeError(f"Squeeze without axes removes every dim of size 1, so what it "
                             f"gives depends on the size of the symbolic dim {symbolic[0]}: "
                             f"bind it with from_onnx(..., dims={{{symbolic[0]!r}: size}}), "
                             f"or give the node its axes", expected="axes, or static dims")
        return jnp.squeeze(x)
    return jnp.squeeze(x, tuple(v % x.ndim for v in axes))


@define("Unsqueeze", static=(1,), flops="none")
def _unsqueeze(a, x, axes=None):
    axes = _attr_or_input(a, axes, "axes", 13)
    rank = x.ndim + len(axes)
    out = x
    for axis in sorted(v % rank for v in axes):
        out = jnp.expand_dims(out, axis)
    return out


@define("Expand", static=(1,), flops="none")
def _expand(a, x, shape):
    shape = _ints(shape)
    rank = max(len(shape), x.ndim)
    shape = [1] * (rank - len(shape)) + shape
    full = [1] * (rank - x.ndim) + list(x.shape)
    return jnp.broadcast_to(x, [d if s == 1 else s for s, d in zip(shape, full)])


@define("Tile", static=(1,), flops="none")
def _tile(a, x, repeats):
    return jnp.tile(x, _ints(repeats))


@define("Slice", static=(1, 2, 3, 4), flops="none")
def _slice(a, x, starts=None, ends=None, axes=None, steps=None):
    if a.opset < 10:
        starts, ends, axes = a["starts"], a["ends"], a.get("axes")
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else [v % x.ndim for v in _ints(axes)]
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        n = x.shape[axis]
        if not isinstance(n, int):  # symbolic: Python's slice clamps as ONNX does
            index[axis] = _symbolic_slice(start, end, step)
            continue
        start = min(max(start + n if start < 0 else start, 0), n - (step < 0))
        end = end + n if end < 0 else end
        end = min(max(end, -1), n) if step < 0 else min(max(end, 0), n)
        index[axis] = slice(start, None if end == -1 and step < 0 else end, step)
    return x[tuple(index)]


#: starts and ends past this are past any dim: "to the end" (INT64_MAX, INT32_MAX)
_FAR = 2**31 - 1


def _symbolic_slice(start: int, end: int, step: int) -> slice:
    """ONNX's ``Slice`` bounds on a symbolic dim as a Python slice (negative bounds count
    from the end, and are clamped, as ONNX defines them); the exporters' "to the end"
    (INT64_MAX, or INT64_MIN backwards) as an open bound, so no bound compares with
    the symbolic dim."""
    forward = step > 0
    start_open = start <= -_FAR if forward else start >= _FAR
    end_open = end >= _FAR if forward else end <= -_FAR
    return slice(None if start_open else start, None if end_open else end, step)


@define("Split", static=(1,), flops="none")
def _split(a, x, split=None):
    axis = a.get("axis", 0) % x.ndim
    sizes = _ints(split) if split is not None else (_ints(a["split"]) if "split" in a else None)
    if sizes is None:
        n = a.get("num_outputs", a.outputs)
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    points = np.cumsum(sizes)[:-1]
    return tuple(jnp.split(x, [int(p) for p in points], axis=axis))


@define("Gather", flops="none")
def _gather(a, x, indices):
    axis = a.get("axis", 0) % x.ndim
    indices = jnp.where(indices < 0, indices + x.shape[axis], indices)
    return jnp.take(x, indices, axis=axis)


@define("GatherElements", flops="none")
def _gather_elements(a, x, indices):
    axis = a.get("axis", 0) % x.ndim
    indices = jnp.where(indices < 0, indices + x.shape[axis], indices)
    return jnp.take_along_axis(x, indices, axis=axis)


@define("GatherND", flops="none")
def _gather_nd(a, x, indices):
    batch = a.get("batch_dims", 0)
    depth = indices.shape[-1]
    dims = jnp.asarray(x.shape[batch:batch + depth], indices.dtype)
    indices = jnp.where(indices < 0, indices + dims, indices)
    bshape = x.shape[:batch]
    xb = x.reshape((-1,) + x.shape[batch:])
    ib = indices.reshape((xb.shape[0],) + indices.shape[batch:])
    out = jnp.stack([xb[b][tuple(jnp.moveaxis(ib[b], -1, 0))] for b in range(xb.shape[0])])
    return out.reshape(bshape + out.shape[1:])


def _scatter_update(ref, reduction):
    return {"none": ref.set, "add": ref.add, "mul": ref.multiply, "max": ref.max,
            "min": ref.min}[reduction]


@define("ScatterElements", flops="none")
def _scatter_elements(a, x, indices, updates):
    axis = a.get("axis", 0) % x.ndim
    indices = jnp.where(indices < 0, indices + x.shape[axis], indices)
    grid = list(jnp.indices(indices.shape, sparse=True))
    grid[axis] = indices
    return _scatter_update(x.at[tuple(grid)], a.get("reduction", "none"))(updates)


define("Scatter", flops="none")(_scatter_elements)


@define("ScatterND", flops="none")
def _scatter_nd(a, x, indices, updates):
    index = tuple(jnp.moveaxis(indices, -1, 0))
    return _scatter_update(x.at[index], a.get("reduction", "none"))(updates)


@define("Pad", static=(1, 3), flops="none")
def _pad(a, x, pads=None, value=None, axes=None):
    pads = _ints(pads) if pads is not None else _ints(a["pads"])
    axes = list(range(x.ndim)) if axes is None else [v % x.ndim for v in _ints(axes)]
    half = len(pads) // 2
    widths = [(0, 0)] * x.ndim
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + half])
    mode = a.get("mode", "constant")
    crop = tuple(slice(-lo if lo < 0 else None, hi if hi < 0 else None) for lo, hi in widths)
    x = x[crop]
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    if mode == "constant":
        fill = a.get("value", 0.0) if value is None else value
        return jnp.pad(x, widths, constant_values=jnp.asarray(fill, x.dtype))
    return jnp.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])


@define("Shape", flops="none")
def _shape(a, x):
    dims = x.shape[slice(a.get("start", 0), a.get("end"))]
    return jnp.asarray(dims, int64())


define("Size", flops="none")(lambda a, x: jnp.asarray(x.size, int64()))


@define("ConstantOfShape", static=(0,), flops="none")
def _constant_of_shape(a, shape):
    value = a.get("value")
    value = np.zeros((1,), np.float32) if value is None else value
    return jnp.full(_ints(shape), value.reshape(-1)[0], value.dtype)


@define("Range", static=(0, 1, 2), flops="none")
def _range(a, start, limit, delta):
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    dtype = canonical(np.asarray(start).dtype)
    return (jnp.asarray(start, dtype) + jnp.arange(n, dtype=dtype) * jnp.asarray(delta, dtype)
            ).astype(dtype)


@define("OneHot", static=(1,), flops="none")
def _one_hot(a, indices, depth, values):
    depth = int(np.asarray(depth).reshape(-1)[0])
    indices = jnp.where(indices < 0, indices + depth, indices)
    axis = a.get("axis", -1)
    hot = jnp.moveaxis(indices[..., None] == jnp.arange(depth), -1, axis % (indices.ndim + 1))
    return jnp.where(hot, values[1], values[0])


@define("Trilu", static=(1,), flops="none")
def _trilu(a, x, k=None):
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return jnp.triu(x, k) if a.get("upper", 1) else jnp.tril(x, k)


@define("EyeLike", flops="none")
def _eye_like(a, x):
    from .dtypes import to_dtype
    dtype = to_dtype(a["dtype"]) if "dtype" in a else x.dtype
    return jnp.eye(x.shape[0], x.shape[1], a.get("k", 0), dtype=dtype)


@define("Compress", static=(1,), flops="none")
def _compress(a, x, condition):
    keep = np.nonzero(np.asarray(condition).reshape(-1))[0]
    axis = a.get("axis")
    if axis is None:
        return x.reshape(-1)[keep]
    return jnp.take(x, keep, axis=axis % x.ndim)


@define("DepthToSpace", flops="none")
def _depth_to_space(a, x):
    b = a["blocksize"]
    n, c, h, w = x.shape
    if a.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@define("SpaceToDepth", flops="none")
def _space_to_depth(a, x):
    b = a["blocksize"]
    n, c, h, w = x.shape
    perm = (0, 1, 3, 5, 2, 4) if a.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
    return y.reshape(n, c * b * b, h // b, w // b)


@define("ReverseSequence", static=(1,), flops="none")
def _reverse_sequence(a, x, lengths):
    batch, time = a.get("batch_axis", 1), a.get("time_axis", 0)
    t = jnp.arange(x.shape[time])
    out = x
    for b, n in enumerate(_ints(lengths)):
        rows = jnp.where(t < n, n - 1 - t, t)
        slab = jnp.take(jnp.take(x, b, axis=batch), rows, axis=time if time < batch else time - 1)
        out = out.at[(slice(None),) * batch + (b,)].set(slab)
    return out


@define("TopK", static=(1,), flops="input")
def _top_k(a, x, k=None):  # before opset 10 k is an attribute
    k = int(np.asarray(k).reshape(-1)[0]) if k is not None else a["k"]
    axis = a.get("axis", -1) % x.ndim
    moved = jnp.moveaxis(x, axis, -1)
    largest = a.get("largest", 1)
    order = jnp.argsort(moved, axis=-1, stable=True, descending=bool(largest))[..., :k]
    values = jnp.take_along_axis(moved, order, axis=-1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(order.astype(int64()), -1, axis)


@define("Dropout", flops="none")
def _dropout(a, x, ratio=None, training=None):
    return x, jnp.ones(x.shape, bool)


@define("Hardmax")
def _hardmax(a, x):
    axis = a.get("axis", -1 if a.opset >= 13 else 1)
    if a.opset < 13:
        flat = x.reshape(int(np.prod(x.shape[:axis % x.ndim])), -1)
        return _hardmax_last(flat).reshape(x.shape)
    return jnp.moveaxis(_hardmax_last(jnp.moveaxis(x, axis, -1)), -1, axis)


def _hardmax_last(x):
    return (jnp.arange(x.shape[-1]) == jnp.argmax(x, axis=-1)[..., None]).astype(x.dtype)



@define("TensorScatter", flops="none")
def _tensor_scatter(a, cache, update, indices=None):
    """Writes ``update`` into ``cache`` along ``axis`` from each batch row's write
    index (0 without indices); ``mode="circular"`` wraps around."""
    axis = a.get("axis", -2) % cache.ndim
    moved_cache = jnp.moveaxis(cache, axis, 1)
    moved_update = jnp.moveaxis(update, axis, 1)
    batch, steps, length = cache.shape[0], moved_update.shape[1], moved_cache.shape[1]
    start = jnp.zeros((batch,), jnp.int32) if indices is None else indices.astype(jnp.int32)
    rows = start[:, None] + jnp.arange(steps)[None, :]
    if a.get("mode", "linear") == "circular":
        rows = rows % length
    out = moved_cache.at[jnp.arange(batch)[:, None], rows].set(moved_update)
    return jnp.moveaxis(out, 1, axis)


@define("MaxUnpool", static=(2,), flops="none")
def _max_unpool(a, x, indices, output_shape=None):
    """Scatters ``x`` to the flat positions ``indices`` (MaxPool's second output) of a
    zero tensor of the size the pooling came from, placed at the start of a tensor of
    ``output_shape`` when one is given."""
    nd = x.ndim - 2
    kernel, strides = a["kernel_shape"], a.get("strides") or (1,) * nd
    pads = a.get("pads") or (0,) * (2 * nd)
    inferred = list(x.shape[:2]) + [(n - 1) * s + k - pads[i] - pads[i + nd] for i, (n, k, s)
                                    in enumerate(zip(x.shape[2:], kernel, strides))]
    out = jnp.zeros(int(np.prod(inferred)), x.dtype).at[indices.reshape(-1)].set(x.reshape(-1))
    out = out.reshape(inferred)
    if output_shape is not None and np.size(output_shape):
        shape = _ints(output_shape)
        out = jnp.pad(out, [(0, s - n) for s, n in zip(shape, inferred)])
    return out
