"""Key derivation, in one place: every random key of ``init`` and ``apply`` is the
caller's key folded with stable numbers of names (a layer's path, a weight's name, a
block's name), so adding or renaming a layer elsewhere changes no other layer's key."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["salt", "step_key", "block_keys", "fold_chain", "chain_keys"]


def salt(name: str) -> int:
    """A stable 31-bit number for a name, to derive an independent key by ``fold_in``."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def step_key(rng: jax.Array, names: Sequence[str]) -> jax.Array:
    """``rng`` folded with the salt of each name in turn: a step's apply key from its
    path's names, a layer's init base key from its weights' path (a block's layers
    derive from the block's key, so renaming a layer elsewhere does not change it)."""
    for name in names:
        rng = jax.random.fold_in(rng, salt(name))
    return rng


def block_keys(key: jax.Array, names: Sequence[str]) -> jax.Array:
    """One key per block of a run (a scan): ``key`` folded with each block's name,
    stacked; block ``i`` gets the key it would have had unscanned."""
    salts = jnp.asarray([salt(name) for name in names], jnp.uint32)
    return jax.vmap(lambda s: jax.random.fold_in(key, s))(salts)


def fold_chain(key: jax.Array, salts: jax.Array) -> jax.Array:
    """``key`` folded with each entry of a 1-D array of salts in turn."""
    for i in range(salts.shape[0]):
        key = jax.random.fold_in(key, salts[i])
    return key


def chain_keys(key: jax.Array, chains: Sequence[Sequence[str]]) -> jax.Array:
    """The keys of many name chains of one length, folded in one vmapped call (what
    ``step_key`` gives each)."""
    rows = jnp.asarray([[salt(n) for n in chain] for chain in chains], jnp.uint32)
    return jax.vmap(lambda row: fold_chain(key, row))(rows)
