"""The weights file: safetensors, written atomically, read through the safetensors
library with every header checked.

Layout (docs/file_format.md): one safetensors file; arrays named ``params/<path>`` and
``state/<path>``, where ``<path>`` joins the keys of the nested params dict with ``/``
(``params/conv1/kernel``, ``params/res1/conv_a/kernel``); the header's ``__metadata__``
holds the graph JSON and the param dtype. bfloat16 arrays are stored as safetensors'
own ``BF16`` type (read by PyTorch, Flax and the safetensors tools as bfloat16), not
as raw uint16 bits.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..core.errors import SerializationError

if TYPE_CHECKING:
    from safetensors import safe_open

__all__ = ["SAFETENSORS_DTYPES", "flatten_tree", "rebuild_tree", "write_atomic",
           "write_safetensors", "SafetensorsReader"]

#: numpy dtype name -> safetensors dtype code.
SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_DTYPE_NAMES = {code: name for name, code in SAFETENSORS_DTYPES.items()}


# --- trees of arrays ------------------------------------------------------------------


def flatten_tree(tree: Any, prefix: str, what: str) -> dict[str, Any]:
    """``{prefix/key/key: leaf}`` of a nested dict whose leaves are arrays.

    Raises ``SerializationError`` for keys that are not strings or that contain
    ``/`` (which would make two paths one), and for other containers."""
    out: dict[str, Any] = {}

    def walk(node, path):
        if isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str) or not key or "/" in key:
                    raise SerializationError(f"{what}: the key {key!r} under {path!r} is not a "
                                             f"non-empty string without '/'")
                walk(value, f"{path}/{key}")
        elif hasattr(node, "shape") and hasattr(node, "dtype"):
            out[path] = node
        else:
            raise SerializationError(f"{what}: {path!r} holds a {type(node).__name__}; params "
                                     f"and state are nested dicts of arrays")

    if not isinstance(tree, Mapping):
        raise SerializationError(f"{what} must be a dict (as init returns), got "
                                 f"{type(tree).__name__}")
    walk(tree, prefix)
    return out


def rebuild_tree(template: Mapping, prefix: str, leaf: Callable[[str], Any]) -> dict:
    """A nested dict shaped like ``template`` whose leaves are ``leaf(path)``."""
    return {key: rebuild_tree(value, f"{prefix}/{key}", leaf) if isinstance(value, Mapping)
            else leaf(f"{prefix}/{key}") for key, value in template.items()}


# --- writing --------------------------------------------------------------------------


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Writes a file so that ``path`` holds either its old content or the complete new
    one, whenever the process or the machine stops.

    ``write(f)`` writes to a new file in the same directory, which is flushed and
    fsync'ed, then renamed over ``path`` with ``os.replace`` (atomic on POSIX and
    Windows), and the directory is fsync'ed so the rename itself is durable. On an
    error the new file is removed and ``path`` is untouched. A process killed
    mid-write leaves at most a stray ``.<name>.<random>.tmp`` file beside ``path``.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    if not base:
        raise SerializationError(f"cannot save to {path!r}: it names a directory")
    try:
        info = os.stat(path)
        # Keep the permissions of the file replaced (not of a directory in the way).
        mode = stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else None
    except OSError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:
        temp = os.path.join(directory, f".{base[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temp, flags, 0o666)  # the umask applies, as for any new file
            break
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None and hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows: no directory handles to sync
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory; the rename still holds
        pass
    finally:
        os.close(fd)


def _little_endian(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    array = np.require(array, requirements="C")
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and struct.pack("=H", 1) != b"\x01\x00"):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def write_safetensors(f: BinaryIO, arrays: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str]) -> None:
    """Writes ``arrays`` (numpy, little-endian after conversion) and string ``metadata``
    to ``f`` in the safetensors format: an 8-byte little-endian header length, the JSON
    header (keys sorted, padded with spaces to a multiple of 8 bytes), then the data,
    largest item size first so that each array is aligned to its item size."""
    prepared = {}
    for name, array in arrays.items():
        array = _little_endian(np.asarray(array))
        if array.dtype.name not in SAFETENSORS_DTYPES:
            raise SerializationError(f"array {name!r} has dtype {array.dtype}, which the "
                                     f"weights file cannot hold")
        prepared[name] = array
    order = sorted(prepared, key=lambda k: (-prepared[k].dtype.itemsize, k))
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name in order:
        array = prepared[name]
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype.name],
                        "shape": [int(d) for d in array.shape],
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for name in order:
        array = prepared[name]
        if array.size:
            f.write(array.reshape(-1).view(np.uint8).data)


# --- reading --------------------------------------------------------------------------


class SafetensorsReader:
    """A safetensors file opened through the safetensors library (which checks the
    header: its length, JSON, dtypes, shapes against offsets, offsets against the file
    size, no overlaps or holes). Reads with ``pread`` rather than ``mmap`` so that a
    file truncated under us is an error, not a crash (SIGBUS).

    Use as a context manager; any failure to parse is a ``SerializationError``.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._file: safe_open | None = None
        # What ``safe_open.__enter__`` returns, set by ``__enter__``; safetensors' stubs
        # leave that method's return type out.
        self._handle: Any = None

    def __enter__(self) -> SafetensorsReader:
        try:
            import safetensors
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise SerializationError("reading weights files needs the safetensors package: "
                                     "pip install safetensors") from e
        # Errors opening the path (missing, a directory, no permission) are OSErrors,
        # as for any file; only a file's content makes a SerializationError.
        with open(self.path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
        if len(head) < 8:
            raise SerializationError(f"{self.path}: not a weights file: {size} bytes, shorter "
                                     f"than a safetensors header")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise SerializationError(f"{self.path}: the header claims {header_len} bytes but "
                                     f"the file has {size - 8} after its length field "
                                     f"(truncated or not a safetensors file)")
        try:
            self._file = safetensors.safe_open(self.path, framework="numpy", backend="pread")
            self._handle = self._file.__enter__()
        except Exception as e:  # SafetensorError, or anything the Rust side reports
            raise SerializationError(f"{self.path}: not a valid safetensors file: {e}") from None
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.__exit__(*exc)

    def _call(self, what: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as e:
            raise SerializationError(f"{self.path}: cannot read {what}: {e}") from None

    def metadata(self) -> dict[str, str]:
        return self._call("the header metadata", self._handle.metadata) or {}

    def names(self) -> list[str]:
        return list(self._call("the array names", self._handle.keys))

    def spec(self, name: str) -> tuple[str | None, tuple[int, ...]]:
        """(numpy dtype name or None for one mlaxgraph does not read, shape) of an array,
        from the header alone."""
        view = self._call(f"array {name!r}", self._handle.get_slice, name)
        code = self._call(f"array {name!r}", view.get_dtype)
        shape = tuple(self._call(f"array {name!r}", view.get_shape))
        return _DTYPE_NAMES.get(code), shape

    def array(self, name: str) -> np.ndarray:
        return self._call(f"array {name!r}", self._handle.get_tensor, name)


def iter_paths(tree: Mapping, prefix: str) -> Iterator[str]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from iter_paths(value, f"{prefix}/{key}")
        else:
            yield f"{prefix}/{key}"
