"""Helpers of the pooling formulation tests: a pooling layer's padding pairs and its
apply on one array."""

from jax import lax


def pads(layer, shape):
    """The ``(low, high)`` pairs ``layer`` pads an input of ``shape`` with."""
    spatial = shape[1:-1] if layer.channels_last else shape[2:]
    if isinstance(layer.padding, str):
        return lax.padtype_to_pads(spatial, layer.window, layer.strides, layer.padding)
    return list(layer.padding)


def pool(layer, x):
    """``layer`` applied to ``x`` (no weights, training mode)."""
    return layer.apply({}, {}, (x,), rng=None, inference_mode=False)[0][0]


def reduce_window(layer, x, init, op):
    """``layer``'s windows reduced by ``op`` with ``lax.reduce_window`` (every peer's form,
    the one the sliced forms replaced)."""
    if layer.channels_last:
        window, strides = (1, *layer.window, 1), (1, *layer.strides, 1)
        padding = layer.padding if isinstance(layer.padding, str) else ((0, 0), *layer.padding, (0, 0))
    else:
        window, strides = (1, 1, *layer.window), (1, 1, *layer.strides)
        padding = layer.padding if isinstance(layer.padding, str) else ((0, 0), (0, 0), *layer.padding)
    return lax.reduce_window(x, init, op, window, strides, padding)
