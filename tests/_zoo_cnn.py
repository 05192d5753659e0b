"""Independent float64 NumPy reference for two classic CNNs.

Written from the formulas of the original code:

* torchvision's ResNet (v1.5: in a Bottleneck block the stride sits on the
  3x3 convolution ``conv2``), depths 18/34 (BasicBlock) and 50 (Bottleneck);
* milesial/Pytorch-UNet's U-Net with ``bilinear=False`` (transposed-convolution
  upsampling), generalised to ``depth`` down steps and base width ``width``.

State dicts use the original PyTorch parameter names, shapes and layouts
(convolution weights OIHW, ConvTranspose2d weights (in, out, kH, kW)).
Forward passes take NHWC images, compute in float64 and run in inference mode
(BatchNorm uses its running statistics).  Only NumPy is used.
"""

import numpy as np

# --------------------------------------------------------------------------
# Building blocks (activations are NHWC float64 arrays)
# --------------------------------------------------------------------------


def conv2d(x, w, b=None, stride=1, padding=0):
    """Cross-correlation of NHWC ``x`` with OIHW ``w`` (PyTorch Conv2d)."""
    n, h, wd, c = x.shape
    o, i, kh, kw = w.shape
    assert i == c, (w.shape, x.shape)
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (wd + 2 * padding - kw) // stride + 1
    # im2col: one strided window per kernel offset -> (n, ho, wo, kh*kw*c)
    cols = [xp[:, a:a + stride * ho:stride, q:q + stride * wo:stride, :]
            for a in range(kh) for q in range(kw)]
    patches = np.concatenate(cols, axis=-1)
    wmat = np.asarray(w, np.float64).transpose(2, 3, 1, 0).reshape(kh * kw * c, o)
    out = patches @ wmat
    if b is not None:
        out = out + np.asarray(b, np.float64)
    return out


def conv_transpose2d(x, w, b=None, stride=2):
    """PyTorch ConvTranspose2d (no padding) with ``w`` of shape (in, out, kH, kW).

    Each input pixel (i, j) scatters ``x[i, j, :] @ w[:, :, a, q]`` to output
    pixel (i*stride + a, j*stride + q).
    """
    n, h, wd, c = x.shape
    i, o, kh, kw = w.shape
    assert i == c, (w.shape, x.shape)
    w = np.asarray(w, np.float64)
    out = np.zeros((n, (h - 1) * stride + kh, (wd - 1) * stride + kw, o))
    for a in range(kh):
        for q in range(kw):
            out[:, a:a + stride * h:stride, q:q + stride * wd:stride, :] += x @ w[:, :, a, q]
    if b is not None:
        out = out + np.asarray(b, np.float64)
    return out


def batch_norm(x, sd, prefix, eps=1e-5):
    """Inference-mode BatchNorm2d over the channel (last) axis."""
    g, beta, mean, var = (np.asarray(sd[prefix + k], np.float64)
                          for k in (".weight", ".bias", ".running_mean", ".running_var"))
    return (x - mean) / np.sqrt(var + eps) * g + beta


def relu(x):
    return np.maximum(x, 0.0)


def max_pool(x, kernel, stride, padding=0):
    """Max pooling over H, W; padded positions hold -inf (never selected)."""
    n, h, wd, c = x.shape
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
                constant_values=-np.inf)
    ho = (h + 2 * padding - kernel) // stride + 1
    wo = (wd + 2 * padding - kernel) // stride + 1
    out = np.full((n, ho, wo, c), -np.inf)
    for a in range(kernel):
        for q in range(kernel):
            out = np.maximum(out, xp[:, a:a + stride * ho:stride, q:q + stride * wo:stride, :])
    return out


def global_avg_pool(x):
    return x.mean(axis=(1, 2))


# --------------------------------------------------------------------------
# Random parameters with PyTorch names / layouts
# --------------------------------------------------------------------------


def _conv_w(rng, o, i, kh, kw):
    return (rng.standard_normal((o, i, kh, kw)) * np.sqrt(2.0 / (i * kh * kw))).astype(np.float32)


def _add_bn(sd, rng, prefix, c):
    sd[prefix + ".weight"] = (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32)
    sd[prefix + ".bias"] = (0.1 * rng.standard_normal(c)).astype(np.float32)
    sd[prefix + ".running_mean"] = (0.1 * rng.standard_normal(c)).astype(np.float32)
    sd[prefix + ".running_var"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
    sd[prefix + ".num_batches_tracked"] = np.array(0, dtype=np.int64)


# --------------------------------------------------------------------------
# ResNet (torchvision, v1.5)
# --------------------------------------------------------------------------

_RESNET = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
           50: ("bottleneck", [3, 4, 6, 3])}


def _resnet_blocks(depth, width):
    """Yield (prefix, kind, in_ch, planes, stride, has_downsample) per block."""
    kind, layers = _RESNET[depth]
    expansion = 4 if kind == "bottleneck" else 1
    inplanes = width
    for s, nblocks in enumerate(layers):
        planes = width * 2 ** s
        for j in range(nblocks):
            stride = 2 if (s > 0 and j == 0) else 1
            down = stride != 1 or inplanes != planes * expansion
            yield f"layer{s + 1}.{j}", kind, inplanes, planes, stride, down
            inplanes = planes * expansion


def resnet_state_dict(depth, num_classes=10, seed=0, width=64):
    """Random torchvision-ResNet state dict (float32 params, OIHW convs)."""
    rng = np.random.default_rng(seed)
    sd = {"conv1.weight": _conv_w(rng, width, 3, 7, 7)}
    _add_bn(sd, rng, "bn1", width)
    features = width
    for p, kind, cin, planes, _, down in _resnet_blocks(depth, width):
        if kind == "basic":
            shapes = [(planes, cin, 3, 3), (planes, planes, 3, 3)]
        else:
            shapes = [(planes, cin, 1, 1), (planes, planes, 3, 3), (planes * 4, planes, 1, 1)]
        for k, shape in enumerate(shapes, start=1):
            sd[f"{p}.conv{k}.weight"] = _conv_w(rng, *shape)
            _add_bn(sd, rng, f"{p}.bn{k}", shape[0])
        features = shapes[-1][0]
        if down:
            sd[f"{p}.downsample.0.weight"] = _conv_w(rng, features, cin, 1, 1)
            _add_bn(sd, rng, f"{p}.downsample.1", features)
    sd["fc.weight"] = (0.1 * rng.standard_normal((num_classes, features))).astype(np.float32)
    sd["fc.bias"] = (0.1 * rng.standard_normal(num_classes)).astype(np.float32)
    return sd


def _resnet_block(sd, p, kind, x, stride, down, eps):
    if kind == "basic":
        y = relu(batch_norm(conv2d(x, sd[p + ".conv1.weight"], stride=stride, padding=1), sd, p + ".bn1", eps))
        y = batch_norm(conv2d(y, sd[p + ".conv2.weight"], padding=1), sd, p + ".bn2", eps)
    else:
        y = relu(batch_norm(conv2d(x, sd[p + ".conv1.weight"]), sd, p + ".bn1", eps))
        y = relu(batch_norm(conv2d(y, sd[p + ".conv2.weight"], stride=stride, padding=1), sd, p + ".bn2", eps))
        y = batch_norm(conv2d(y, sd[p + ".conv3.weight"]), sd, p + ".bn3", eps)
    identity = x
    if down:
        identity = batch_norm(conv2d(x, sd[p + ".downsample.0.weight"], stride=stride),
                              sd, p + ".downsample.1", eps)
    return relu(y + identity)


def resnet_forward(sd, depth, images_nhwc, eps=1e-5):
    """Logits (batch, num_classes), float64, for NHWC images."""
    x = np.asarray(images_nhwc, np.float64)
    width = sd["conv1.weight"].shape[0]
    x = relu(batch_norm(conv2d(x, sd["conv1.weight"], stride=2, padding=3), sd, "bn1", eps))
    x = max_pool(x, 3, 2, padding=1)
    for p, kind, _, _, stride, down in _resnet_blocks(depth, width):
        x = _resnet_block(sd, p, kind, x, stride, down, eps)
    x = global_avg_pool(x)
    return x @ np.asarray(sd["fc.weight"], np.float64).T + np.asarray(sd["fc.bias"], np.float64)


# --------------------------------------------------------------------------
# U-Net (milesial/Pytorch-UNet, bilinear=False)
# --------------------------------------------------------------------------


def _add_double_conv(sd, rng, prefix, cin, cout):
    sd[prefix + ".0.weight"] = _conv_w(rng, cout, cin, 3, 3)
    _add_bn(sd, rng, prefix + ".1", cout)
    sd[prefix + ".3.weight"] = _conv_w(rng, cout, cout, 3, 3)
    _add_bn(sd, rng, prefix + ".4", cout)


def unet_state_dict(in_channels=3, num_classes=2, width=16, depth=3, seed=0):
    """Random Pytorch-UNet state dict (bilinear=False; width 64, depth 4 is the original)."""
    rng = np.random.default_rng(seed)
    sd = {}
    _add_double_conv(sd, rng, "inc.double_conv", in_channels, width)
    for k in range(1, depth + 1):
        _add_double_conv(sd, rng, f"down{k}.maxpool_conv.1.double_conv",
                         width * 2 ** (k - 1), width * 2 ** k)
    for k in range(1, depth + 1):
        cin = width * 2 ** (depth - k + 1)
        sd[f"up{k}.up.weight"] = _conv_w(rng, cin, cin // 2, 2, 2)  # (in, out, kH, kW)
        sd[f"up{k}.up.bias"] = (0.1 * rng.standard_normal(cin // 2)).astype(np.float32)
        _add_double_conv(sd, rng, f"up{k}.conv.double_conv", cin, cin // 2)
    sd["outc.conv.weight"] = _conv_w(rng, num_classes, width, 1, 1)
    sd["outc.conv.bias"] = (0.1 * rng.standard_normal(num_classes)).astype(np.float32)
    return sd


def _double_conv(sd, prefix, x, eps):
    x = relu(batch_norm(conv2d(x, sd[prefix + ".0.weight"], padding=1), sd, prefix + ".1", eps))
    return relu(batch_norm(conv2d(x, sd[prefix + ".3.weight"], padding=1), sd, prefix + ".4", eps))


def unet_forward(sd, images_nhwc, depth=3, eps=1e-5):
    """Logits (batch, H, W, num_classes), float64, NHWC. Sizes not divisible by
    2**depth: the pools round down, and each upsampled map is zero-padded to its skip's
    size, half the difference before and the rest after (Pytorch-UNet's ``Up.forward``:
    ``F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])``)."""
    x = np.asarray(images_nhwc, np.float64)
    skips = [_double_conv(sd, "inc.double_conv", x, eps)]
    for k in range(1, depth + 1):
        pooled = max_pool(skips[-1], 2, 2)
        skips.append(_double_conv(sd, f"down{k}.maxpool_conv.1.double_conv", pooled, eps))
    x = skips.pop()
    for k in range(1, depth + 1):
        up = conv_transpose2d(x, sd[f"up{k}.up.weight"], sd[f"up{k}.up.bias"], stride=2)
        skip = skips.pop()
        dy, dx = skip.shape[1] - up.shape[1], skip.shape[2] - up.shape[2]
        up = np.pad(up, ((0, 0), (dy // 2, dy - dy // 2), (dx // 2, dx - dx // 2), (0, 0)))
        x = _double_conv(sd, f"up{k}.conv.double_conv", np.concatenate([skip, up], axis=-1), eps)
    return conv2d(x, sd["outc.conv.weight"], sd["outc.conv.bias"])
