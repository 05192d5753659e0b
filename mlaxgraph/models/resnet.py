"""ResNet (torchvision's ``resnet18``, ``resnet34`` and ``resnet50``, v1.5: the
bottleneck strides on its 3 x 3 convolution), with torchvision's module names
(``conv1``, ``bn1``, ``layer1.0`` ... ``layer4.2``, ``fc``) and layouts."""

from __future__ import annotations

import math

from .. import ops
from ..core.errors import ConfigError
from ..ir.graph import Graph, Input
from ..ops import initializers
from .torch_layout import TorchLayout, register_layout

__all__ = ["resnet18", "resnet34", "resnet50"]

_STAGES = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3))}

for _depth in _STAGES:
    register_layout(f"resnet{_depth}", TorchLayout())


class _Spatial:
    """Layer factories for one data format: BatchNorm with PyTorch's numerics (momentum
    0.1 there is 0.9 here: ``new = momentum * old + (1 - momentum) * batch``; the
    running variance updated with the unbiased batch variance)."""

    def __init__(self, data_format: str):
        if data_format not in ("NHWC", "NCHW"):
            raise ConfigError(f"data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
        self.data_format = data_format
        self.axis = -1 if data_format == "NHWC" else 1

    def conv(self, features: int, size: int, stride: int, name: str, padding: int | None = None):
        """torchvision's convolution, initialized as it does: Kaiming normal with
        ``mode="fan_out"`` for ReLU, standard deviation ``sqrt(2 / (features * size**2))``."""
        pad = size // 2 if padding is None else padding
        return ops.Conv(features, (size, size), strides=stride, padding=((pad, pad), (pad, pad)),
                        use_bias=False, data_format=self.data_format, name=name,
                        kernel_init=initializers.normal(math.sqrt(2.0 / (features * size * size))))

    def bn(self, name: str, zero: bool = False):
        """BatchNorm; ``zero``: its scale starts at 0 (``zero_init_residual``)."""
        return ops.BatchNorm(momentum=0.9, epsilon=1e-5, axis=self.axis, unbiased_running_var=True, name=name,
                             scale_init=initializers.zeros if zero else None)

    def shape(self, size, channels: int) -> tuple:
        """An input's shape: ``size`` an int (square) or a (height, width) pair of dims."""
        height, width = (size, size) if isinstance(size, int) else size
        if self.data_format == "NHWC":
            return ("batch", height, width, channels)
        return ("batch", channels, height, width)


def _block(f: _Spatial, kind: str, channels: int, planes: int, stride: int, zero_init_residual: bool) -> Graph:
    """One residual block on ``(height, width, channels)`` inputs of any size;
    torchvision's names."""
    x = Input(f.shape(("height", "width"), channels), name="x")
    out_channels = planes * (4 if kind == "bottleneck" else 1)
    if kind == "basic":
        h = ops.relu(f.bn("bn1")(f.conv(planes, 3, stride, "conv1")(x)))
        h = f.bn("bn2", zero_init_residual)(f.conv(planes, 3, 1, "conv2")(h))
    else:
        h = ops.relu(f.bn("bn1")(f.conv(planes, 1, 1, "conv1")(x)))
        h = ops.relu(f.bn("bn2")(f.conv(planes, 3, stride, "conv2")(h)))
        h = f.bn("bn3", zero_init_residual)(f.conv(out_channels, 1, 1, "conv3")(h))
    shortcut = x
    if stride != 1 or channels != out_channels:
        shortcut = f.bn("downsample.1")(f.conv(out_channels, 1, stride, "downsample.0", padding=0)(x))
    name = "Bottleneck" if kind == "bottleneck" else "BasicBlock"
    return Graph(x, ops.relu(h + shortcut), name=name)


def _resnet(depth: int, num_classes: int, data_format: str, image_size: int | None, width: int,
            zero_init_residual: bool) -> Graph:
    for what, value in (("num_classes", num_classes), ("image_size", image_size), ("width", width)):
        if what == "image_size" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"resnet{depth}: {what} must be a positive int, got {value!r}")
    kind, counts = _STAGES[depth]
    f = _Spatial(data_format)
    size = ("height", "width") if image_size is None else image_size
    images = Input(f.shape(size, 3), name="images")
    h = ops.relu(f.bn("bn1")(f.conv(width, 7, 2, "conv1", padding=3)(images)))
    h = ops.MaxPool((3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), data_format=data_format,
                    name="maxpool")(h)
    channels = width
    for stage, count in enumerate(counts, start=1):
        planes = width * 2 ** (stage - 1)
        stride = 1 if stage == 1 else 2
        h = _block(f, kind, channels, planes, stride, zero_init_residual).as_block(f"layer{stage}.0")(h)
        channels = planes * (4 if kind == "bottleneck" else 1)
        rest = _block(f, kind, channels, planes, 1, zero_init_residual)
        for i in range(1, count):
            h = rest.as_block(f"layer{stage}.{i}")(h)
    h = ops.GlobalAvgPool(data_format=data_format, name="avgpool")(h)
    # nn.Linear's own initialization: uniform in +-1/sqrt(fan_in), the bias too.
    bound = initializers.uniform(1.0 / math.sqrt(channels))
    return Graph(images, ops.Linear(num_classes, kernel_init=bound, bias_init=bound, name="fc")(h),
                 name=f"resnet{depth}")


def resnet18(num_classes: int = 1000, data_format: str = "NHWC", *, image_size: int | None = None,
             width: int = 64, zero_init_residual: bool = False) -> Graph:
    """torchvision's ResNet-18: ``images (batch, height, width, 3)`` (NHWC; or
    ``(batch, 3, height, width)`` with ``data_format="NCHW"``) -> ``logits (batch,
    num_classes)``.

    Blocks ``layer1.0`` ... ``layer4.1`` (``BasicBlock``: ``conv1``, ``bn1``, ``conv2``,
    ``bn2``, and ``downsample.0``/``downsample.1`` where the shape changes); BatchNorm
    epsilon 1e-5 and momentum 0.9 (PyTorch's 0.1 counts the other way). ``width`` is the
    stem's channels (64; the stages have 1, 2, 4 and 8 times as many).

    ``image_size`` None (the default) makes height and width symbolic: any image size
    runs, as torchvision's; an int fixes a square size. Initialization as torchvision's:
    convolutions Kaiming normal (``mode="fan_out"``, ReLU), BatchNorm 1 and 0, ``fc``
    PyTorch's ``nn.Linear`` default (uniform in +-1/sqrt(fan_in)); with
    ``zero_init_residual=True`` the last BatchNorm of each block starts at scale 0, so
    each block starts as the identity.

    Example:
      >>> import mlaxgraph as mg
      >>> mg.models.resnet18(num_classes=10, image_size=32).output_specs
      (f32[batch,10],)
    """
    return _resnet(18, num_classes, data_format, image_size, width, zero_init_residual)


def resnet34(num_classes: int = 1000, data_format: str = "NHWC", *, image_size: int | None = None,
             width: int = 64, zero_init_residual: bool = False) -> Graph:
    """torchvision's ResNet-34: as ``resnet18``, with 3, 4, 6 and 3 blocks per stage."""
    return _resnet(34, num_classes, data_format, image_size, width, zero_init_residual)


def resnet50(num_classes: int = 1000, data_format: str = "NHWC", *, image_size: int | None = None,
             width: int = 64, zero_init_residual: bool = False) -> Graph:
    """torchvision's ResNet-50 (v1.5): as ``resnet34`` with ``Bottleneck`` blocks
    (``conv1`` 1 x 1, ``conv2`` 3 x 3 with the stride, ``conv3`` 1 x 1 to 4 times the
    channels, each followed by its BatchNorm)."""
    return _resnet(50, num_classes, data_format, image_size, width, zero_init_residual)
