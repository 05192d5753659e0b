"""PyTorch's checkpoint files (``torch.save``'s zip format: torchvision's ``.pth``,
Hugging Face's ``pytorch_model.bin``) read without torch and without running code.

The format (PyTorch's ``torch/serialization.py``): a zip archive whose entries sit
under one folder, ``<name>/data.pkl`` (a pickle of the state dict) and
``<name>/data/<key>`` (each storage's raw bytes, little-endian unless
``<name>/byteorder`` says ``big``). The pickle names each storage by a persistent id
``("storage", <storage class>, key, location, numel)`` and rebuilds each tensor with
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``.

The pickle is read by an unpickler that knows a fixed table of globals: the storage
classes (as dtypes), the tensor and parameter rebuilders (recording where each
tensor's bytes are) and ``collections.OrderedDict``. Every other global (``os.system``,
``builtins.eval``, any class) is refused before anything is called, so reading a
hostile file runs nothing. Arrays are read lazily from the archive, each checked to
lie inside its storage.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import os
import pickle
import zipfile
from typing import Any

import numpy as np

from ..core.errors import SerializationError

__all__ = ["TorchReader", "is_torch_zip"]

_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
             "BoolStorage": "bool"}


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclasses.dataclass(frozen=True)
class _Storage:
    dtype: str


@dataclasses.dataclass(frozen=True)
class _StorageRef:
    key: str
    dtype: str
    numel: int


@dataclasses.dataclass(frozen=True)
class _Tensor:
    storage: _StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    if not isinstance(storage, _StorageRef):
        raise SerializationError("a tensor is rebuilt from something that is not a storage")
    ints = (offset, *size, *stride)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) or len(size) != len(stride):
        raise SerializationError(f"a tensor has a bad offset, size or stride: {offset!r}, {size!r}, {stride!r}")
    return _Tensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_parameter(data, *_ignored):
    return data


def _ordered_dict(*args):
    return collections.OrderedDict(*args)


#: (module, name) -> what the unpickler gives for it; nothing else is looked up.
_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _Storage(dtype) for name, dtype in _STORAGES.items()},
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str):
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _GLOBALS[(module, name)]
        except KeyError:
            raise SerializationError(
                f"{self.where}: the pickle refers to {module}.{name}, which a state dict does "
                f"not hold (only tensors, their storages and ordered dicts are read); the file "
                f"is refused and nothing in it was run") from None

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage) and isinstance(pid[2], str)
                and isinstance(pid[4], int) and not isinstance(pid[4], bool) and pid[4] >= 0):
            raise SerializationError(f"{self.where}: a persistent id that is not a storage: {pid!r:.100}")
        return _StorageRef(pid[2], pid[1].dtype, pid[4])


def is_torch_zip(path: str) -> bool:
    """Whether ``path`` is a zip archive (torch's format since PyTorch 1.6)."""
    return zipfile.is_zipfile(path)


class TorchReader:
    """A ``torch.save`` zip file's state dict: names, shapes and arrays, as
    ``SafetensorsReader`` gives them."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.zip: zipfile.ZipFile | None = None
        self.tensors: dict[str, _Tensor] = {}

    def __enter__(self) -> TorchReader:
        where = self.path
        if not zipfile.is_zipfile(where):
            with open(where, "rb") as f:
                if f.read(4) == b"PK\x03\x04":  # a zip's first entry, without its directory
                    raise SerializationError(
                        f"{where}: a zip archive cut short or damaged (its directory, at the "
                        f"end of the file, is missing or unreadable): the file is truncated; "
                        f"copy or download it again")
            raise SerializationError(
                f"{where}: not a zip archive: PyTorch files are read in torch.save's zip format "
                f"(PyTorch 1.6 and later); an older file can be re-saved with a current torch, "
                f"or converted to .safetensors")
        try:
            self.zip = zipfile.ZipFile(where)
            names = self.zip.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise SerializationError(f"{where}: a damaged zip archive ({e})") from None
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise SerializationError(f"{where}: not a torch.save archive: expected one "
                                     f"<name>/data.pkl, found {len(pickles)}")
        self.root = pickles[0][:-len("data.pkl")]
        big = f"{self.root}byteorder" in names and self._read(f"{self.root}byteorder").strip() == b"big"
        self.byteorder = ">" if big else "<"
        try:
            top = _Unpickler(self._read(pickles[0]), where).load()
        except SerializationError:
            raise
        except Exception as e:  # a malformed pickle: its opcodes, not code, failed
            raise SerializationError(f"{where}: the pickle is damaged ({type(e).__name__}: {e})") from None
        if not isinstance(top, dict) or not all(isinstance(k, str) for k in top):
            raise SerializationError(f"{where}: holds a {type(top).__name__}, not a state dict "
                                     f"(a mapping of names to tensors)")
        others = [k for k, v in top.items() if not isinstance(v, _Tensor)]
        if others:
            raise SerializationError(
                f"{where}: not a flat state dict: {others[0]!r} holds a "
                f"{type(top[others[0]]).__name__}, not a tensor (a checkpoint of a training run "
                f"holds the model's state dict under one of its keys: save that one)")
        for name, tensor in top.items():
            itemsize = _dtype(tensor.storage.dtype).itemsize
            end = tensor.offset + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride)) + 1
            if math.prod(tensor.shape) and end > tensor.storage.numel:
                raise SerializationError(f"{where}: tensor {name!r} reaches past its storage "
                                         f"({end} > {tensor.storage.numel} elements)")
            info = self._info(tensor.storage.key)
            if info.file_size != tensor.storage.numel * itemsize:
                raise SerializationError(f"{where}: storage {tensor.storage.key!r} of {name!r} holds "
                                         f"{info.file_size} bytes; its {tensor.storage.numel} "
                                         f"{tensor.storage.dtype} elements need "
                                         f"{tensor.storage.numel * itemsize}")
        self.tensors = dict(top)
        return self

    def _info(self, key: str) -> zipfile.ZipInfo:
        assert self.zip is not None
        try:
            return self.zip.getinfo(f"{self.root}data/{key}")
        except KeyError:
            raise SerializationError(f"{self.path}: storage {key!r} is missing from the archive") from None

    def _read(self, name: str) -> bytes:
        assert self.zip is not None
        try:
            return self.zip.read(name)
        except (zipfile.BadZipFile, OSError, ValueError) as e:  # a CRC mismatch among them
            raise SerializationError(f"{self.path}: entry {name!r} is damaged ({e})") from None

    def __exit__(self, *exc) -> None:
        if self.zip is not None:
            self.zip.close()
            self.zip = None

    def names(self) -> list[str]:
        return list(self.tensors)

    def spec(self, name: str) -> tuple[str | None, tuple[int, ...]]:
        tensor = self.tensors[name]
        return tensor.storage.dtype, tensor.shape

    def array(self, name: str) -> np.ndarray:
        tensor = self.tensors[name]
        dtype = _dtype(tensor.storage.dtype)
        if tensor.storage.dtype not in ("bfloat16", "bool", "uint8", "int8"):
            dtype = dtype.newbyteorder(">" if self.byteorder == ">" else "<")
        flat = np.frombuffer(self._read(f"{self.root}data/{tensor.storage.key}"), dtype)
        if not math.prod(tensor.shape):
            return np.zeros(tensor.shape, _dtype(tensor.storage.dtype))
        view = np.lib.stride_tricks.as_strided(
            flat[tensor.offset:], tensor.shape, tuple(s * flat.itemsize for s in tensor.stride))
        return np.array(view, dtype=_dtype(tensor.storage.dtype))
