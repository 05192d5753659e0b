"""A 2D U-Net for segmentation, in the layout of the widely used PyTorch U-Net
(milesial's Pytorch-UNet with transposed-convolution upsampling): blocks ``inc``,
``down1`` ..., ``up1`` ..., ``outc``, their layers named as its modules."""

from __future__ import annotations

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
         image_size: int = 128, data_format: str = "NHWC") -> Graph:
    """A U-Net: ``images (batch, image_size, image_size, in_channels)`` (NHWC; or
    channel-first with ``data_format="NCHW"``) -> per-pixel ``logits (batch,
    image_size, image_size, num_classes)``.

    ``inc`` (a double convolution to ``width`` channels); ``down1`` ... ``down{depth}``
    (2 x 2 max pool, then a double convolution doubling the channels); ``up1`` ...
    ``up{depth}`` (a 2 x 2 transposed convolution with stride 2 halving the channels,
    the skip connection concatenated before it, a double convolution); ``outc`` (a
    1 x 1 convolution). A double convolution is (3 x 3 convolution without bias,
    BatchNorm, ReLU) twice. The defaults (``width=64``, ``depth=4``) are the original
    U-Net's sizes. ``image_size`` must be divisible by ``2 ** depth``.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.models.unet(width=8, depth=2, image_size=32).output_specs
      (f32[batch,32,32,2],)
    """
    for what, value in (("in_channels", in_channels), ("num_classes", num_classes),
                        ("width", width), ("depth", depth), ("image_size", image_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"unet: {what} must be a positive int, got {value!r}")
    if data_format not in ("NHWC", "NCHW"):
        raise ConfigError(f"unet: data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
    if image_size % 2 ** depth:
        raise ConfigError(f"unet: image_size {image_size} is not divisible by 2 ** depth = {2 ** depth}")

    def shape(size: int, channels: int) -> tuple:
        return ("batch", size, size, channels) if data_format == "NHWC" else ("batch", channels, size, size)

    axis = -1 if data_format == "NHWC" else 1

    def down(size: int, channels: int) -> Graph:
        x = Input(shape(size, channels), name="x")
        h = ops.MaxPool((2, 2), data_format=data_format, name="maxpool_conv.0")(x)
        return Graph(x, _double_conv(h, 2 * channels, "maxpool_conv.1.", data_format), name="Down")

    def up(size: int, channels: int) -> Graph:  # deep features (size, channels) + skip
        x = Input(shape(size, channels), name="x")
        skip = Input(shape(2 * size, channels // 2), name="skip")
        h = ops.ConvTranspose(channels // 2, (2, 2), strides=2, data_format=data_format, name="up")(x)
        h = ops.concat([skip, h], axis=axis)
        return Graph([x, skip], _double_conv(h, channels // 2, "conv.", data_format), name="Up")

    images = Input(shape(image_size, in_channels), name="images")
    x = Input(shape(image_size, in_channels), name="x")
    h = Graph(x, _double_conv(x, width, "", data_format), name="DoubleConv").as_block("inc")(images)
    skips, size, channels = [], image_size, width
    for k in range(1, depth + 1):
        skips.append(h)
        h = down(size, channels).as_block(f"down{k}")(h)
        size, channels = size // 2, channels * 2
    for k in range(1, depth + 1):
        h = up(size, channels).as_block(f"up{k}")(h, skips.pop())
        size, channels = size * 2, channels // 2
    x = Input(shape(size, channels), name="x")
    outc = Graph(x, ops.Conv(num_classes, (1, 1), data_format=data_format, name="conv")(x), name="OutConv")
    return Graph(images, outc.as_block("outc")(h), name="unet")
