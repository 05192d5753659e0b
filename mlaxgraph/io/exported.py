"""Shipping a compiled model as files: its ``jax.export`` artifact (symbolic dims kept),
its StableHLO and optimized HLO texts, and optionally its weights; and loading the
artifact back to run it without the Python code that built the graph.

A folder written by ``save_hlo`` holds:

- ``exported.jax``: ``jax.export.Exported.serialize()`` of the inference ``apply(params,
  state, *inputs)``; one artifact for every value of the symbolic dims;
- ``exported.mlir``: the StableHLO of that artifact (symbolic shapes);
- ``stablehlo.mlir`` and ``optimized_hlo.txt``: the StableHLO (with layer locations) and
  XLA's optimized HLO for this machine's backend, at the dims given;
- ``weights.safetensors``: the weights, when given (arrays named ``params/<layer>/<name>``
  and ``state/...``, as in ``mg.save``);
- ``manifest.json``: what the files are, the graph's inputs and outputs, the dims, the
  policy, the versions, the blake2b digest of every file (``checksums``) and of the
  manifest itself (``checksum``, over its content without that field, as compact JSON
  with sorted keys); ``load_exported`` checks them.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..compiler import stages
from ..core.errors import SerializationError, ShapeError
from ..core.specs import dim_names
from ..core.version import __version__
from .weights import (
    SafetensorsReader,
    digest,
    flatten_tree,
    manifest_digest,
    warn_unverified,
    write_atomic,
    write_safetensors,
)

__all__ = ["save_hlo", "load_exported", "ExportedModel", "FORMAT", "VERSION"]

#: ``format`` in the manifest.
FORMAT = "mlaxgraph.exported"
#: ``version`` of the folder layout this code writes and the newest it reads; 2 added
#: the checksums (a version 1 folder loads, unverified, with a warning).
VERSION = 2

ARTIFACT = "exported.jax"
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
_WEIGHTS_FORMAT = "mlaxgraph.exported-weights"


def save_hlo(model, directory: str | os.PathLike, *example: Any, params: Mapping | None = None,
             state: Mapping | None = None, inference_mode: bool = True,
             **dims: int) -> dict[str, pathlib.Path]:
    """Writes the model's export artifact, HLO texts and (optionally) weights to
    ``directory`` (made if missing); each file is written atomically.

    Args:
      model: an ``mg.CompiledModel``.
      directory: the folder to write.
      *example: example arrays, one per graph input, for the HLO texts' shapes.
      params: the weights to store beside the artifact (none by default).
      state: the state to store with them (none by default).
      inference_mode: export the inference ``apply`` (the default) or the training one.
      **dims: the symbolic dims' values for the StableHLO and optimized HLO texts
        (``batch=8``). Without them (for a graph with symbolic dims) only the symbolic
        files are written.

    Returns:
      The paths written, by kind: ``artifact``, ``exported_mlir``, ``stablehlo``,
      ``optimized_hlo``, ``weights``, ``manifest``.

    Example:
      >>> import tempfile, jax, numpy as np, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> model = mg.compile(mlp(6, (8,), 3))
      >>> params, state = model.init(jax.random.key(0))
      >>> folder = tempfile.mkdtemp()
      >>> sorted(model.save_hlo(folder, batch=4, params=params, state=state))
      ['artifact', 'exported_mlir', 'manifest', 'optimized_hlo', 'stablehlo', 'weights']
      >>> loaded = mg.load_exported(folder)
      >>> out, _ = loaded(np.ones((5, 6), np.float32))
      >>> out.shape
      (5, 3)
    """
    folder = pathlib.Path(os.fspath(directory))
    folder.mkdir(parents=True, exist_ok=True)
    exported = stages.export(model, inference_mode=inference_mode)
    written: dict[str, pathlib.Path] = {}
    checksums: dict[str, str] = {}

    def write(kind: str, name: str, data: bytes) -> None:
        path = folder / name
        write_atomic(path, lambda f: f.write(data))
        written[kind] = path
        checksums[name] = digest(data)

    write("artifact", ARTIFACT, bytes(exported.serialize()))
    write("exported_mlir", "exported.mlir", exported.mlir_module().encode())
    symbolic = any(dim_names(s.shape) for s in model.graph.input_specs)
    if example or dims or not symbolic:
        lowered = stages.lower(model, example, dims, inference_mode)  # as model.hlo(...) lowers
        write("stablehlo", "stablehlo.mlir", lowered.as_text(debug_info=True).encode())
        write("optimized_hlo", "optimized_hlo.txt", lowered.compile().as_text().encode())
    if params is not None:
        arrays = {**flatten_tree(params, "params", "params"),
                  **flatten_tree(state or {}, "state", "state")}
        host = {name: np.asarray(array) for name, array in arrays.items()}
        metadata = {"mlaxgraph.format": _WEIGHTS_FORMAT, "mlaxgraph.version": str(VERSION)}
        buffer = io.BytesIO()
        write_safetensors(buffer, host, metadata)
        write("weights", WEIGHTS, buffer.getvalue())
    manifest = {
        "format": FORMAT, "version": VERSION, "graph": model.graph.name,
        "policy": None if model.policy is None else repr(model.policy),
        "inference_mode": inference_mode,
        "inputs": {n: str(s) for n, s in zip(model.graph.inputs, model.graph.input_specs)},
        "outputs": [str(s) for s in model.graph.output_specs],
        "dims": {k: int(v) for k, v in dims.items()},
        "limits": stages.dim_limits(model.graph),
        "platforms": list(exported.platforms),
        "files": {kind: path.name for kind, path in written.items()},
        "mlaxgraph": __version__, "jax": jax.__version__,
        "checksums": checksums,
    }
    manifest["checksum"] = manifest_digest(manifest)
    write("manifest", MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return written


class ExportedModel:
    """A model loaded by ``load_exported``: the deserialized ``jax.export.Exported`` and,
    when they were saved with it, the weights.

    Attributes:
      exported: the ``jax.export.Exported``; ``exported.call(params, state, *inputs)``.
      params, state: the stored weights (nested dicts of numpy arrays), or None.
      manifest: the folder's manifest (empty for a bare artifact file).
    """

    def __init__(self, exported, params: dict | None, state: dict | None,
                 manifest: Mapping[str, Any]):
        self.exported = exported
        self.params = params
        self.state = state
        self.manifest = dict(manifest)

    def apply(self, params, state, *inputs, rng=None):
        """Runs the artifact: ``(outputs, new_state)``, as the model's ``apply``. A dim
        past the bound a layer puts on it (the manifest's ``limits``: a position
        table's size), which the artifact itself does not check, is a ``ShapeError``."""
        _check_limits(self.manifest, inputs)
        if rng is None:
            return self.exported.call(params, state, *inputs)
        return self.exported.call(params, state, *inputs, rng=rng)

    def __call__(self, *inputs, rng=None):
        """``apply`` with the stored weights."""
        if self.params is None:
            raise SerializationError("this artifact was saved without weights: call "
                                     "apply(params, state, *inputs)")
        return self.apply(self.params, self.state or {}, *inputs, rng=rng)

    def __repr__(self) -> str:
        name = self.manifest.get("graph", "?")
        ins = ", ".join(f"{n}: {s}" for n, s in self.manifest.get("inputs", {}).items())
        weights = "with weights" if self.params is not None else "without weights"
        return f"<ExportedModel {name!r} ({ins}) {weights}>"


def _check_limits(manifest: Mapping[str, Any], inputs: tuple) -> None:
    limits = manifest.get("limits") or {}
    for (name, spec), x in zip(manifest.get("inputs", {}).items(), inputs):
        dims = spec[spec.find("[") + 1:spec.rfind("]")].split(",")
        for axis, (dim, size) in enumerate(zip(dims, getattr(x, "shape", ()))):
            if dim in limits and int(size) > limits[dim]:
                raise ShapeError(f"input {name!r} ({spec}) has {dim}={size} on axis {axis}; the "
                                 f"graph allows {dim} up to {limits[dim]} (a position table's "
                                 f"size), and the artifact past it computes NaN")


def load_exported(path: str | os.PathLike, verify: bool = True) -> ExportedModel:
    """Loads what ``save_hlo`` wrote: a folder (artifact, manifest and weights if
    present) or a bare ``exported.jax`` file. Needs no code of the graph: the artifact
    is deserialized with ``jax.export.deserialize``.

    With ``verify`` (the default) the manifest's checksums are checked: its own, and
    those of every file it lists (the artifact, the weights, the HLO texts). A bare artifact file is checked when
    the manifest beside it names it; without one nothing records its digest.

    Example:
      >>> import tempfile, jax, numpy as np, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> model = mg.compile(mlp(6, (8,), 3))
      >>> folder = tempfile.mkdtemp()
      >>> _ = model.save_hlo(folder)               # the artifact only, no weights
      >>> loaded = mg.load_exported(f"{folder}/exported.jax")
      >>> params, state = model.init(jax.random.key(0))
      >>> out, _ = loaded.apply(params, state, np.ones((2, 6), np.float32))
      >>> out.shape
      (2, 3)

    Raises:
      FileNotFoundError: no such folder or file.
      SerializationError: the manifest, artifact or weights file is not what
        ``save_hlo`` writes, or its bytes changed since (naming the file).

    Warns:
      UnverifiedFileWarning: a folder written before the manifest carried checksums.
    """
    where = pathlib.Path(os.fspath(path))
    manifest: dict[str, Any] = {}
    folder = where if where.is_dir() else where.parent
    manifest_path = folder / MANIFEST
    if manifest_path.exists():
        manifest = _read_manifest(manifest_path, verify)
    files = manifest.get("files", {})
    if where.is_dir():
        artifact = where / files.get("artifact", ARTIFACT)
        weights = where / WEIGHTS if (where / WEIGHTS).exists() else None
    else:
        artifact, weights = where, None
        if files.get("artifact") != where.name:  # a manifest of another artifact
            manifest = {}
    if not artifact.exists():
        raise FileNotFoundError(f"{artifact}: no such file (save_hlo writes {ARTIFACT})")
    data = artifact.read_bytes()
    _check_file(manifest, artifact, data, verify)
    if weights is not None:
        _check_file(manifest, weights, weights.read_bytes() if verify else b"", verify)
    if where.is_dir() and verify:  # the HLO texts beside them, as the manifest lists them
        for name in manifest.get("checksums", {}):
            if name not in (artifact.name, WEIGHTS):
                text = where / name
                if not text.exists():
                    raise SerializationError(f"{text}: listed in the manifest, and not in the "
                                             f"folder (verify=False reads the folder unchecked)")
                _check_file(manifest, text, text.read_bytes(), verify)
    try:
        exported = jax.export.deserialize(bytearray(data))
    except Exception as e:  # flatbuffers raise assorted errors on foreign bytes
        raise SerializationError(f"{artifact}: not a jax.export artifact: "
                                 f"{type(e).__name__}: {e}") from e
    params = state = None
    if weights is not None:
        params, state = _read_weights(weights, verify, "checksums" in manifest)
    return ExportedModel(exported, params, state, manifest)


def _check_file(manifest: Mapping[str, Any], path: pathlib.Path, data: bytes,
                verify: bool) -> None:
    """A file of a checksummed folder must be listed in its manifest, with its digest."""
    checksums = manifest.get("checksums")
    if not verify or checksums is None:
        return
    if path.name not in checksums:
        raise SerializationError(f"{path}: the manifest lists no checksum for this file "
                                 f"(it was not written by save_hlo with this manifest)")
    if digest(data) != checksums[path.name]:
        raise SerializationError(f"{path}: the file does not match its checksum in the "
                                 f"manifest: it was changed or damaged after save_hlo wrote "
                                 f"it (verify=False reads it unchecked)")


def _read_manifest(path: pathlib.Path, verify: bool) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SerializationError(f"{path}: not a JSON manifest: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SerializationError(f"{path}: not an mlaxgraph export manifest (its format is "
                                 f"not {FORMAT!r})")
    version = manifest.get("version")
    if not isinstance(version, int) or version < 1:
        raise SerializationError(f"{path}: the manifest's version must be a positive int")
    if version > VERSION:
        raise SerializationError(f"{path}: export layout version {version}, but this "
                                 f"mlaxgraph reads up to {VERSION}; upgrade mlaxgraph")
    if version < 2:
        if "checksums" in manifest or "checksum" in manifest:  # e.g. its version edited
            raise SerializationError(f"{path}: the manifest is damaged: it says version "
                                     f"{version}, whose manifests record no checksums, and "
                                     f"it has them")
        if verify:
            warn_unverified(str(path.parent), "the export folder", stacklevel=4)
        return manifest
    checksums = manifest.get("checksums")
    if (not isinstance(checksums, dict) or not isinstance(manifest.get("checksum"), str)
            or not all(isinstance(v, str) for v in checksums.values())):
        raise SerializationError(f"{path}: a version {version} manifest records the "
                                 f"checksums of its files and its own; this one does not")
    if verify and manifest_digest(manifest) != manifest["checksum"]:
        raise SerializationError(f"{path}: the manifest does not match its checksum: it was "
                                 f"changed or damaged after save_hlo wrote it (verify=False "
                                 f"reads it unchecked)")
    return manifest


def _read_weights(path: pathlib.Path, verify: bool, checksummed: bool) -> tuple[dict, dict]:
    trees: dict[str, dict] = {"params": {}, "state": {}}
    with SafetensorsReader(path, verify=verify) as reader:
        if reader.metadata().get("mlaxgraph.format") != _WEIGHTS_FORMAT:
            raise SerializationError(f"{path}: not the weights of an mlaxgraph export")
        if checksummed and not reader.checksummed:
            raise SerializationError(f"{path}: the header is damaged: the weights of a "
                                     f"checksummed export record checksums, and these have none")
        for name in reader.names():
            root, *keys = name.split("/")
            if root not in trees or not keys:
                raise SerializationError(f"{path}: unexpected array {name[:120]!r}")
            node = trees[root]
            for key in keys[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise SerializationError(f"{path}: array {name[:120]!r} nests under another")
            node[keys[-1]] = reader.array(name)
    return trees["params"], trees["state"]
