"""Arrays deleted by a donation. A jitted function that donates an argument (a
``Trainer`` step donates the train state it is given, a decoder's ``step`` its cache)
takes the arguments' buffers, and the arrays the caller still holds are deleted: using
them again is jax's bare ``RuntimeError: Array has been deleted`` or ``ValueError:
... Buffer has been deleted or donated``. These name the array and the fix.

The hot paths (``apply``, the train and eval steps, ``generate``) look for deleted
arrays only once the call has failed, so a working call pays nothing; functions that
read every weight anyway (saving, quantizing, merging) look before they start.
"""

from __future__ import annotations

from typing import Any

import jax

from .errors import GraphError

__all__ = ["deleted_path", "deleted_error", "refuse_deleted", "reraise_deleted"]

FIX = ("it was donated to a jitted function, which took its buffer. A Trainer step "
       "donates the train state it is given: use the one it returns, `ts, metrics = "
       "trainer.train_step(ts, x, y)`. To keep weights given to a Trainer (a base model's, "
       "shared through init(key, reuse=...)), train with Trainer(trainable=...), whose "
       "frozen weights are not donated, or give it a copy: jax.tree.map(jnp.copy, params)")


def deleted_path(**trees: Any) -> str | None:
    """Where the first deleted array of the ``trees`` (by the names the caller knows
    them by) is, as Python reaches it: ``ts.params['h.0']['attn']['qkv']['kernel']``;
    None when no array is deleted."""
    for name, tree in trees.items():
        for keys, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if (isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer)
                    and leaf.is_deleted()):
                return name + jax.tree_util.keystr(keys)
    return None


def deleted_error(where: str, path: str) -> GraphError:
    """The error of ``where`` given the deleted array at ``path``."""
    return GraphError(f"{where}: {path} was deleted: {FIX}")


def refuse_deleted(where: str, **trees: Any) -> None:
    """A ``GraphError`` naming the first deleted array of ``trees``."""
    path = deleted_path(**trees)
    if path is not None:
        raise deleted_error(where, path)


def reraise_deleted(error: BaseException, where: str, **trees: Any) -> None:
    """After ``error`` (jax's ``RuntimeError`` or ``ValueError``) in a call given
    ``trees``: a ``GraphError`` naming their first deleted array, from ``error``; nothing
    when none is deleted (the caller raises ``error`` again)."""
    if isinstance(error, (RuntimeError, ValueError)):
        path = deleted_path(**trees)
        if path is not None:
            raise deleted_error(where, path) from error
