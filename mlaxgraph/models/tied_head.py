"""An output head tied to the input embedding (``tie_word_embeddings``), which a Hugging
Face ``save_pretrained`` folder leaves out: read from the embedding, as transformers
ties it when the folder's ``config.json`` says so."""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.errors import SerializationError

__all__ = ["with_tied_heads"]


def _config(source: Any) -> dict | None:
    """The ``config.json`` beside the weights a source reads (None: none, or a mapping)."""
    if getattr(source, "mapping", None) is not None:
        return None
    path = os.fspath(source.label)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def with_tied_heads(found: dict, source: Any, expected: dict) -> dict:
    """``found`` (the graph's state-dict names -> the file's) with each missing linear
    weight shaped as the one embedding of its shape read from that embedding, when the
    folder's ``config.json`` has ``tie_word_embeddings: true`` (a graph ``from_torch``
    made of a tied model holds the head as a copy, ``lm_head.weight``). A missing head
    of that shape in a folder that does not say so is named, and why."""
    missing = [name for name in expected if name not in found]
    embeddings = [name for name in found if expected[name][0].op.op_name == "embedding"]
    heads = {}
    for name in missing:
        step, relative, shape = expected[name]
        same = [e for e in embeddings if expected[e][2] == shape]
        if step.op.op_name == "linear" and relative == "weight" and len(same) == 1:
            heads[name] = same[0]
    if not heads or len(heads) < len(missing):
        return found  # other weights missing too: the generic message names them all
    config = _config(source)
    tie = None if config is None else config.get("tie_word_embeddings")
    if tie is not True:
        head, embedding = next(iter(heads.items()))
        said = ("has no config.json beside it" if config is None else
                f"config.json has tie_word_embeddings={tie!r}")
        raise SerializationError(
            f"{source.label}: {head!r} is missing, and {embedding!r} has its shape; a "
            f"save_pretrained folder leaves out a head tied to the embedding, but this one "
            f"{said}, so the head is not taken from the embedding: save the head's weight, or "
            f"set tie_word_embeddings in config.json if the model ties them")
    for head, embedding in heads.items():
        found[head] = found[embedding]
    return found
