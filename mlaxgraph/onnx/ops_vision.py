"""The ``onnx`` family's detection and sampling operators: RoiAlign (average or max
over a bilinear sampling grid per bin), DeformConv (a convolution sampling its input
at learned offsets, with a mask), Col2Im (patches summed back into an image)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.errors import ShapeError
from ..ops.flops import size
from .layer import define


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


# --- RoiAlign --------------------------------------------------------------------------

def _corners(p, extent: int):
    """Bilinear sampling along one axis as ONNX's RoiAlign does: samples below -1 or
    beyond ``extent`` count zero; the low and high neighbours and their weights."""
    valid = (p >= -1.0) & (p <= extent)
    p = jnp.maximum(p, 0.0)
    low = jnp.floor(p).astype(jnp.int32)
    edge = low >= extent - 1
    low = jnp.where(edge, extent - 1, low)
    high = jnp.where(edge, extent - 1, low + 1)
    p = jnp.where(edge, low.astype(p.dtype), p)
    frac = p - low
    return low, high, (1.0 - frac) * valid, frac * valid


def _roi_align_flops(inputs, outputs, a):
    ratio = max(a.get("sampling_ratio", 0), 1)
    return 10 * size(outputs[0]) * ratio * ratio


@define("RoiAlign", dtypes="float", flops=_roi_align_flops)
def _roi_align(a, x, rois, batch_indices):
    ratio = a.get("sampling_ratio", 0)
    if ratio <= 0:
        raise ShapeError("RoiAlign with sampling_ratio 0 samples each bin by the size of its "
                         "box, a count known only from the boxes' values",
                         expected="sampling_ratio >= 1")
    mode = a.get("mode", "avg")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    transform = a.get("coordinate_transformation_mode", "half_pixel" if a.opset >= 16
                      else "output_half_pixel")
    transform = transform.decode() if isinstance(transform, bytes) else transform
    ph, pw = a.get("output_height", 1), a.get("output_width", 1)
    height, width = x.shape[2], x.shape[3]
    dtype = x.dtype
    boxes = rois.astype(dtype) * jnp.asarray(a.get("spatial_scale", 1.0), dtype)
    boxes = boxes - (0.5 if transform == "half_pixel" else 0.0)
    x0, y0, x1, y1 = (boxes[:, i] for i in range(4))
    box_w, box_h = x1 - x0, y1 - y0
    if transform != "half_pixel":
        box_w, box_h = jnp.maximum(box_w, 1.0), jnp.maximum(box_h, 1.0)

    def grid(start, extent, bins):  # (rois, bins, ratio) sample positions
        step = (extent / bins)[:, None, None]
        return (start[:, None, None] + jnp.arange(bins, dtype=dtype)[None, :, None] * step
                + (jnp.arange(ratio, dtype=dtype)[None, None, :] + 0.5) * step / ratio)

    y_low, y_high, wy_low, wy_high = _corners(grid(y0, box_h, ph), height)
    x_low, x_high, wx_low, wx_high = _corners(grid(x0, box_w, pw), width)
    images = x[batch_indices.astype(jnp.int32)]  # (rois, channels, height, width)
    if mode == "avg":
        rows = (_one_hot(y_low, height, dtype) * wy_low[..., None]
                + _one_hot(y_high, height, dtype) * wy_high[..., None]).sum(2)
        cols = (_one_hot(x_low, width, dtype) * wx_low[..., None]
                + _one_hot(x_high, width, dtype) * wx_high[..., None]).sum(2)
        out = jnp.einsum("rph,rqw,rchw->rcpq", rows, cols, images, precision=lax.Precision.HIGHEST)
        return (out / (ratio * ratio)).astype(dtype)
    # max: the largest weighted corner of every sample, as onnxruntime and the reference
    r = jnp.arange(images.shape[0])[:, None, None, None, None]

    def corner(yi, xi, wy, wx):  # (rois, ph, ratio, pw, ratio, channels)
        v = images[r, :, yi[:, :, :, None, None], xi[:, None, None, :, :]]
        return v * (wy[:, :, :, None, None] * wx[:, None, None, :, :])[..., None]

    best = jnp.maximum(jnp.maximum(corner(y_low, x_low, wy_low, wx_low),
                                   corner(y_low, x_high, wy_low, wx_high)),
                       jnp.maximum(corner(y_high, x_low, wy_high, wx_low),
                                   corner(y_high, x_high, wy_high, wx_high)))
    return jnp.transpose(best.max(axis=(2, 4)), (0, 3, 1, 2)).astype(dtype)


def _one_hot(index, n: int, dtype):
    """``index`` one-hot over a new last axis of ``n``."""
    return (index[..., None] == jnp.arange(n)).astype(dtype)


# --- DeformConv ------------------------------------------------------------------------

def _deform_flops(inputs, outputs, a):
    w = inputs[1]
    return 2 * size(outputs[0]) * size(w) // w.shape[0] + 8 * size(outputs[0])


@define("DeformConv", dtypes="float", flops=_deform_flops)
def _deform_conv(a, x, w, offset, b=None, mask=None):
    if x.ndim != 4:
        raise ShapeError("DeformConv takes 2-D images (N, C, H, W)", expected="a rank-4 input")
    n, c, height, width = x.shape
    out_c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    groups, offset_groups = a.get("group", 1), a.get("offset_group", 1)
    sh, sw = a.get("strides") or (1, 1)
    dh, dw = a.get("dilations") or (1, 1)
    top, left, bottom, right = a.get("pads") or (0, 0, 0, 0)
    oh = (height + top + bottom - (dh * (kh - 1) + 1)) // sh + 1
    ow = (width + left + right - (dw * (kw - 1) + 1)) // sw + 1
    taps = kh * kw
    dtype = x.dtype
    offset = offset.reshape(n, offset_groups, taps, 2, oh, ow).astype(dtype)
    mask = (jnp.ones((n, offset_groups, taps, oh, ow), dtype) if mask is None
            else mask.reshape(n, offset_groups, taps, oh, ow).astype(dtype))
    ki, kj = np.divmod(np.arange(taps), kw)
    base_y = (np.arange(oh) * sh - top)[None, :, None] + (ki * dh)[:, None, None]  # (taps, oh, 1)
    base_x = (np.arange(ow) * sw - left)[None, None, :] + (kj * dw)[:, None, None]  # (taps, 1, ow)
    y = base_y + offset[:, :, :, 0]  # (n, groups, taps, oh, ow)
    xs = base_x + offset[:, :, :, 1]
    inside = (y > -1) & (y < height) & (xs > -1) & (xs < width)
    y0, x0 = jnp.floor(y), jnp.floor(xs)
    fy, fx = y - y0, xs - x0
    # zero-padded by one on every side: neighbours just outside read zeros
    padded = jnp.pad(x.reshape(n, offset_groups, c // offset_groups, height, width),
                     [(0, 0), (0, 0), (0, 0), (1, 1), (1, 1)])
    nn = jnp.arange(n)[:, None, None, None, None]
    gg = jnp.arange(offset_groups)[None, :, None, None, None]

    def at(yi, xi):  # (n, groups, taps, oh, ow, channels per group)
        yi = jnp.clip(yi.astype(jnp.int32) + 1, 0, height + 1)
        xi = jnp.clip(xi.astype(jnp.int32) + 1, 0, width + 1)
        return padded[nn, gg, :, yi, xi]

    sampled = (at(y0, x0) * ((1 - fy) * (1 - fx))[..., None] + at(y0, x0 + 1) * ((1 - fy) * fx)[..., None]
               + at(y0 + 1, x0) * (fy * (1 - fx))[..., None] + at(y0 + 1, x0 + 1) * (fy * fx)[..., None])
    sampled = sampled * (inside * mask)[..., None]
    # (n, channels, taps, oh, ow), the channels grouped for the convolution
    cols = jnp.moveaxis(sampled, -1, 2).reshape(n, groups, c // groups, taps, oh, ow)
    kernel = w.reshape(groups, out_c // groups, c // groups, taps).astype(dtype)
    out = jnp.einsum("ngckij,gock->ngoij", cols, kernel, precision=lax.Precision.HIGHEST)
    out = out.reshape(n, out_c, oh, ow)
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1).astype(dtype)
    return out


# --- Col2Im ----------------------------------------------------------------------------

@define("Col2Im", static=(1, 2), flops="input")
def _col2im(a, x, image_shape, block_shape):
    image, block = _ints(image_shape), _ints(block_shape)
    nd = len(image)
    dilations = list(a.get("dilations") or [1] * nd)
    pads = list(a.get("pads") or [0] * (2 * nd))
    strides = list(a.get("strides") or [1] * nd)
    counts = [(i + pads[d] + pads[d + nd] - (dilations[d] * (block[d] - 1) + 1)) // strides[d] + 1
              for d, i in enumerate(image)]
    k, blocks = int(np.prod(block)), int(np.prod(counts))
    if x.shape[-1] != blocks or x.shape[1] % k:
        raise ShapeError(f"Col2Im of {blocks} blocks of {block} over {image} takes "
                         f"(N, C * {k}, {blocks})", expected=f"(N, C * {k}, {blocks})")
    # for each (kernel tap, block) the flat image position it adds to (the padding's: dropped)
    taps = np.stack(np.unravel_index(np.arange(k), block), -1)  # (k, nd)
    where = np.stack(np.unravel_index(np.arange(blocks), counts), -1)  # (blocks, nd)
    pos = where[None] * np.asarray(strides) - np.asarray(pads[:nd]) + taps[:, None] * np.asarray(dilations)
    inside = np.all((pos >= 0) & (pos < np.asarray(image)), axis=-1)
    flat = np.where(inside, np.ravel_multi_index(tuple(np.clip(pos, 0, None).T), image, mode="clip").T,
                    int(np.prod(image)))
    n, c = x.shape[0], x.shape[1] // k
    out = jnp.zeros((n, c, int(np.prod(image)) + 1), x.dtype)
    out = out.at[:, :, flat.reshape(-1)].add(x.reshape(n, c, k * blocks))
    return out[:, :, :-1].reshape(n, c, *image)
