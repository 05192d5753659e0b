"""Reading ONNX files safely: the model's bytes parsed, its external data read only
from inside the model's folder and checked against each tensor's size, tensors and
attributes converted to numpy and hashable values. Every failure is an
``mg.SerializationError`` naming the file and the tensor or node."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..core.errors import SerializationError
from .dtypes import CODES

__all__ = ["require_onnx", "load_model", "tensor_to_array", "attribute_value"]

#: Bigger files are refused (a protobuf message is at most 2 GiB).
MAX_MODEL_BYTES = 2 ** 31


def require_onnx() -> Any:
    """The ``onnx`` package, or an error saying how to install it."""
    try:
        import onnx
    except ImportError:  # pragma: no cover - the test environment has it
        raise SerializationError("reading or writing ONNX needs the onnx package: "
                                 "pip install mlaxgraph[onnx]") from None
    return onnx


def load_model(source: Any) -> tuple[Any, str | None]:
    """``(ModelProto, folder)`` from a path or a ModelProto (folder None: external data
    cannot be read then)."""
    onnx = require_onnx()
    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(onnx, bytes(source), "<bytes>"), None
    if isinstance(source, onnx.GraphProto):
        raise SerializationError("from_onnx reads a model (ModelProto), got its graph "
                                 "(GraphProto): pass the model, not model.graph, or "
                                 "onnx.helper.make_model(graph, opset_imports=[...])")
    if hasattr(source, "read"):  # an open file or io.BytesIO
        return _parse(onnx, source.read(), getattr(source, "name", "<file>")), None
    if not isinstance(source, (str, os.PathLike)):
        raise SerializationError(f"from_onnx reads a path, the file's bytes, an open file or "
                                 f"an onnx.ModelProto, got {type(source).__name__}")
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MODEL_BYTES + 1)
    except OSError as e:
        if isinstance(source, str) and ("\n" in source or len(source) > 1024):
            raise SerializationError(
                f"from_onnx got a str that is no path but text ({source[:40]!r}...), such as "
                f"str(model) gives: pass the onnx.ModelProto itself, its bytes "
                f"(model.SerializeToString()) or the .onnx file's path (text such as "
                f"str(model) parses with google.protobuf.text_format.Parse(text, "
                f"onnx.ModelProto()))") from None
        raise SerializationError(f"cannot read the ONNX file {path!r}: {e.strerror}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise SerializationError(f"{path!r} is larger than 2 GiB, the most a protobuf holds")
    return _parse(onnx, data, path), os.path.dirname(os.path.abspath(path))


def _parse(onnx: Any, data: bytes, where: str) -> Any:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError, or a RuntimeWarning turned error
        raise SerializationError(f"{where} is not an ONNX model (it does not parse: "
                                 f"{type(e).__name__})") from None
    if not model.HasField("graph"):
        raise SerializationError(f"{where} holds no graph: it is not an ONNX model, or it "
                                 f"is truncated")
    return model


def _external_bytes(tensor: Any, folder: str | None) -> bytes:
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    if folder is None:
        raise SerializationError(f"initializer {tensor.name!r} keeps its data in the file "
                                 f"{location!r}: give from_onnx the model's path, not its proto")
    if not location or os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise SerializationError(f"initializer {tensor.name!r} names external data "
                                 f"{location!r} outside the model's folder")
    path = os.path.realpath(os.path.join(folder, location))
    if os.path.commonpath([path, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise SerializationError(f"initializer {tensor.name!r} names external data "
                                 f"{location!r} outside the model's folder")
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        raise SerializationError(f"initializer {tensor.name!r}: its external data's offset "
                                 f"or length is not a number") from None
    try:
        total = os.path.getsize(path)
        if offset < 0 or offset > total or (length is not None and (
                length < 0 or offset + length > total)):
            raise SerializationError(f"initializer {tensor.name!r}: bytes {offset}.."
                                     f"{offset + (length or 0)} lie beyond {location!r} "
                                     f"({total} bytes)")
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(total - offset if length is None else length)
    except OSError as e:
        raise SerializationError(f"initializer {tensor.name!r}: cannot read its external "
                                 f"data {location!r}: {e.strerror}") from None


def tensor_to_array(tensor: Any, folder: str | None = None) -> np.ndarray:
    """A TensorProto as a numpy array, its size checked against its shape."""
    onnx = require_onnx()
    from onnx import numpy_helper

    if tensor.data_type not in CODES:
        raise SerializationError(f"tensor {tensor.name!r} has element type "
                                 f"{tensor.data_type}, which mlaxgraph cannot hold "
                                 f"(strings and unknown types)")
    if any(d < 0 for d in tensor.dims):
        raise SerializationError(f"tensor {tensor.name!r} has a negative dim {tuple(tensor.dims)}")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.raw_data = _external_bytes(tensor, folder)
        del copy.external_data[:]
        copy.data_location = onnx.TensorProto.DEFAULT
        tensor = copy
    count = int(np.prod(tensor.dims, dtype=np.int64))
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as e:  # a raw_data of the wrong length, a bad field
        raise SerializationError(f"tensor {tensor.name!r} of shape {tuple(tensor.dims)} "
                                 f"does not hold its data: {str(e).splitlines()[0][:200]}") from None
    if array.size != count:
        raise SerializationError(f"tensor {tensor.name!r} holds {array.size} values, its "
                                 f"shape {tuple(tensor.dims)} needs {count}")
    return array


def attribute_value(attr: Any, folder: str | None, node: str) -> Any:
    """An attribute as a hashable value: ints, floats, strings, tuples of them, tensors
    as encoded arrays; a graph (an If, Loop or Scan body) as ``("graph", its bytes in
    hex)``, a string, so graphs holding it save as others do."""
    from .layer import encode_array

    onnx = require_onnx()
    kind = onnx.AttributeProto
    t = attr.type
    if t == kind.FLOAT:
        return float(attr.f)
    if t == kind.INT:
        return int(attr.i)
    if t == kind.STRING:
        return attr.s.decode("utf-8", "replace")
    if t == kind.TENSOR:
        return encode_array(tensor_to_array(attr.t, folder))
    if t == kind.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if t == kind.INTS:
        return tuple(int(v) for v in attr.ints)
    if t == kind.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in attr.strings)
    if t == kind.TENSORS:
        return tuple(encode_array(tensor_to_array(v, folder)) for v in attr.tensors)
    if t == kind.GRAPH:
        return ("graph", attr.g.SerializeToString().hex())
    raise SerializationError(f"node {node!r}: attribute {attr.name!r} holds a "
                             f"{kind.AttributeType.Name(t) if t in kind.AttributeType.values() else t}"
                             f" (subgraphs and sparse tensors are not supported)")
