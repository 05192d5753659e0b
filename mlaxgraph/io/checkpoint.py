"""Checkpoints of a TrainState: one safetensors file per saved step, written
atomically, the last ``keep`` kept. Restoring fills a template TrainState (the one
``trainer.init`` gives), so the file holds only arrays and loading runs no code.

A checkpoint restores bit-identically: every array (params, BatchNorm state, the
optimizer's moments and counters, the step, the run's key and the loss scale) is
stored exactly, and the step's dropout key derives from the step. Each file carries
the checksums of its header and arrays (``weights.py``), checked on restore.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np

from ..core.errors import SerializationError
from ..core.signatures import unknown_keywords
from .weights import SafetensorsReader, warn_unverified, write_atomic, write_safetensors

__all__ = ["CheckpointManager", "tree_arrays"]

FORMAT = "mlaxgraph.checkpoint"
#: The layout written; "1" (no checksums) is still read, with a warning.
VERSION = "2"
_READS = ("1", "2")
_FILE = re.compile(r"^checkpoint_(\d{8,})\.safetensors$")


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)  # pragma: no cover - jax's key types all have one of the above


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def tree_arrays(tree: Any) -> dict[str, Any]:
    """``{"params/conv1/kernel": leaf, "opt_state/0/mu/...": leaf, ...}``: the leaves of
    a pytree named by their paths, in flattening order."""
    named = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(_key_name(entry) for entry in path)
        if name in named:
            raise SerializationError(f"two leaves of the train state are both named {name!r}")
        named[name] = leaf
    return named


def _differences(expected: list[str], missing: list[str], extra: list[str]) -> str:
    """The arrays the train state has and the file lacks, and the reverse, by part of
    the train state (``params``, ``opt_state``, ...: in the state's order), each with
    its first names."""
    parts = list(dict.fromkeys(name.split("/")[0] for name in [*expected, *extra]))
    out = []
    for part in parts:
        for label, names in (("missing from the file", missing),
                             ("in the file, not in this state", extra)):
            found = [n for n in names if n.split("/")[0] == part]
            if found:
                shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
                out.append(f"{part}: {len(found)} {label} ({shown})")
    return "; ".join(out)


class CheckpointManager:
    """Saves and restores TrainStates in ``directory``, keeping the last ``keep``.

    Args:
      directory: created if missing; files are ``checkpoint_<step>.safetensors``.
      keep: how many of the newest checkpoints to keep (older ones are deleted after
        a new one is complete).

    Example:
      >>> import jax, optax, tempfile, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> trainer = mg.train.Trainer(mg.compile(mlp(4, (8,), 3)), optax.adam(1e-3))
      >>> manager = mg.train.CheckpointManager(tempfile.mkdtemp(), keep=2)
      >>> path = manager.save(trainer.init(jax.random.key(0)))
      >>> manager.steps()
      [0]
      >>> ts = manager.restore(trainer.init(jax.random.key(1)))
      >>> int(ts.step)
      0
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, **unknown: Any):
        if unknown:
            raise SerializationError(unknown_keywords("CheckpointManager", unknown,
                                                      "CheckpointManager(directory, keep=3)"))
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1:
            raise SerializationError(f"CheckpointManager: keep must be at least 1 (an int: how "
                                     f"many of the newest checkpoints to keep), got {keep!r}")
        self.directory = os.fspath(directory)
        self.keep = int(keep)

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"checkpoint_{int(step):08d}.safetensors")

    def steps(self) -> list[int]:
        """The steps of the checkpoints in the directory, oldest first."""
        if not os.path.isdir(self.directory):
            return []
        found = (_FILE.match(name) for name in os.listdir(self.directory))
        return sorted(int(m.group(1)) for m in found if m)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, ts: Any, **unknown: Any) -> str:
        """Writes ``ts`` (any pytree with an int ``step``) atomically, replacing a
        checkpoint of the same step; returns the path."""
        if unknown:
            raise SerializationError(unknown_keywords(
                "CheckpointManager.save", unknown, "save(ts)",
                {"overwrite": "save replaces a checkpoint of the same step: it takes no overwrite"}))
        if not hasattr(ts, "step"):
            raise SerializationError(f"CheckpointManager.save takes a train state (with its "
                                     f"step), got {type(ts).__name__}")
        step = int(ts.step)
        arrays = {}
        for name, leaf in tree_arrays(ts).items():
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
                raise SerializationError(
                    f"{name!r} is sharded over several processes: this process holds only "
                    f"part of it. Save a multi-process run with mlaxgraph.io.sharded_checkpoint "
                    f"(every process writes its shards)")
            if _is_key(leaf):
                leaf = jax.random.key_data(leaf)
            arrays[name] = np.asarray(jax.device_get(leaf))
        os.makedirs(self.directory, exist_ok=True)
        metadata = {"format": FORMAT, "version": VERSION, "step": str(step)}
        path = self.path(step)
        write_atomic(path, lambda f: write_safetensors(f, arrays, metadata))
        for old in self.steps()[:-self.keep]:
            try:
                os.unlink(self.path(old))
            except FileNotFoundError:
                pass
        return path

    def restore(self, template: Any, step: int | None = None, *, verify: bool = True,
                **unknown: Any) -> Any:
        """The saved state of ``step`` (the latest when None), in the structure, dtypes
        and shardings of ``template``.

        Args:
          template: a TrainState of the same model and optimizer (``trainer.init``).
          step: the step to restore; the latest when None.
          verify: check the file's checksums (the default); ``False`` skips hashing.

        Raises:
          SerializationError: no checkpoint, one whose arrays do not match the
            template (another model or optimizer: the differing arrays named, by part
            of the train state), one whose recorded step is not its file's, or one
            whose bytes changed since it was written (naming the header or the array).

        Warns:
          UnverifiedFileWarning: a checkpoint written before files carried checksums.
        """
        if unknown:
            raise SerializationError(unknown_keywords(
                "CheckpointManager.restore", unknown, "restore(template, step=None, *, verify=True)"))
        if step is None:
            step = self.latest_step()
            if step is None:
                raise SerializationError(f"no checkpoint in {self.directory!r}")
        path = self.path(step)
        if not os.path.exists(path):
            raise SerializationError(f"no checkpoint of step {step} in {self.directory!r} "
                                     f"(have {self.steps()})")
        expected = tree_arrays(template)
        with SafetensorsReader(path, verify=verify) as reader:
            metadata = reader.metadata()
            if metadata.get("format") != FORMAT:
                raise SerializationError(f"{path}: not an mlaxgraph checkpoint (format "
                                         f"{metadata.get('format')!r})")
            version = metadata.get("version")
            if version not in _READS:
                raise SerializationError(f"{path}: checkpoint version {version!r}; this "
                                         f"mlaxgraph reads versions {', '.join(_READS)}")
            if not reader.checksummed:
                if version != "1":
                    raise SerializationError(f"{path}: the header is damaged: a version "
                                             f"{version} checkpoint records checksums, and "
                                             f"this one has none")
                if verify:
                    warn_unverified(path, "the checkpoint")
            names = list(reader.names())
            have = set(names)
            missing = [n for n in expected if n not in have]
            extra = [n for n in names if n not in expected]
            if missing or extra:
                raise SerializationError(f"{path}: the checkpoint does not match this train "
                                         f"state (another model, optimizer, trainable= or "
                                         f"loss scale?): {_differences(list(expected), missing, extra)}")
            leaves = [self._leaf(reader, path, name, leaf) for name, leaf in expected.items()]
            recorded = metadata.get("step")
            saved = int(np.asarray(reader.array("step"))) if "step" in expected else int(step)
            if recorded is not None and not (recorded == str(int(step)) == str(saved)):
                raise SerializationError(f"{path}: the file of step {int(step)} records step "
                                         f"{recorded} and holds a state at step {saved}: it was "
                                         f"renamed or copied over another step's file")
        return jax.tree.unflatten(jax.tree.structure(template), leaves)

    @staticmethod
    def _leaf(reader: SafetensorsReader, path: str, name: str, like: Any):
        key_impl = jax.random.key_impl(like) if _is_key(like) else None
        want = jax.random.key_data(like) if key_impl is not None else like
        dtype, shape = reader.spec(name)
        if dtype != np.dtype(want.dtype).name or shape != tuple(want.shape):
            raise SerializationError(f"{path}: {name!r} is {dtype}{list(shape)}, the train "
                                     f"state has {np.dtype(want.dtype).name}{list(want.shape)}")
        array = reader.array(name)
        sharding = getattr(like, "sharding", None)
        value = jax.device_put(array, sharding) if sharding is not None else jax.numpy.asarray(array)
        return jax.random.wrap_key_data(value, impl=key_impl) if key_impl is not None else value
