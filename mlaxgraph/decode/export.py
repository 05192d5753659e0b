"""A decoder's prefill and step as ``jax.export`` artifacts, for any batch (and prompt
length): functions a user ships and runs without mlaxgraph (``jax.export.deserialize``
then ``.call``), or serves from another process.

The exported functions take and return the cache as a plain dict (``jax.export``
serializes dicts, tuples and arrays; ``Cache`` is the decoder's own class):
``{"layers", "index", "positions", "mask"}`` as ``Cache``'s fields (``cache_arrays``
and ``cache_from_arrays`` convert).

- ``prefill(params, state, input_ids, attention_mask) -> (logits, cache)``: the prompt
  (left-padded by the caller, ``attention_mask`` 0 on padding) written at slots ``0 ..
  seq - 1`` of a new cache of zeros.
- ``step(params, state, cache, token_ids) -> (logits, cache)``: ``token_ids (batch,
  n)`` written at the cache's next slots.

The caller keeps the count of slots used (``seq + steps``) within the decoder's
``max_length``: the artifact cannot refuse (``Decoder.step`` does).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import export as jax_export

from ..compiler.compile import compile
from ..compiler.program import set_in
from ..core.errors import GraphError, ShapeError
from ..core.specs import is_symbolic
from .decoder import Cache, Decoder, _cache_steps, _run

__all__ = ["export_prefill", "export_step", "cache_arrays", "cache_from_arrays"]

#: The decoding graph's batch dim when exported for any batch.
ANY_BATCH = "batch"


def cache_arrays(cache: Cache) -> dict:
    """The cache as the exported functions take it: ``{"layers", "index",
    "positions", "mask"}``."""
    return {"layers": cache.layers, "index": cache.index, "positions": cache.positions, "mask": cache.mask}


def cache_from_arrays(arrays: dict, filled: int = 0) -> Cache:
    """The ``Cache`` of an exported function's cache dict (``filled``: the slots used,
    which ``Decoder.step`` checks against ``max_length``)."""
    return Cache(arrays["layers"], arrays["index"], arrays["positions"], arrays["mask"], filled)


def _dims(batch: int | str, seq: int | str, limit: int) -> tuple[Any, Any]:
    """``jax.export``'s dims for ``batch`` and ``seq``: ints stay, names become
    symbolic dims (in one scope, ``seq`` at most ``limit``)."""
    for name, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, int) and value < 1):
            raise ShapeError(f"{name} must be a positive int or a dim name, got {value!r}")
    names = [v for v in (batch, seq) if isinstance(v, str)]
    if len(names) == 2 and names[0] == names[1]:
        raise ShapeError(f"batch and seq must be different dims, got {names[0]!r} for both")
    if isinstance(seq, int) and seq > limit:
        raise ShapeError(f"seq={seq} is more than the decoder's max_length={limit}")
    constraints = (f"{seq} <= {limit}",) if isinstance(seq, str) else ()
    made: dict[Any, Any] = dict(zip(names, jax_export.symbolic_shape(", ".join(names), constraints=constraints)))
    return made.get(batch, batch), made.get(seq, seq)


def _weights(dec: Decoder) -> tuple[Any, Any]:
    """The shapes of the model's params and state (its caches apart)."""
    model = compile(dec.source, dec.policy, scan_blocks=dec.scan_blocks)
    shapes = jax.eval_shape(model.init_fn, jax.random.key(0))
    return shapes[0], shapes[1]


def _model(dec: Decoder, batch: int | str):
    if dec.mesh is not None:
        raise GraphError("export a decoder made without a mesh: the artifact runs on one device "
                         "(jax.export keeps no mesh of ours)")
    return dec.model(ANY_BATCH if is_symbolic(batch) else batch)


def _empty(model, dec: Decoder, batch: Any) -> Cache:
    layers: dict = {}
    for path, step, blocks in _cache_steps(model.program):
        shape = ((blocks,) if blocks else ()) + (batch,) + tuple(step.state_specs["key"].shape[1:])
        dtype = dec._dtype(step)
        layers = set_in(layers, path, {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)})
    return Cache(layers, jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32),
                 jnp.zeros((batch, dec.max_length), bool), 0)


def export_prefill(dec: Decoder, *, batch: int | str = "batch", seq: int | str = "seq",
                   platforms: Any = None) -> jax_export.Exported:
    """``prefill(params, state, input_ids, attention_mask) -> (logits, cache)`` exported
    for ``batch`` rows of ``seq`` tokens: ints, or names of symbolic dims (any size,
    ``seq`` at most ``max_length``).

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> exported = mg.decode.export_prefill(mg.decoder(g, max_length=32))
      >>> exported.in_avals[-1]
      ShapedArray(bool[batch,seq])
    """
    b, s = _dims(batch, seq, dec.max_length)
    model = _model(dec, batch)
    paths = [path for path, _, _ in _cache_steps(model.program)]
    params, state = _weights(dec)

    def prefill(params, state, input_ids, attention_mask):
        empty = _empty(model, dec, input_ids.shape[0])
        mask = attention_mask.astype(bool)
        positions = jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1
        positions = jnp.where(mask, positions, 1).astype(jnp.int32)
        cache_mask = jax.lax.dynamic_update_slice(empty.mask, mask, (0, 0))
        logits, layers = _run(model, paths, params, state, empty.layers, input_ids, positions,
                              jnp.zeros((), jnp.int32), cache_mask)
        index = jnp.asarray(input_ids.shape[1], jnp.int32)
        return logits, cache_arrays(Cache(layers, index, jnp.sum(mask, axis=1, dtype=jnp.int32), cache_mask))

    args = (params, state, jax.ShapeDtypeStruct((b, s), jnp.int32), jax.ShapeDtypeStruct((b, s), jnp.bool_))
    return jax_export.export(jax.jit(prefill), platforms=platforms)(*args)


def export_step(dec: Decoder, *, batch: int | str = "batch", seq: int | str = 1,
                platforms: Any = None) -> jax_export.Exported:
    """``step(params, state, cache, token_ids) -> (logits, cache)`` exported for
    ``batch`` rows of ``seq`` new tokens each (1 by default): ints, or names of
    symbolic dims.

    Example:
      >>> import jax, jax.numpy as jnp, mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64})
      >>> exported = mg.decode.export_step(mg.decoder(g, max_length=32))
      >>> exported.in_avals[-1]
      ShapedArray(int32[batch,1])
    """
    b, s = _dims(batch, seq, dec.max_length)
    model = _model(dec, batch)
    params, state = _weights(dec)
    step = dec.step_fn(ANY_BATCH if is_symbolic(batch) else batch)
    cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                         cache_arrays(jax.eval_shape(lambda: _empty(model, dec, b))))

    def stepped(params, state, cache, token_ids):
        logits, new = step(params, state, cache_from_arrays(cache), token_ids)
        return logits, cache_arrays(new)

    args = (params, state, cache, jax.ShapeDtypeStruct((b, s), jnp.int32))
    return jax_export.export(jax.jit(stepped), platforms=platforms)(*args)
