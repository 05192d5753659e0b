"""Where a state dict's names, shapes and arrays come from: a mapping, a
``.safetensors`` file, a folder of shards with their index, or a PyTorch file, read
lazily and without torch."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..core.errors import SerializationError
from ..io.torch_file import TorchReader, is_torch_zip
from ..io.weights import SafetensorsReader

__all__ = ["StateDictSource", "stored_dtype", "as_stored", "side_by_side"]


class StateDictSource:
    """Names, shapes and arrays of a state dict, read lazily from files."""

    def __init__(self, source: Any):
        self.readers: dict[str, SafetensorsReader | TorchReader] = {}
        self.where: dict[str, str] = {}
        self.mapping: Mapping[str, Any] | None = None
        if isinstance(source, Mapping):
            self.mapping = source
            self.label = "the state dict"
            odd = [k for k in source if not isinstance(k, str)]
            if odd:
                raise SerializationError(f"the state dict's names are strings (PyTorch's module "
                                         f"paths), got {odd[0]!r} ({type(odd[0]).__name__})")
            return
        if not isinstance(source, (str, os.PathLike)):
            raise SerializationError(f"a state dict is a mapping of names to arrays, a "
                                     f".safetensors or PyTorch (.pth, .bin) file or a folder of "
                                     f"them, got {type(source).__name__}")
        path = os.fspath(source)
        self.label = path
        if os.path.isdir(path):
            self._open_folder(path)
        elif not os.path.exists(path):
            raise SerializationError(f"{path}: no such file or folder")
        else:
            self._open(path, path)

    def _open(self, path: str, label: str) -> SafetensorsReader | TorchReader:
        # torch.save's zip archives (.pth, pytorch_model.bin); safetensors otherwise.
        reader: SafetensorsReader | TorchReader
        if is_torch_zip(path):
            reader = TorchReader(path).__enter__()
        elif path.endswith((".pth", ".pt", ".bin")):
            reader = TorchReader(path).__enter__()  # refuses the legacy format, saying so
        else:
            reader = SafetensorsReader(path, verify=True).__enter__()
        self.readers[path] = reader
        for name in reader.names():
            if name in self.where:
                raise SerializationError(f"{label}: {name!r} is in two files: "
                                         f"{self.where[name]} and {path}")
            self.where[name] = path
        return reader

    def _open_folder(self, folder: str) -> None:
        files = sorted(os.listdir(folder))
        # safetensors first (what Hugging Face writes today), then PyTorch's files.
        for weights, index in ((".safetensors", ".safetensors.index.json"), (".bin", ".bin.index.json"),
                               (".pth", ".pth.index.json")):
            indexes = [f for f in files if f.endswith(index)]
            singles = [f for f in files if f.endswith(weights)]
            if indexes or singles:
                break
        if len(indexes) > 1:
            raise SerializationError(f"{folder}: several shard indexes ({', '.join(indexes)}); "
                                     f"pass the one to read's folder alone")
        if not indexes:
            if len(singles) != 1:
                raise SerializationError(f"{folder}: no shard index (*.safetensors.index.json or "
                                         f"pytorch_model.bin.index.json), and {len(singles)} weight "
                                         f"files (.safetensors, .bin or .pth; expected one)")
            self._open(os.path.join(folder, singles[0]), folder)
            return
        index_path = os.path.join(folder, indexes[0])
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError) as e:
            raise SerializationError(f"{index_path}: not a shard index ({e})") from None
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise SerializationError(f"{index_path}: {name!r} is in {shard!r}, which is not "
                                         f"a file name in the folder")
        for shard in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(folder, shard)):
                names = sorted(n for n, s in weight_map.items() if s == shard)
                raise SerializationError(f"{index_path}: shard {shard!r} is not in the folder "
                                         f"(it holds {len(names)} weight(s), {names[0]!r} among "
                                         f"them): copy every shard the index lists")
            self._open(os.path.join(folder, shard), index_path)
        listed, found = set(weight_map), set(self.where)
        if listed != found:
            extra = sorted(found - listed)[:5] or sorted(listed - found)[:5]
            raise SerializationError(f"{index_path}: the index and the shards disagree on "
                                     f"{', '.join(map(repr, extra))}")
        for name, shard in weight_map.items():
            if self.where[name] != os.path.join(folder, shard):
                raise SerializationError(f"{index_path}: {name!r} is listed in {shard} but "
                                         f"stored in {os.path.basename(self.where[name])}")

    def close(self) -> None:
        for reader in self.readers.values():
            reader.__exit__(None, None, None)

    def names(self) -> list[str]:
        return list(self.mapping) if self.mapping is not None else list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        if self.mapping is not None:
            return tuple(np.shape(self.mapping[name]))
        return self.readers[self.where[name]].spec(name)[1]

    def array(self, name: str) -> np.ndarray:
        if self.mapping is not None:
            value = self.mapping[name]
            if hasattr(value, "detach"):  # a torch tensor, when torch is there
                value = value.detach().cpu().numpy()
            return np.asarray(value)
        return self.readers[self.where[name]].array(name)


def stored_dtype(step: Any) -> np.dtype | None:
    """The integer or boolean dtype ``from_torch``'s buffer layer stores its value in,
    else None (the weights are floating)."""
    if step.op.op_name != "aten.buffer" or jnp.issubdtype(step.op.dtype, jnp.floating):
        return None
    return np.dtype(jnp.dtype(step.op.dtype))


def as_stored(array: np.ndarray, dtype: np.dtype, name: str, label: str) -> np.ndarray:
    if jnp.issubdtype(array.dtype, jnp.floating) != jnp.issubdtype(dtype, jnp.floating) or (
            array.dtype.kind == "b") != (dtype.kind == "b"):
        raise SerializationError(f"{label}: {name!r} is {array.dtype}; the buffer holds {dtype}")
    if dtype.kind in "iu" and array.size and (array.min() < np.iinfo(dtype).min
                                              or array.max() > np.iinfo(dtype).max):
        raise SerializationError(f"{label}: {name!r} holds values outside {dtype}'s range "
                                 f"(without jax_enable_x64 JAX computes in 32 bits)")
    return array.astype(dtype)


def side_by_side(missing: list[str], unexpected: list[str], limit: int = 12) -> str:
    """Two columns: the names the graph needs that the source lacks, and the names the
    source holds that the graph does not, each sorted (a renamed weight shows as a pair
    on nearby lines)."""
    left = [f"missing ({len(missing)})"] + [repr(n) for n in sorted(missing)[:limit]]
    right = [f"unexpected ({len(unexpected)})"] + [repr(n) for n in sorted(unexpected)[:limit]]
    if len(missing) > limit:
        left.append(f"... and {len(missing) - limit} more")
    if len(unexpected) > limit:
        right.append(f"... and {len(unexpected) - limit} more")
    width = max(len(line) for line in left) + 3
    rows = max(len(left), len(right))
    left += [""] * (rows - len(left))
    right += [""] * (rows - len(right))
    return "\n".join(f"  {a:<{width}}{b}".rstrip() for a, b in zip(left, right))
