"""Checkpoints of sharded weights through orbax-checkpoint.

Every process writes the shards it holds (no array is gathered whole on one host), and
restoring reads each array straight into the sharding of a target: the same mesh, or
another one (8 devices to 4, data parallel to tensor parallel). A multi-process run
needs a directory every process sees, and every process calls ``save`` and
``restore``. orbax-checkpoint is optional: ``pip install 'mlaxgraph[sharding]'``.

For one process and small models, ``mg.train.CheckpointManager`` (one safetensors
file, gathered to the host) does the same job without orbax.

Integrity: once orbax has written the checkpoint, process 0 records the blake2b digest
of every file in it (``weights.digest``'s) in ``mlaxgraph_checksums.json``, with the
digest of that manifest itself; ``restore`` checks them (in every process) before
orbax reads anything, so a damaged, truncated, missing or added file is a
``SerializationError`` naming it, never other weights.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax

from ..core.errors import SerializationError
from ..core.signatures import unknown_keywords
from .weights import file_digest, manifest_digest, warn_unverified, write_atomic

__all__ = ["save", "restore", "abstract"]


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:  # optional dependency
        raise ImportError("sharded checkpoints need orbax-checkpoint: "
                          "pip install 'mlaxgraph[sharding]' (or orbax-checkpoint)") from e
    return ocp


def _directory(path: Any) -> pathlib.Path:
    # orbax wants an absolute path; every process must resolve it to the same place.
    return pathlib.Path(os.path.abspath(os.fspath(path)))


#: The file, in the checkpoint's directory, that records the digests of the others.
CHECKSUMS = "mlaxgraph_checksums.json"
_FORMAT = "mlaxgraph.sharded_checkpoint"


def _files(directory: pathlib.Path) -> list[str]:
    """Every file under ``directory`` but the checksums, by its relative POSIX path."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and p.name != CHECKSUMS)


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _record_checksums(directory: pathlib.Path) -> None:
    """Process 0 writes the digest of every file orbax wrote (every process's)."""
    _barrier("mlaxgraph_sharded_checkpoint_written")
    if jax.process_index() == 0:
        manifest: dict[str, Any] = {"format": _FORMAT, "version": 1, "checksums": {
            name: file_digest(directory / name) for name in _files(directory)}}
        manifest["checksum"] = manifest_digest(manifest)
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        write_atomic(directory / CHECKSUMS, lambda f: f.write(text))
    _barrier("mlaxgraph_sharded_checkpoint_checksummed")


def _verify(directory: pathlib.Path) -> None:
    """Every file of the checkpoint against the digests recorded when it was saved."""
    where = directory / CHECKSUMS
    if not where.exists():
        warn_unverified(str(directory), "this sharded checkpoint", stacklevel=4)
        return
    try:
        manifest = json.loads(where.read_bytes())
        recorded = manifest["checksums"]
        valid = (isinstance(recorded, dict) and isinstance(manifest.get("checksum"), str)
                 and all(isinstance(k, str) and isinstance(v, str) for k, v in recorded.items()))
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid or manifest_digest(manifest) != manifest["checksum"]:
        raise SerializationError(f"{where}: the checkpoint's checksums file is damaged (it does "
                                 f"not match its own checksum), so its files cannot be verified")
    present = _files(directory)
    for name in present:
        if name not in recorded:
            raise SerializationError(f"{directory}: file {name!r} was not in the checkpoint when "
                                     f"it was saved (its checksums list no such file)")
    for name, expected in recorded.items():
        if name not in present:
            raise SerializationError(f"{directory}: file {name!r} of the checkpoint is missing")
        if file_digest(directory / name) != expected:
            raise SerializationError(
                f"{directory}: file {name!r} does not match its checksum: its bytes were changed "
                f"or damaged after the checkpoint was written (restore(..., verify=False) reads "
                f"it unchecked)")


def abstract(tree: Any) -> Any:
    """``tree`` with each array (or ``ShapeDtypeStruct``) as a ``ShapeDtypeStruct``
    keeping its shape, dtype and sharding: what ``restore`` fills.

    Example:
      >>> import jax.numpy as jnp
      >>> abstract({"w": jnp.zeros((2, 3))})["w"].shape
      (2, 3)
    """
    def one(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(one, tree)


def save(path: Any, tree: Any, *, overwrite: bool = False, **unknown: Any) -> pathlib.Path:
    """Saves a pytree of (sharded) arrays to the directory ``path``; each process
    writes its own shards, then process 0 records the digest of every file
    (``mlaxgraph_checksums.json``). Returns the directory once the write is complete.

    Raises:
      SerializationError: ``path`` exists and ``overwrite`` is False.

    Example:
      >>> import jax.numpy as jnp, tempfile, os
      >>> where = save(os.path.join(tempfile.mkdtemp(), "step_1"), {"w": jnp.ones((2, 2))})
      >>> restore(where, {"w": jnp.zeros((2, 2))})["w"].tolist()
      [[1.0, 1.0], [1.0, 1.0]]
    """
    if unknown:
        raise SerializationError(unknown_keywords("sharded_checkpoint.save", unknown,
                                                  "save(path, tree, *, overwrite=False)"))
    ocp = _orbax()
    directory = _directory(path)
    if directory.exists() and not overwrite:
        raise SerializationError(f"checkpoint {directory} exists; pass overwrite=True to replace it")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, tree, force=overwrite)
    checkpointer.wait_until_finished()
    _record_checksums(directory)
    return directory


def restore(path: Any, like: Any, *, verify: bool = True, **unknown: Any) -> Any:
    """Restores the checkpoint at ``path`` into the structure, shapes, dtypes and
    shardings of ``like``: arrays (a freshly initialized tree) or
    ``ShapeDtypeStruct``s with a sharding (``mlaxgraph.distributed.abstract_init(model)``,
    which creates no array), on any mesh.

    With ``verify`` (the default) every file is first checked against the digests
    recorded when it was saved (each process reads every file once more);
    ``verify=False`` skips the hashing.

    Raises:
      SerializationError: no checkpoint at ``path``, a file that does not match its
        checksum (or missing, or added), or a checkpoint that does not fit ``like``.

    Warns:
      UnverifiedFileWarning: a checkpoint saved before they recorded checksums.
    """
    if unknown:
        raise SerializationError(unknown_keywords("sharded_checkpoint.restore", unknown,
                                                  "restore(path, like, *, verify=True)"))
    ocp = _orbax()
    directory = _directory(path)
    if not directory.exists():
        raise SerializationError(f"no checkpoint at {directory}")
    if verify:
        _verify(directory)
    try:
        return ocp.StandardCheckpointer().restore(directory, abstract(like))
    except (ValueError, KeyError, TypeError) as e:
        raise SerializationError(f"checkpoint {directory} does not fit the target: {e}") from e
