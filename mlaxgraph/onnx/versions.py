"""The operator sets and domains ``from_onnx`` reads: ONNX's own from ``MIN_OPSET``
to the newest the installed ``onnx`` knows (older models whose operators have not
changed since ``MIN_OPSET`` too), and the other domains whose operators the family
holds."""

from __future__ import annotations

import functools
from typing import Any

from ..core.errors import GraphError, SerializationError
from .protos import require_onnx

__all__ = ["MIN_OPSET", "domain_versions", "check_attributes"]

#: The oldest operator set read (6: the operators' legacy broadcast attributes are
#: honoured).
MIN_OPSET = 6
#: The operator domains read: ONNX's, its training domain's optimizers, its preview
#: domain's FlexAttention and the tensor operators of its classical machine-learning
#: domain (ops_ml).
_DOMAINS = ("", "ai.onnx", "ai.onnx.preview.training", "ai.onnx.preview", "ai.onnx.ml")


def _opset(model: Any) -> int:
    onnx = require_onnx()
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    newest = onnx.defs.onnx_opset_version()
    if not versions:
        if any(o.domain in _DOMAINS for o in model.opset_import):
            return newest  # a model of the training domain alone
        raise SerializationError("the model imports no version of the ONNX operator set")
    version = int(versions[0])
    if 1 <= version < MIN_OPSET:
        return _older(model.graph, version)
    if not MIN_OPSET <= version <= newest:
        raise SerializationError(f"the model's ONNX operator set is {version}; mlaxgraph "
                                 f"reads {MIN_OPSET} to {newest}")
    return version


def _older(graph: Any, version: int) -> int:
    """A model of an operator set older than ``MIN_OPSET`` whose operators are all
    as they are in ``MIN_OPSET`` (``Not``, ``Relu`` of opset 1...) is read as one of
    ``MIN_OPSET``; one using an operator changed since is refused, naming it."""
    schemas = require_onnx().defs
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            same = (schemas.get_schema(node.op_type, version).since_version ==
                    schemas.get_schema(node.op_type, MIN_OPSET).since_version)
        except Exception:  # noqa: BLE001  (an operator the older set lacks)
            same = False
        if not same:
            raise SerializationError(
                f"the model's ONNX operator set is {version}; node "
                f"{node.name or '(unnamed)'!r} ({node.op_type}) has changed since "
                f"then; mlaxgraph reads {MIN_OPSET} on, and older models whose operators are "
                f"unchanged since")
        for attr in node.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _older(body, version)
    return MIN_OPSET


def domain_versions(model: Any, opset: int) -> dict[str, int]:
    """The version of each operator domain the model imports (ONNX's own: ``opset``,
    as ``_opset`` reads it); a domain it does not import: the newest ``onnx`` knows."""
    versions = {o.domain: int(o.version) for o in model.opset_import
                if o.domain not in ("", "ai.onnx")}
    versions[""] = opset
    return versions


@functools.cache
def _attributes(op_type: str, domain: str, version: int) -> frozenset[str] | None:
    """The attribute names of the operator's schema at ``version``; None where
    ``onnx`` has no schema for it (an operator checked elsewhere)."""
    defs = require_onnx().defs
    try:
        return frozenset(defs.get_schema(op_type, version, domain).attributes)
    except Exception:  # noqa: BLE001  (onnx.defs.SchemaError: no such operator there)
        return None


def check_attributes(node: Any, versions: dict[str, int], where: str) -> None:
    """An attribute the operator's schema does not have (``Relu(alpha=...)``) is a
    ``GraphError`` naming the node and the attributes it has: ``onnx.checker``
    refuses such a file, and its meaning is unknown."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = versions.get(domain)
    if version is None or not node.attribute:
        return
    known = _attributes(node.op_type, domain, version)
    if known is None:
        return
    for attr in node.attribute:
        # ``__body__``: the part of the graph the reader gives a Gradient (with_body)
        if attr.name not in known and not attr.name.startswith("__"):
            raise GraphError(f"{where} has the attribute {attr.name!r}, which the operator "
                             f"{node.op_type} of opset {version} does not have (its "
                             f"attributes: {', '.join(sorted(known)) or 'none'}); "
                             f"onnx.checker refuses the file")
