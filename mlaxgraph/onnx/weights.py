"""Weights as ``from_onnx`` reads them: a float initializer is a ``Weight`` (a weight
of the graph when a node reads it as a tensor, a value when an operator needs it
known), and so is what exporters write around one: ``torch.onnx.export`` keeps one
copy of equal initializers (BERT's and GPT-2's zero biases) and reads the others
through ``Identity`` nodes; other exporters cast, reshape or transpose a weight before
the node using it. Read as weights, they let the patterns (``patterns.py``) see
constants: a ``MatMul`` + ``Add`` of a bias through an ``Identity`` is a ``Linear``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layer import TABLE, encode_array, op_class

__all__ = ["Weight", "weight_view", "VIEWS", "as_value", "readers"]


class Weight:
    """A float initializer: a weight when used as a tensor, a value when static."""

    def __init__(self, name: str, array: np.ndarray):
        self.name, self.array = name, array


def as_value(name: str, array: np.ndarray) -> Any:
    """An initializer as the reader holds it: a float one a ``Weight``; the others
    (integers, booleans, float8: no weight dtype) constants."""
    if array.size > 0 and array.dtype.kind == "f" and np.issubdtype(array.dtype, np.floating):
        return Weight(name, array)
    return array


#: Operators that only rename, retype or reshape a weight; their result is read as a
#: weight (``weight_view``).
VIEWS = ("Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
         "Transpose")


def weight_view(reader: Any, node: Any, attrs: dict) -> bool:
    """Whether ``node`` is a view of a weight, then stored in ``reader.values`` as one.

    A weight read through an ``Identity`` is that weight. A weight read only through a
    ``Cast``, ``Reshape``, ``Transpose``... (its other inputs constants) is a weight
    holding the result. A weight read elsewhere too (an embedding table tied to the
    output projection through a ``Transpose``) stays one weight and the operator a
    layer reading it, so it is not copied.
    """
    if node.op_type not in VIEWS or not node.input or len(node.output) != 1:
        return False
    values = reader.values
    source = values.get(node.input[0])
    if not isinstance(source, Weight) or not all(
            isinstance(values.get(v), np.ndarray) for v in node.input[1:] if v):
        return False
    if node.op_type == "Identity":
        values[node.output[0]] = source
        return True
    if _readers(reader, source.name) != 1:
        return False
    op = TABLE[node.op_type]
    arrays = [np.asarray(source.array if p == 0 else values[v]) if v else None
              for p, v in enumerate(node.input)]
    layer = op_class(node.op_type)(
        attributes=tuple(sorted(attrs.items())),
        static=tuple((p, encode_array(a)) for p, a in enumerate(arrays)
                     if a is not None and p in op.static),
        present=tuple(bool(v) for v in node.input), outputs=1, opset=reader.opset,
        name=f"{node.op_type.lower()}_view")
    try:
        array = np.asarray(layer.compute([a for p, a in enumerate(arrays)
                                          if a is not None and p not in op.static])[0])
    except Exception:  # left to the operator's layer, which names the problem
        return False
    values[node.output[0]] = as_value(node.output[0], array)
    return True


def _readers(reader: Any, weight: str) -> int:
    """How many nodes read a weight, through ``Identity`` nodes too (a graph output
    counting as one)."""
    nodes, outputs = readers(reader, weight)
    return len(nodes) + outputs


def readers(reader: Any, weight: str) -> tuple[list, int]:
    """The nodes reading a weight, through ``Identity`` nodes too, and how many graph
    outputs are it."""
    if reader.aliases is None:  # Identity outputs -> the initializer they pass on
        reader.aliases = {}
        changed = True
        while changed:
            changed = False
            for n in reader.model.graph.node:
                if n.op_type == "Identity" and n.input and n.output and \
                        n.output[0] not in reader.aliases:
                    root = reader.aliases.get(n.input[0], n.input[0])
                    if isinstance(reader.values.get(root), Weight):
                        reader.aliases[n.output[0]] = root
                        changed = True
    names = [weight] + [k for k, root in reader.aliases.items() if root == weight]
    nodes = [n for v in names for n in reader.consumers.get(v, [])
             if n.op_type != "Identity" or n.output[0] not in reader.aliases]
    return nodes, sum(v in reader.outputs for v in names)
