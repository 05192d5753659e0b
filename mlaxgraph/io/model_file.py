"""``mg.save`` and ``mg.load``: a graph and its weights in one safetensors file.

Example:
  >>> import os, tempfile, jax, numpy as np, mlaxgraph as mg
  >>> from mlaxgraph import ops
  >>> x = mg.Input(("batch", 4), name="x")
  >>> g = mg.Graph(x, ops.Linear(2, name="fc")(x), name="tiny")
  >>> params, state = mg.compile(g).init(jax.random.key(0))
  >>> path = os.path.join(tempfile.mkdtemp(), "tiny.mlg")
  >>> mg.save(path, g, params, state)
  >>> g2, params2, state2 = mg.load(path)
  >>> g2 == g, bool(np.array_equal(params2["fc"]["kernel"], params["fc"]["kernel"]))
  (True, True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compile import compile
from ..compiler.flatten import flatten
from ..compiler.passes.fold_repeated_blocks import unfold_scans
from ..compiler.policy import Policy
from ..compiler.stacking import unstack_given, unstack_weights
from ..core.donated import refuse_deleted
from ..core.errors import MlaxGraphError, SerializationError
from ..core.signatures import unknown_keywords
from ..core.specs import flatten_specs
from ..ir.graph import Graph
from .json_format import graph_from_json, graph_to_json
from .weights import (
    CHECKSUM_KEYS,
    SafetensorsReader,
    flatten_tree,
    rebuild_tree,
    warn_unverified,
    write_atomic,
    write_safetensors,
)

__all__ = ["save", "load", "ModelFileNotFoundError", "expected_weights", "FORMAT", "VERSION"]

#: ``mlaxgraph.format`` in the safetensors metadata.
FORMAT = "mlaxgraph.model"
#: ``mlaxgraph.version``: the weights-file layout this code writes and the newest it reads.
#: 2 added the checksums (version 1 files still load, unverified, with a warning) and
#: weights that layout 1 lacks (``ParamSpec.added_in == 2``: GRU's ``recurrent_bias``),
#: which load as zeros from a version 1 file.
VERSION = 2
#: The first version whose files must carry checksums.
CHECKSUMMED_VERSION = 2

META_FORMAT = "mlaxgraph.format"
META_VERSION = "mlaxgraph.version"
META_GRAPH = "mlaxgraph.graph"
META_PARAM_DTYPE = "mlaxgraph.param_dtype"
_META_KEYS = (META_FORMAT, META_VERSION, META_GRAPH, META_PARAM_DTYPE)
PARAM_DTYPES = ("float32", "bfloat16", "float16", "float64")


def expected_weights(graph: Graph, param_dtype: Any = "float32") -> tuple[dict, dict]:
    """The ``(params, state)`` trees of ``jax.ShapeDtypeStruct`` that
    ``mg.compile(graph, mg.Policy(param_dtype=...)).init`` creates, computed with
    ``jax.eval_shape`` (no weights are made)."""
    policy = None if np.dtype(param_dtype) == np.float32 else Policy(param_dtype=param_dtype)
    model = compile(graph, policy)
    return jax.eval_shape(model.init_fn, jax.random.key(0))


def _unscanned(graph: Graph, params: Any, state: Any) -> tuple[Graph, Any, Any]:
    """A graph compiled with ``scan_blocks`` (``model.graph``) and its stacked weights
    as the graph's own calls of its blocks and their weights (also weights stacked by a
    scanned model given with the graph it was compiled from): files do not depend on
    compile options."""
    unfolded = unfold_scans(graph)
    if unfolded == graph:  # weights a scanned model stacked, given with the graph built
        params, state = unstack_given(flatten(graph), params, state)
        return graph, params, state
    params, state = unstack_weights(flatten(graph), params, state)
    return unfolded, params, state


def save(path: str | os.PathLike, graph: Graph, params: Mapping, state: Mapping | None = None,
         *, param_dtype: Any = None, **unknown: Any) -> None:
    """Saves ``graph`` and its weights to one safetensors file at ``path``, atomically:
    ``path`` holds the old file or the complete new one, never a part.

    Args:
      path: the file to write (conventionally ``*.mlg``; it is a valid
        ``.safetensors`` file).
      graph: the graph (a source graph or a compiled ``model.graph``; a run of blocks
        that ``scan_blocks`` folded is written as the blocks' calls, with each block's
        weights, whichever layout they come in).
      params: the params tree ``mg.compile(graph, policy).init`` returns (or a trained
        version of it).
      state: the state tree ``init`` returns (or a trained version of it); may be
        omitted when the graph has none.
      param_dtype: the dtype of every weight; by default the one dtype they share
        (a weight whose layer fixes its dtype, as a quantized layer's int8 values and
        float32 scales, is stored in that dtype whatever it is).

    Raises:
      SerializationError: the graph cannot be written (an unregistered function), or
        the arrays are not the ones the graph's ``init`` makes (missing, extra, other
        shape or dtype), named. Nothing is written then.
    """
    if isinstance(path, Graph) or hasattr(path, "graph") and isinstance(path.graph, Graph):
        raise SerializationError(f"mg.save(path, graph, params, state): the path comes first, "
                                 f"got a {type(path).__name__} there")
    if not isinstance(graph, Graph):
        hint = (" (a compiled model: pass model.graph)"
                if isinstance(getattr(graph, "graph", None), Graph) else "")
        raise SerializationError(f"mg.save takes a Graph, got {type(graph).__name__}{hint}")
    if unknown:
        raise SerializationError(unknown_keywords("save", unknown, "save(path, graph, params, "
                                                  "state=None, param_dtype=None)", {}))
    state = {} if state is None else state
    refuse_deleted("mg.save", params=params, state=state)
    graph, params, state = _unscanned(graph, params, state)
    text = graph_to_json(graph)
    arrays = {**flatten_tree(params, "params", "params"), **flatten_tree(state, "state", "state")}
    if param_dtype is None:
        dtypes = sorted({np.dtype(a.dtype).name for a in arrays.values()})
        if len(dtypes) > 1:  # the weights whose layer fixes their dtype (quantized) aside
            fixed = _fixed_dtypes(graph)
            dtypes = sorted({np.dtype(a.dtype).name for k, a in arrays.items() if k not in fixed})
        if len(dtypes) > 1:
            raise SerializationError(f"the weights have several dtypes ({', '.join(dtypes)}); "
                                     f"a saved model keeps all of them in one param dtype, as "
                                     f"init makes them")
        param_dtype = dtypes[0] if dtypes else "float32"
    param_dtype = np.dtype(param_dtype).name
    if param_dtype not in PARAM_DTYPES:
        raise SerializationError(f"param_dtype must be one of {', '.join(PARAM_DTYPES)}, got "
                                 f"{param_dtype}")
    expected, _ = _expected(graph, param_dtype, "the graph")
    _compare(expected, {k: (np.dtype(a.dtype).name, tuple(a.shape)) for k, a in arrays.items()},
             "the given arrays")
    host = {name: np.asarray(array) for name, array in arrays.items()}
    metadata = {META_FORMAT: FORMAT, META_VERSION: str(VERSION), META_GRAPH: text,
                META_PARAM_DTYPE: param_dtype}
    write_atomic(path, lambda f: write_safetensors(f, host, metadata))


class ModelFileNotFoundError(SerializationError, FileNotFoundError):
    """``mg.load`` of a path where nothing is: a ``SerializationError`` (as every
    error reading a model) and a ``FileNotFoundError`` (as for any file)."""


def load(path: str | os.PathLike, verify: bool = True, **unknown: Any) -> tuple[Graph, dict, dict]:
    """Loads ``(graph, params, state)`` saved by ``mg.save``; params and state are
    nested dicts of ``jax.Array``, as ``init`` returns them.

    Nothing in the file is executed: ops and functions are looked up by name in
    mlaxgraph's registries. The header and every array are checked against the
    checksums the file records, the graph is verified and its shapes re-inferred, and
    every array is checked against what the graph's ``init`` would create.

    Args:
      path: the file ``mg.save`` wrote, or a folder holding one ``*.mlg`` file.
      verify: check the checksums (the default). ``False`` skips hashing the file's
        bytes, for huge files read from storage you trust; every other check stays.

    Raises:
      SerializationError: the file is not a valid mlaxgraph model file, or its bytes
        changed since it was written (naming what is wrong: the header, the graph's
        field, the array that does not match its checksum, the missing, extra or
        mismatched array).
      ModelFileNotFoundError: nothing is at ``path`` (a ``SerializationError``, as
        ``mg.from_onnx`` raises for a missing file, and a ``FileNotFoundError``).
      OSError: the path cannot be opened (no permission, say).

    Warns:
      UnverifiedFileWarning: the file was written before files carried checksums
        (layout version 1); it loads, unverified.
    """
    if unknown:
        raise SerializationError(unknown_keywords("load", unknown, "load(path, verify=True)", {
            "map_location": "the arrays are read to the host: place them with jax.device_put",
            "weights_only": "a model file holds no code: nothing is unpickled or run"}))
    where = os.fspath(path)
    if os.path.isdir(where):
        where = path = _model_file_in(where)
    elif not os.path.exists(where):
        near = [f"{where}{suffix}" for suffix in (".mlg",) if os.path.exists(f"{where}{suffix}")]
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ModelFileNotFoundError(f"cannot read the model file {where!r}: no such file or "
                                     f"folder{hint}")
    with SafetensorsReader(path, verify=verify) as reader:
        meta = reader.metadata()
        for key in _META_KEYS:
            if key not in meta:
                raise SerializationError(f"{where}: not an mlaxgraph model file: its header "
                                         f"metadata has no {key!r}")
        foreign = sorted(k for k in meta if k.startswith("mlaxgraph.")
                         and k not in _META_KEYS + CHECKSUM_KEYS)
        if foreign:
            raise SerializationError(f"{where}: unknown header metadata {foreign[0][:80]!r}")
        if meta[META_FORMAT] != FORMAT:
            raise SerializationError(f"{where}: {META_FORMAT} is {meta[META_FORMAT][:80]!r}, "
                                     f"expected {FORMAT!r}")
        version = meta[META_VERSION]
        if not (version.isascii() and version.isdigit() and len(version) < 10 and int(version) >= 1):
            raise SerializationError(f"{where}: {META_VERSION} must be a positive integer, "
                                     f"got {version[:80]!r}")
        if int(version) > VERSION:
            raise SerializationError(f"{where}: weights layout version {version}, but this "
                                     f"mlaxgraph reads up to {VERSION}; upgrade mlaxgraph")
        _check_checksummed(reader, int(version), verify, where, "the model file")
        param_dtype = meta[META_PARAM_DTYPE]
        if param_dtype not in PARAM_DTYPES:
            raise SerializationError(f"{where}: {META_PARAM_DTYPE} must be one of "
                                     f"{', '.join(PARAM_DTYPES)}, got {param_dtype[:80]!r}")
        try:
            graph = graph_from_json(meta[META_GRAPH])
        except SerializationError as e:
            raise SerializationError(f"{where}: {e}") from e.__cause__
        expected, (params_tree, state_tree) = _expected(graph, param_dtype, f"{where}: the graph")
        names = reader.names()
        found = {name: reader.spec(name) for name in names}
        # Weights added by a later layout than the file's: zeros (see ParamSpec.added_in).
        added = {name: expected[name] for name in _added_after(graph, int(version))
                 if name in expected and name not in found}
        _compare(expected, {**found, **added}, where)
        arrays = {}
        for name in sorted(expected):
            if name in added:
                arrays[name] = jnp.zeros(added[name][1], added[name][0])
                continue
            array = reader.array(name)
            want_dtype, want_shape = expected[name]
            if (np.dtype(array.dtype).name, tuple(array.shape)) != (want_dtype, want_shape):
                raise SerializationError(f"{where}: array {name!r} read as {array.dtype}"
                                         f"{list(array.shape)}, expected {want_dtype}{list(want_shape)}")
            arrays[name] = jnp.asarray(array)
    params = rebuild_tree(params_tree, "params", arrays.__getitem__)
    state = rebuild_tree(state_tree, "state", arrays.__getitem__)
    return graph, params, state


def _model_file_in(folder: str) -> str:
    """The one model file (``*.mlg``) of a folder; a folder of another kind of
    checkpoint is an error saying how to read it."""
    files = sorted(os.listdir(folder))
    models = [f for f in files if f.endswith(".mlg")]
    if len(models) == 1:
        return os.path.join(folder, models[0])
    if models:
        raise SerializationError(f"{folder}: holds {len(models)} model files ({', '.join(models[:5])}); "
                                 f"pass the one to load")
    if "config.json" in files:
        raise SerializationError(
            f"{folder}: a Hugging Face checkpoint folder (config.json and its weights), not an "
            f"mlaxgraph model file: build the graph with its zoo builder and read the weights, "
            f"graph = mg.models.<model_type>({folder!r}); params, state = "
            f"mg.models.load_state_dict(graph, {folder!r})")
    raise SerializationError(f"{folder}: no mlaxgraph model file (*.mlg) in this folder "
                             f"({len(files)} entries)")


def _check_checksummed(reader: SafetensorsReader, version: int, verify: bool, where: str,
                       what: str) -> None:
    """A file of a checksummed version must carry its checksums; an older one loads
    with a warning."""
    if reader.checksummed:
        return
    if version >= CHECKSUMMED_VERSION:
        raise SerializationError(f"{where}: the header is damaged: a version {version} file "
                                 f"records checksums, and this one has none")
    if verify:
        warn_unverified(where, what, stacklevel=4)


def _fixed_dtypes(graph: Graph) -> set[str]:
    """The array names of the weights whose dtype the graph fixes whatever the param
    dtype (``ParamSpec.dtype``: a quantized layer's values and scales)."""
    (one, _), (other, _) = (_expected(graph, dtype, "the graph") for dtype in ("float32", "float16"))
    return {name for name, (dtype, _) in one.items() if other[name][0] == dtype}


def _expected(graph: Graph, param_dtype: str, what: str):
    """``({array name: (dtype name, shape)}, (params tree, state tree))`` of what the
    graph's init makes."""
    try:
        params, state = expected_weights(graph, param_dtype)
    except MlaxGraphError as e:
        raise SerializationError(f"{what} cannot be compiled to find its weights: {e}") from e
    except Exception as e:
        raise SerializationError(f"{what} cannot be compiled to find its weights: "
                                 f"{type(e).__name__}: {e}") from e
    flat = {**flatten_tree(params, "params", "init's params"),
            **flatten_tree(state, "state", "init's state")}
    specs = {k: (np.dtype(v.dtype).name, tuple(int(d) for d in v.shape)) for k, v in flat.items()}
    return specs, (params, state)


def _added_after(graph: Graph, version: int) -> set[str]:
    """The array names of the weights the graph's layers declare as added after weights
    layout ``version`` (none for a file of the current layout)."""
    if version >= VERSION:
        return set()
    names = set()
    for step in compile(graph).program.steps:
        for kind, specs in (("params", step.param_specs), ("state", step.state_specs)):
            for path, spec in flatten_specs(specs):
                if spec.added_in > version:
                    names.add("/".join((kind, *step.weights, path)))
    return names


def _compare(expected: dict[str, tuple[str, tuple]], got: dict[str, tuple], where: str) -> None:
    missing = sorted(set(expected) - set(got))
    if missing:
        raise SerializationError(f"{where}: missing array{'s' if len(missing) > 1 else ''} "
                                 f"{_names(missing)} that the graph's init makes")
    extra = sorted(set(got) - set(expected))
    if extra:
        raise SerializationError(f"{where}: extra array{'s' if len(extra) > 1 else ''} "
                                 f"{_names(extra)} that the graph's init does not make")
    for name in sorted(expected):
        want_dtype, want_shape = expected[name]
        got_dtype, got_shape = got[name]
        if tuple(got_shape) != want_shape:
            raise SerializationError(f"{where}: array {name!r} has shape {list(got_shape)}, but "
                                     f"the graph's init makes {list(want_shape)}")
        if got_dtype != want_dtype:
            raise SerializationError(f"{where}: array {name!r} has dtype {got_dtype or 'unsupported'}, "
                                     f"but the graph's init makes {want_dtype}")


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n[:120]) for n in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")
