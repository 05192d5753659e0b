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
