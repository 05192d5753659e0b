"""The weights file: safetensors, written atomically, read through the safetensors
library with every header checked.

Layout (docs/file_format.md): one safetensors file; arrays named ``params/<path>`` and
``state/<path>``, where ``<path>`` joins the keys of the nested params dict with ``/``
(``params/conv1/kernel``, ``params/res1/conv_a/kernel``); the header's ``__metadata__``
holds the graph JSON and the param dtype. bfloat16 arrays are stored as safetensors'
own ``BF16`` type (read by PyTorch, Flax and the safetensors tools as bfloat16), not
as raw uint16 bits.

Integrity: every file written here carries, in its ``__metadata__``, the blake2b digest
of each array's bytes (``mlaxgraph.checksums``) and of the header itself
(``mlaxgraph.header_checksum``, computed over the header's bytes with its own value
written as zeros), so together they cover every byte of the file. The reader checks
the header when it opens the file and each array when it reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import struct
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..core.errors import SerializationError, UnverifiedFileWarning

if TYPE_CHECKING:
    from safetensors import safe_open

__all__ = ["SAFETENSORS_DTYPES", "flatten_tree", "rebuild_tree", "write_atomic", "file_digest", "manifest_digest",
           "write_safetensors", "SafetensorsReader", "CHECKSUM_KEYS", "digest",
           "warn_unverified"]

#: The metadata keys of the checksums: the arrays' digests (a JSON object name -> hex)
#: and the header's digest.
META_CHECKSUMS = "mlaxgraph.checksums"
META_HEADER_CHECKSUM = "mlaxgraph.header_checksum"
CHECKSUM_KEYS = (META_CHECKSUMS, META_HEADER_CHECKSUM)
#: blake2b with a 16-byte digest: hashlib's, no dependency, about 0.6 GB/s on one core.
_DIGEST_SIZE = 16
_ZEROS = "0" * (2 * _DIGEST_SIZE)


def digest(data) -> str:
    """The hex blake2b-128 digest of ``data`` (bytes or any contiguous buffer)."""
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).hexdigest()


def file_digest(path: Any) -> str:
    """``digest`` of a file's bytes, read a block at a time."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """``digest`` of a JSON manifest without its own ``checksum`` field, keys sorted."""
    content = {k: v for k, v in manifest.items() if k != "checksum"}
    return digest(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())


def _array_digest(array: np.ndarray) -> str:
    return digest(np.require(array, requirements="C").reshape(-1).view(np.uint8).data)


def _header_field(value: str) -> bytes:
    """How the header digest appears in the header's bytes (keys sorted, compact)."""
    return f'"{META_HEADER_CHECKSUM}":"{value}"'.encode()


def warn_unverified(path: str, what: str, stacklevel: int = 3) -> None:
    """The one warning for a file written before files carried checksums."""
    warnings.warn(f"{path}: {what} was written without checksums (an older mlaxgraph), so "
                  f"its bytes cannot be verified; save it again to add them",
                  UnverifiedFileWarning, stacklevel=stacklevel)

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


class _IsAFolder(SerializationError, IsADirectoryError):
    """A path to save to that is a folder (an ``mg.SerializationError`` that Python's
    ``except IsADirectoryError`` catches too)."""


class _NoFolder(SerializationError, FileNotFoundError):
    """A path to save to in a folder that does not exist (an ``mg.SerializationError``
    that Python's ``except FileNotFoundError`` catches too)."""


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
    if not base or os.path.isdir(path):
        raise _IsAFolder(f"cannot save to {path!r}: it is a folder; give the path of a file in "
                         f"it (os.path.join({path!r}, name))")
    if not os.path.isdir(directory):
        raise _NoFolder(f"cannot save to {path!r}: folder {directory!r} does not exist "
                        f"(os.makedirs({directory!r}) makes it)")
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
    if any(key in metadata for key in CHECKSUM_KEYS):
        raise SerializationError(f"the metadata keys {CHECKSUM_KEYS} are the writer's own")
    checksums = json.dumps({name: _array_digest(prepared[name]) for name in order},
                           sort_keys=True, separators=(",", ":"))
    header: dict[str, Any] = {"__metadata__": {**metadata, META_CHECKSUMS: checksums,
                                               META_HEADER_CHECKSUM: _ZEROS}}
    offset = 0
    for name in order:
        array = prepared[name]
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype.name],
                        "shape": [int(d) for d in array.shape],
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    # The header's digest is taken with its own field zeroed, then written in place
    # (the field occurs once: inside a metadata string its quotes would be escaped).
    text = text.replace(_header_field(_ZEROS), _header_field(digest(text)), 1)
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

    With ``verify`` (the default), a file that carries checksums has its header checked
    on opening and each array checked as it is read; ``checksummed`` says whether it
    carries them (the caller decides whether a file without them is an old one or a
    damaged one). Use as a context manager; any failure to parse or verify is a
    ``SerializationError``.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True):
        self.path = os.fspath(path)
        self.verify = verify
        self.checksummed = False
        self._checksums: dict[str, str] = {}
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
        try:
            self._check_header(header_len)
        except BaseException:
            self._file.__exit__(None, None, None)
            raise
        return self

    def _check_header(self, header_len: int) -> None:
        meta = self.metadata()
        present = [key in meta for key in CHECKSUM_KEYS]
        if not any(present):
            return
        if not all(present):
            raise SerializationError(f"{self.path}: the header is damaged: it has one of "
                                     f"the checksum keys {CHECKSUM_KEYS} but not the other")
        self.checksummed = True
        if not self.verify:
            return
        with open(self.path, "rb") as f:  # already bounded by the library's own check
            f.seek(8)
            text = f.read(header_len)
        recorded = meta[META_HEADER_CHECKSUM]
        field = _header_field(recorded)
        if (len(recorded) != len(_ZEROS) or text.count(field) != 1
                or digest(text.replace(field, _header_field(_ZEROS))) != recorded):
            raise SerializationError(f"{self.path}: the header does not match its checksum: "
                                     f"the file was changed or damaged after it was written "
                                     f"(verify=False reads it unchecked)")
        try:
            checksums = json.loads(meta[META_CHECKSUMS])
        except ValueError:  # pragma: no cover - the header's digest covers this text
            checksums = None
        names = set(self.names())
        if not isinstance(checksums, dict) or set(checksums) != names:
            raise SerializationError(f"{self.path}: the header's checksums do not list the "
                                     f"file's arrays")  # pragma: no cover - as above
        self._checksums = checksums

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

    def _float8(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A float8 array, which the safetensors library cannot hand to NumPy: its bytes
        read at the offsets of the header (which the library has checked)."""
        with open(self.path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            start, end = header[name]["data_offsets"]
            f.seek(8 + header_len + start)
            data = f.read(end - start)
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

    def spec(self, name: str) -> tuple[str | None, tuple[int, ...]]:
        """(numpy dtype name or None for one mlaxgraph does not read, shape) of an array,
        from the header alone."""
        view = self._call(f"array {name!r}", self._handle.get_slice, name)
        code = self._call(f"array {name!r}", view.get_dtype)
        shape = tuple(self._call(f"array {name!r}", view.get_shape))
        return _DTYPE_NAMES.get(code), shape

    def array(self, name: str) -> np.ndarray:
        """The array, checked against its checksum when the file has them and
        ``verify`` is on."""
        code, shape = self.spec(name)
        if code is not None and code.startswith("float8"):
            array = self._float8(name, np.dtype(code), shape)
        else:
            array = self._call(f"array {name!r}", self._handle.get_tensor, name)
        if self._checksums and _array_digest(_little_endian(array)) != self._checksums[name]:
            raise SerializationError(f"{self.path}: array {name!r} does not match its "
                                     f"checksum: its bytes were changed or damaged after the "
                                     f"file was written (verify=False reads it "
                                     f"unchecked)")
        return array


def iter_paths(tree: Mapping, prefix: str) -> Iterator[str]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from iter_paths(value, f"{prefix}/{key}")
        else:
            yield f"{prefix}/{key}"
