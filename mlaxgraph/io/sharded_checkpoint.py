"""Checkpoints of sharded weights through orbax-checkpoint.

Every process writes the shards it holds (no array is gathered whole on one host), and
restoring reads each array straight into the sharding of a target: the same mesh, or
another one (8 devices to 4, data parallel to tensor parallel). A multi-process run
needs a directory every process sees, and every process calls ``save`` and
``restore``. orbax-checkpoint is optional: ``pip install 'mlaxgraph[sharding]'``.

For one process and small models, ``mg.train.CheckpointManager`` (one safetensors
file, gathered to the host) does the same job without orbax.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from ..core.errors import SerializationError

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


def save(path: Any, tree: Any, *, overwrite: bool = False) -> pathlib.Path:
    """Saves a pytree of (sharded) arrays to the directory ``path``; each process
    writes its own shards. Returns the directory once the write is complete.

    Raises:
      SerializationError: ``path`` exists and ``overwrite`` is False.

    Example:
      >>> import jax.numpy as jnp, tempfile, os
      >>> where = save(os.path.join(tempfile.mkdtemp(), "step_1"), {"w": jnp.ones((2, 2))})
      >>> restore(where, {"w": jnp.zeros((2, 2))})["w"].tolist()
      [[1.0, 1.0], [1.0, 1.0]]
    """
    ocp = _orbax()
    directory = _directory(path)
    if directory.exists() and not overwrite:
        raise SerializationError(f"checkpoint {directory} exists; pass overwrite=True to replace it")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, tree, force=overwrite)
    checkpointer.wait_until_finished()
    return directory


def restore(path: Any, like: Any) -> Any:
    """Restores the checkpoint at ``path`` into the structure, shapes, dtypes and
    shardings of ``like``: arrays (a freshly initialized tree) or
    ``ShapeDtypeStruct``s with a sharding (``mlaxgraph.distributed.abstract_init(model)``,
    which creates no array), on any mesh.

    Raises:
      SerializationError: no checkpoint at ``path``, or it does not fit ``like``.
    """
    ocp = _orbax()
    directory = _directory(path)
    if not directory.exists():
        raise SerializationError(f"no checkpoint at {directory}")
    try:
        return ocp.StandardCheckpointer().restore(directory, abstract(like))
    except (ValueError, KeyError, TypeError) as e:
        raise SerializationError(f"checkpoint {directory} does not fit the target: {e}") from e
