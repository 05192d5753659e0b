"""A 2D U-Net for segmentation, in the layout of the widely used PyTorch U-Net
(milesial's Pytorch-UNet with transposed-convolution upsampling): blocks ``inc``,
``down1`` ..., ``up1`` ..., ``outc``, their layers named as its modules."""

from __future__ import annotations

from typing import Any

from .. import ops
from ..core.errors import ConfigError
from ..ir.graph import Graph, Input
from .torch_layout import TorchLayout, register_layout

__all__ = ["unet"]

register_layout("unet", TorchLayout())


def _double_conv(x, out_channels: int, prefix: str, data_format: str):
    """(3 x 3 conv without bias, BatchNorm, ReLU) twice: ``double_conv.0`` ... ``.4``."""
    axis = -1 if data_format == "NHWC" else 1
    for conv, bn in ((0, 1), (3, 4)):
        x = ops.Conv(out_channels, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                     data_format=data_format, name=f"{prefix}double_conv.{conv}")(x)
        x = ops.relu(ops.BatchNorm(momentum=0.9, epsilon=1e-5, axis=axis, unbiased_running_var=True,
                                   name=f"{prefix}double_conv.{bn}")(x))
    return x


def unet(in_channels: int = 3, num_classes: int = 2, *, width: int = 64, depth: int = 4,
         image_size: int | None = None, data_format: str = "NHWC") -> Graph:
    """A U-Net: ``images (batch, height, width, in_channels)`` (NHWC; or channel-first
    with ``data_format="NCHW"``) -> per-pixel ``logits (batch, height, width,
    num_classes)``.

    ``inc`` (a double convolution to ``width`` channels); ``down1`` ... ``down{depth}``
    (2 x 2 max pool, then a double convolution doubling the channels); ``up1`` ...
    ``up{depth}`` (a 2 x 2 transposed convolution with stride 2 halving the channels,
    the skip connection concatenated before it, a double convolution); ``outc`` (a
    1 x 1 convolution). A double convolution is (3 x 3 convolution without bias,
    BatchNorm, ReLU) twice. The defaults (``width=64``, ``depth=4``) are the original
    U-Net's sizes.

    ``image_size`` None (the default) makes height and width symbolic: any image size
    of at least ``2 ** depth`` pixels a side, as the PyTorch U-Net takes; an int builds
    for square images of that size. Where a size is not divisible by ``2 ** depth``,
    the max pools round down and each upsampled map is padded with zeros to its skip
    connection's size (half the difference before, the rest after), as the PyTorch
    U-Net's ``F.pad`` does.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.models.unet(width=8, depth=2).output_specs
      (f32[batch,height,width,2],)
      >>> mg.models.unet(width=8, depth=2, image_size=30).output_specs
      (f32[batch,30,30,2],)
    """
    for what, value in (("in_channels", in_channels), ("num_classes", num_classes),
                        ("width", width), ("depth", depth), ("image_size", image_size)):
        if what == "image_size" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"unet: {what} must be a positive int, got {value!r}")
    if data_format not in ("NHWC", "NCHW"):
        raise ConfigError(f"unet: data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
    if image_size is not None and image_size < 2 ** depth:
        raise ConfigError(f"unet: image_size {image_size} is less than 2 ** depth = {2 ** depth}: "
                          f"the deepest map would be empty")
    spatial = (1, 2) if data_format == "NHWC" else (2, 3)

    def shape(size: Any, channels: int, names: tuple[str, str] = ("height", "width")) -> tuple:
        height, width_ = names if size is None else (size, size)
        return (("batch", height, width_, channels) if data_format == "NHWC"
                else ("batch", channels, height, width_))

    axis = -1 if data_format == "NHWC" else 1

    def down(size: Any, channels: int) -> Graph:
        x = Input(shape(size, channels), name="x")
        h = ops.MaxPool((2, 2), data_format=data_format, name="maxpool_conv.0")(x)
        return Graph(x, _double_conv(h, 2 * channels, "maxpool_conv.1.", data_format), name="Down")

    def up(size: Any, skip_size: Any, channels: int) -> Graph:  # deep features + skip
        x = Input(shape(size, channels), name="x")
        skip = Input(shape(skip_size, channels // 2, ("skip_height", "skip_width")), name="skip")
        h = ops.ConvTranspose(channels // 2, (2, 2), strides=2, data_format=data_format, name="up")(x)
        widths = [(0, 0)] * 4
        for a in spatial:  # the upsampled map padded to the skip's size, as F.pad does
            diff = skip.shape[a] - h.shape[a]
            widths[a] = (diff // 2, diff - diff // 2)
        if any(lo != 0 or hi != 0 for lo, hi in widths):
            h = ops.pad(h, tuple(widths))
        h = ops.concat([skip, h], axis=axis)
        return Graph([x, skip], _double_conv(h, channels // 2, "conv.", data_format), name="Up")

    images = Input(shape(image_size, in_channels), name="images")
    x = Input(shape(image_size, in_channels), name="x")
    h = Graph(x, _double_conv(x, width, "", data_format), name="DoubleConv").as_block("inc")(images)
    skips, channels = [], width
    sizes: list[int | None] = [image_size]
    for k in range(1, depth + 1):
        skips.append(h)
        h = down(sizes[-1], channels).as_block(f"down{k}")(h)
        last = sizes[-1]
        sizes.append(None if last is None else last // 2)
        channels = channels * 2
    for k in range(1, depth + 1):
        size = sizes.pop()
        h = up(size, sizes[-1], channels).as_block(f"up{k}")(h, skips.pop())
        channels = channels // 2
    size = sizes.pop()
    x = Input(shape(size, channels), name="x")
    outc = Graph(x, ops.Conv(num_classes, (1, 1), data_format=data_format, name="conv")(x), name="OutConv")
    return Graph(images, outc.as_block("outc")(h), name="unet")
