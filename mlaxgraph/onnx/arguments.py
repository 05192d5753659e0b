"""The arguments ``mg.from_onnx`` takes, written out for its message on an unknown
keyword, and where the peers' names for them (onnxruntime's ``InferenceSession``,
onnx2torch, jaxonnxruntime) go here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.errors import ConfigError
from ..core.specs import is_int

__all__ = ["FROM_ONNX_HINTS", "FROM_ONNX_SIGNATURE", "check_sizes_are_ints"]

FROM_ONNX_SIGNATURE = "from_onnx(source, dims=None, layers=True, blocks=True, sizes=None, shapes=None)"

_RUN_ON = ("the graph runs on JAX's devices: mg.compile it, and place the weights with "
           "jax.device_put")
FROM_ONNX_HINTS = {
    "providers": f"onnxruntime's providers are not needed; {_RUN_ON}",
    "provider_options": f"onnxruntime's provider_options are not needed; {_RUN_ON}",
    "sess_options": "onnxruntime's sess_options are not needed: mg.compile(graph) "
                    "gives the jitted model, which XLA optimizes",
    "input_shapes": "input_shapes is shapes=: {input name: shape}",
    "input_shape": "input_shape is shapes=: {input name: shape}",
    "dynamic_axes": "symbolic dims stay symbolic; dims= binds them by name",
    "opset": "the file's opset is read from the file",
    "opset_version": "the file's opset is read from the file",
    "load_external_data": "external data is read from the file's folder whenever it has any",
}


def check_sizes_are_ints(dims: Any) -> None:
    """``from_onnx(dims=...)`` is a mapping, its sizes ints (2.5, "3" and True were read
    as 2, 3, 1)."""
    if dims is not None and not isinstance(dims, Mapping):
        raise ConfigError(f"from_onnx(dims=...) takes a mapping {{dim name: size}} "
                          f"(dims={{'batch': 8}}), got {type(dims).__name__}")
    for name, size in (dims or {}).items():
        if not is_int(size):
            raise ConfigError(f"from_onnx(dims=...): the size of {name!r} is an int, got "
                              f"{size!r} ({type(size).__name__})")
