"""The ``aten`` family's further tensor operators (ATen's signatures): creation from
a tensor, bitwise and logical operators, differences, arg-reductions with their
indices, scatters, sorting, padding modes, views by dim, norms."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from ..ops.flops import size
from .layer import define
from .ops_table import _axes, _div, _pad, dtype_of

define("aten.new_ones.default", flops="none")(
    lambda x, size, dtype=None, **kw: jnp.ones(tuple(size), dtype_of(dtype, x.dtype)))
define("aten.new_zeros.default", flops="none")(
    lambda x, size, dtype=None, **kw: jnp.zeros(tuple(size), dtype_of(dtype, x.dtype)))
define("aten.new_full.default", flops="none")(
    lambda x, size, value, dtype=None, **kw: jnp.full(tuple(size), value, dtype_of(dtype, x.dtype)))
for _name, _fn in {"__and__": jnp.bitwise_and, "__or__": jnp.bitwise_or, "__xor__": jnp.bitwise_xor,
                   "logical_xor": jnp.logical_xor, "bitwise_xor": jnp.bitwise_xor}.items():
    define(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.{_name}.default")(
        lambda x, y, fn=_fn: fn(x, y))


@define("aten.diff.default")
def _diff(x, n=1, dim=-1, prepend=None, append=None):
    return jnp.diff(x, n=n, axis=dim, prepend=prepend, append=append)


@define("aten.any.default", "aten.any.dim", "aten.any.dims", flops="input")
def _any(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(dim), keepdims=keepdim)


@define("aten.all.default", "aten.all.dim", "aten.all.dims", flops="input")
def _all(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(dim), keepdims=keepdim)


@define("aten.max.dim", flops="input")
def _max_dim(x, dim, keepdim=False):
    return jnp.max(x, axis=dim, keepdims=keepdim), jnp.argmax(x, axis=dim, keepdims=keepdim)


@define("aten.min.dim", flops="input")
def _min_dim(x, dim, keepdim=False):
    return jnp.min(x, axis=dim, keepdims=keepdim), jnp.argmin(x, axis=dim, keepdims=keepdim)


define("aten.max.default", flops="input")(lambda x: jnp.max(x))
define("aten.min.default", flops="input")(lambda x: jnp.min(x))
define("aten.prod.default", flops="input")(lambda x, dtype=None: jnp.prod(x, dtype=dtype_of(dtype)))
define("aten.std.correction", flops="input")(
    lambda x, dim=None, correction=1, keepdim=False: jnp.std(
        x, axis=_axes(dim), ddof=1 if correction is None else correction, keepdims=keepdim))
define("aten.repeat.default", flops="none")(lambda x, repeats: jnp.tile(x, tuple(repeats)))
define("aten.flip.default", flops="none")(lambda x, dims: jnp.flip(x, tuple(dims)))
define("aten.expand_as.default", flops="none")(lambda x, other: jnp.broadcast_to(x, other.shape))
define("aten.view_as.default", "aten.reshape_as.default", flops="none")(
    lambda x, other: jnp.reshape(x, other.shape))
define("aten.swapaxes.default", "aten.swapdims.default", flops="none")(
    lambda x, a, b: jnp.swapaxes(x, a, b))
define("aten.fill_.Scalar", "aten.fill.Scalar", flops="none")(
    lambda x, value: jnp.full_like(x, value))
# t[:, 0] = 5.0 traces as fill.Tensor of a 0-d tensor (then a copy into the slice)
define("aten.fill_.Tensor", "aten.fill.Tensor", flops="none")(
    lambda x, value: jnp.broadcast_to(jnp.asarray(value).astype(x.dtype), x.shape))
define("aten.zero_.default", "aten.zero.default", flops="none")(lambda x: jnp.zeros_like(x))


@define("aten.unflatten.int", flops="none")
def _unflatten(x, dim, sizes):
    dim = dim % x.ndim
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(d for d in sizes if not (isinstance(d, int) and d == -1))
        sizes[sizes.index(-1)] = x.shape[dim] // known
    return x.reshape(x.shape[:dim] + tuple(sizes) + x.shape[dim + 1:])


@define("aten.pad.default", flops="none")
def _pad_mode(x, pad, mode="constant", value=None):
    if mode != "constant":
        widths = [(0, 0)] * x.ndim
        for i in range(len(pad) // 2):
            widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
        return jnp.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge",
                                        "circular": "wrap"}[mode])
    return _pad(x, pad, 0 if value is None else value)


@define("aten.linalg_vector_norm.default", flops=lambda i, o, a: 2 * size(i[0]))
def _vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    x = x.astype(dtype_of(dtype, x.dtype))
    axes = _axes(dim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    if ord == float("inf"):
        return jnp.max(jnp.abs(x), axis=axes, keepdims=keepdim)
    return jnp.sum(jnp.abs(x) ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@define("aten.slice_scatter.default", flops="none")
def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    index = [slice(None)] * x.ndim
    if isinstance(end, int) and end > 2 ** 62:
        end = None
    index[dim] = slice(start, end, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@define("aten.select_scatter.default", flops="none")
def _select_scatter(x, src, dim, index):
    where = [slice(None)] * x.ndim
    where[dim] = index
    return x.at[tuple(where)].set(src.astype(x.dtype))


@define("aten.index_put.default", "aten.index_put_.default", flops="none")
def _index_put(x, indices, values, accumulate=False):
    where = tuple(slice(None) if i is None else i for i in indices)
    values = jnp.asarray(values, x.dtype)
    return x.at[where].add(values) if accumulate else x.at[where].set(values)


define("aten.copy.default", "aten.copy_.default", flops="none")(
    lambda x, src, non_blocking=False: jnp.broadcast_to(src.astype(x.dtype), x.shape))


_MORE_UNARY: dict[str, Any] = {
    "acos": jnp.arccos, "acosh": jnp.arccosh, "asin": jnp.arcsin, "asinh": jnp.arcsinh,
    "atan": jnp.arctan, "atanh": jnp.arctanh, "cosh": jnp.cosh, "sinh": jnp.sinh, "tan": jnp.tan,
    "trunc": jnp.trunc, "log10": jnp.log10, "log2": jnp.log2, "isinf": jnp.isinf,
}
for _name, _fn in _MORE_UNARY.items():
    define(f"aten.{_name}.default")(lambda x, fn=_fn: fn(x))
define("aten.bitwise_and.Scalar")(lambda x, y: jnp.bitwise_and(x, y))
define("aten.bitwise_or.Scalar")(lambda x, y: jnp.bitwise_or(x, y))
define("aten.div.Scalar_mode")(lambda x, y, rounding_mode=None: _div(x, y, rounding_mode))
define("aten.argmin.default", flops="input")(
    lambda x, dim=None, keepdim=False: jnp.argmin(x, axis=dim, keepdims=keepdim))
define("aten.prod.dim_int", flops="input")(
    lambda x, dim, keepdim=False, dtype=None: jnp.prod(x, axis=dim, keepdims=keepdim, dtype=dtype_of(dtype)))
define("aten.var.dim", flops="input")(
    lambda x, dim=None, unbiased=True, keepdim=False: jnp.var(x, axis=_axes(dim), ddof=int(unbiased),
                                                              keepdims=keepdim))
define("aten.diagonal.default", flops="none")(
    lambda x, offset=0, dim1=0, dim2=1: jnp.diagonal(x, offset, dim1, dim2))
define("aten.empty.memory_format", flops="none")(
    lambda shape, dtype=None, **kw: jnp.zeros(tuple(shape), dtype_of(dtype, jnp.float32)))
define("aten.empty_strided.default", flops="none")(
    lambda shape, stride, dtype=None, **kw: jnp.zeros(tuple(shape), dtype_of(dtype, jnp.float32)))


def _pad_last(x, pad, mode):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return jnp.pad(x, widths, mode=mode)


define("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
       flops="none")(lambda x, pad: _pad_last(x, pad, "reflect"))
define("aten.replication_pad2d.default", "aten.replication_pad3d.default", flops="none")(
    lambda x, pad: _pad_last(x, pad, "edge"))


def _scatter_index(x, dim, index):
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    grids[dim % x.ndim] = index
    return tuple(grids)


define("aten.scatter.src", flops="none")(
    lambda x, dim, index, src: x.at[_scatter_index(x, dim, index)].set(src[tuple(
        slice(0, n) for n in index.shape)].astype(x.dtype)))
define("aten.scatter.value", flops="none")(
    lambda x, dim, index, value: x.at[_scatter_index(x, dim, index)].set(jnp.asarray(value, x.dtype)))
define("aten.scatter_add.default", flops="none")(
    lambda x, dim, index, src: x.at[_scatter_index(x, dim, index)].add(src[tuple(
        slice(0, n) for n in index.shape)].astype(x.dtype)))


@define("aten.sort.default", flops="input")
def _sort(x, dim=-1, descending=False):
    order = jnp.argsort(-x if descending else x, axis=dim, stable=True)
    return jnp.take_along_axis(x, order, axis=dim), order


@define("aten.topk.default", flops="input")
def _topk(x, k, dim=-1, largest=True, sorted=True):
    moved = jnp.moveaxis(x if largest else -x, dim, -1)
    values, indices = jax.lax.top_k(moved, k)
    values = values if largest else -values
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(indices, -1, dim)


# --- further activations and reductions (PyTorch's definitions) ------------------------

@define("aten.softplus.default")
def _softplus(x, beta=1, threshold=20):
    """``log(1 + exp(beta * x)) / beta``, ``x`` itself where ``beta * x > threshold``."""
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta).astype(x.dtype)


define("aten.log_sigmoid.default")(lambda x: jax.nn.log_sigmoid(x))
define("aten.selu.default", "aten.selu_.default")(lambda x: jax.nn.selu(x).astype(x.dtype))
define("aten.celu.default", "aten.celu_.default")(
    lambda x, alpha=1.0: jax.nn.celu(x, alpha).astype(x.dtype))
define("aten.glu.default")(lambda x, dim=-1: jax.nn.glu(x, axis=dim))
define("aten.hardshrink.default")(
    lambda x, lambd=0.5: jnp.where(jnp.abs(x) > lambd, x, jnp.zeros((), x.dtype)))
define("aten.logsumexp.default", flops="input")(
    lambda x, dim, keepdim=False: jax.nn.logsumexp(x, axis=_axes(dim), keepdims=keepdim))
define("aten.threshold.default")(
    lambda x, threshold, value: jnp.where(x > threshold, x, jnp.asarray(value, x.dtype)))
define("aten.prelu.default", "aten._prelu_kernel.default")(
    lambda x, w: jnp.where(x >= 0, x, x * (w.reshape((-1,) + (1,) * (x.ndim - 2)) if x.ndim > 1 and w.size > 1
                                        else w.reshape(()))))
define("aten.frac.default")(lambda x: x - jnp.trunc(x))
define("aten.floor_divide.default", "aten.floor_divide.Scalar")(jnp.floor_divide)
define("aten.cumprod.default", flops="input")(
    lambda x, dim, dtype=None: jnp.cumprod(x, axis=dim, dtype=dtype_of(dtype)))
define("aten.addcmul.default")(lambda x, a, b, value=1: x + value * a * b)
define("aten.addcdiv.default")(lambda x, a, b, value=1: x + value * a / b)
define("aten.narrow.default", flops="none")(
    lambda x, dim, start, length: jax.lax.slice_in_dim(x, start % x.shape[dim], start % x.shape[dim] + length,
                                                       axis=dim % x.ndim))


@define("aten.nan_to_num.default")
def _nan_to_num(x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@define("aten.pixel_shuffle.default", flops="none")
def _pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    y = x.reshape((*lead, c // (r * r), r, r, h, w))
    n = len(lead)
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return y.reshape((*lead, c // (r * r), h * r, w * r))


@define("aten.pixel_unshuffle.default", flops="none")
def _pixel_unshuffle(x, r):
    *lead, c, h, w = x.shape
    y = x.reshape((*lead, c, h // r, r, w // r, r))
    n = len(lead)
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return y.reshape((*lead, c * r * r, h // r, w // r))


@define("aten.instance_norm.default", flops=lambda i, o, a: 8 * size(o[0]))
def _instance_norm(x, w, b, mean, var, use_input_stats, momentum, eps, cudnn_enabled=True):
    """``nn.InstanceNorm*``: each sample's channels over their positions; with
    ``track_running_stats`` in eval mode the running statistics."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if use_input_stats:
        if mean is not None:
            raise NotImplementedError("track_running_stats=True in train mode (its running "
                                      "statistics' update)")
        axes = tuple(range(2, x.ndim))
        m, v = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    else:
        m, v = mean.reshape(shape), var.reshape(shape)
    y = (x - m) * jax.lax.rsqrt(v + eps)
    y = y if w is None else y * w.reshape(shape)
    return y if b is None else y + b.reshape(shape)


# --- repeat_interleave ---------------------------------------------------------------

@define("aten.repeat_interleave.self_int", flops="none")
def _repeat_interleave(x, repeats, dim=None, output_size=None):
    """Each entry ``repeats`` times along ``dim`` (the flattened tensor without)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    return jnp.repeat(x, repeats, axis=dim)


@define("aten.repeat_interleave.self_Tensor", flops="none")
def _repeat_interleave_tensor(x, repeats, dim=None, output_size=None):
    """Entry ``i`` ``repeats[i]`` times (a one-element ``repeats``: each as often). The
    output's size depends on ``repeats``' values: known to the graph only when
    ``output_size`` is given (otherwise the program's size is data-dependent, a
    ``ShapeError`` when it is read)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    if repeats.size == 1:
        repeats = jnp.broadcast_to(repeats.reshape(()), (x.shape[dim],))
    if output_size is None:
        raise NotImplementedError("repeats given as a tensor and no output_size (the output's "
                                  "size depends on the tensor's values; pass output_size)")
    return jnp.repeat(x, repeats, axis=dim, total_repeat_length=output_size)


@define("aten.repeat_interleave.Tensor", flops="none")
def _repeat_interleave_indices(repeats, output_size=None):
    """``torch.repeat_interleave(repeats)``: index ``i`` ``repeats[i]`` times."""
    if output_size is None:
        raise NotImplementedError("repeats and no output_size (the output's size depends on "
                                  "the tensor's values; pass output_size)")
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats,
                      total_repeat_length=output_size)


# --- scatter_reduce, cdist -------------------------------------------------------------

_IDENTITY = {"sum": 0, "mean": 0, "prod": 1, "amax": -jnp.inf, "amin": jnp.inf}


@define("aten.scatter_reduce.two", flops="none")
def _scatter_reduce(x, dim, index, src, reduce, include_self=True):
    """``src``'s entries reduced into ``x`` at ``index`` along ``dim`` (``sum``,
    ``prod``, ``mean``, ``amax``, ``amin``); without ``include_self`` the positions
    scattered to start from the reduction's identity, not ``x``'s value; a mean
    divides by the values reduced (``x``'s own counted with ``include_self``)."""
    where = _scatter_index(x, dim, index)
    src = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
    hit = jnp.zeros(x.shape, jnp.int32).at[where].add(1)
    identity = _IDENTITY[reduce]
    if jnp.issubdtype(x.dtype, jnp.integer) and reduce in ("amax", "amin"):
        info = jnp.iinfo(x.dtype)
        identity = info.min if reduce == "amax" else info.max
    base = x if include_self else jnp.where(hit > 0, jnp.asarray(identity, x.dtype), x)
    at = base.at[where]
    out = {"sum": at.add, "mean": at.add, "prod": at.multiply, "amax": at.max, "amin": at.min}[reduce](src)
    if reduce != "mean":
        return out
    count = jnp.maximum(hit + (1 if include_self else 0), 1).astype(x.dtype)
    divided = jnp.floor_divide(out, count) if jnp.issubdtype(x.dtype, jnp.integer) else out / count
    return jnp.where(hit > 0, divided, x)


@define("aten._cdist_forward.default", "aten.cdist.default",
        flops=lambda i, o, a: 3 * size(o[0]) * i[0].shape[-1])
def _cdist(x1, x2, p=2.0, compute_mode=None):
    """``torch.cdist``: the ``p``-norm distance of each row of ``x1`` to each of ``x2``."""
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum(diff != 0, -1).astype(x1.dtype)
    if p == float("inf"):
        return jnp.max(diff, -1)
    if p == 1:
        return jnp.sum(diff, -1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, -1))
    return jnp.sum(diff ** p, -1) ** (1.0 / p)
