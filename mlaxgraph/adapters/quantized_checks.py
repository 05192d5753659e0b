"""The checks ``mg.quantize_weights`` makes of the weights it is given: arrays, the
quantized layer's names, shapes and dtypes, and whether they are stored (quantized)
already."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..compiler.program import leaf_paths
from ..core.errors import GraphError, node_message
from ..ir.node import Node

__all__ = ["check_arrays", "extra_keys", "stored", "check"]


def check_arrays(path: str, node: Node, given: Any, prefix: str = "") -> None:
    """Every leaf of a layer's ``given`` weights is an array (JAX's or NumPy's), not a
    list or a number."""
    if isinstance(given, Mapping):
        for key, value in given.items():
            check_arrays(path, node, value, f"{prefix}{key}/")
    elif not (hasattr(given, "shape") and hasattr(given, "dtype")):
        raise GraphError(node_message(
            f"{path}/{prefix[:-1]}" if prefix else path, node.op.op_name,
            f"weight is a {type(given).__name__}, not an array: give the float model's params "
            f"as init makes them (JAX or NumPy arrays)"))


def extra_keys(given: Any, want: Any, prefix: str = "") -> list[str]:
    """The paths in a layer's ``given`` weights that its quantized weights ``want`` do
    not have (a quantized layer keeps its float weights' names)."""
    if not isinstance(given, Mapping) or not isinstance(want, Mapping):
        return []
    out: list[str] = []
    for key, value in given.items():
        if key not in want:
            out.append(prefix + str(key))
        else:
            out += extra_keys(value, want[key], f"{prefix}{key}/")
    return out


def stored(given: Mapping, want: Mapping) -> bool:
    """Whether ``given`` holds stored (already quantized) weights: its values and
    scales have the quantized layer's dtypes."""
    have = leaf_paths(given)
    return all(k in have and np.dtype(have[k].dtype) == np.dtype(w.dtype)
               for k, w in leaf_paths(want).items()
               if np.dtype(w.dtype).itemsize == 1 or k.endswith("_scale"))


def check(path: str, node: Node | None, given: Any, want: Any, what: str = "params") -> None:
    """``given`` has the keys, shapes and dtypes of ``want`` (eval_shape's structs)."""
    op_name = node.op.op_name if node is not None else "graph"
    if isinstance(want, Mapping):
        if not isinstance(given, Mapping):
            raise GraphError(node_message(path, op_name, f"{what} hold a {type(given).__name__}, "
                                                         f"the quantized layer needs {sorted(want)}"))
        if set(given) != set(want):
            extra, missing = sorted(set(given) - set(want)), sorted(set(want) - set(given))
            whose, s = ("layer", "") if node is not None else ("graph", "s" if what == "state" else "")
            found = [f"{what} hold{s} {extra}, which the quantized {whose} does not have"] if extra else []
            found += [f"{what} lack{s} {missing}, which it needs"] if missing else []
            stored = any(k.endswith(".quantize") or k in ("kernel_sum", "kernel_scale",
                                                           "embedding_scale") for k in extra)
            problem = "; ".join(found) + (" (weights another quantization made? quantize_weights "
                                          "takes the float model's params and state)" if stored else "")
            if node is None:
                raise GraphError(f"quantize_weights: graph {path!r}: {problem}")
            raise GraphError(node_message(path, op_name, problem))
        for key in want:
            check(f"{path}/{key}", node, given[key], want[key], what)
        return
    if tuple(given.shape) != tuple(want.shape) or np.dtype(given.dtype) != np.dtype(want.dtype):
        raise GraphError(node_message(
            path, op_name, f"weight is {np.dtype(given.dtype).name}{list(given.shape)}, the "
                           f"quantized graph needs {np.dtype(want.dtype).name}{list(want.shape)}"))
