"""The compiled model's ``apply``: the jitted functions behind the keywords users pass
(``capture=``, ``intervene=``), each checked by name (``init``'s ``reuse=`` is in
``reuse.py``).

``apply`` without taps is the plain jitted function; with ``capture`` or ``intervene``
it is another jitted function, made once per set of taps and kept: the patterns and
each function's code are static, the floats and arrays the functions read are traced
arguments (``mlaxgraph.compiler.tap_functions``), so a function reused after a value
it reads changed sees the new value, and a sweep does not compile again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ..core.donated import reraise_deleted
from ..core.errors import GraphError
from ..core.signatures import unknown_keywords
from .taps import Taps

__all__ = ["model_apply"]

_PLAIN = frozenset(("rng", "inference_mode"))
_APPLY_SIGNATURE = ("apply(params, state, *inputs, rng=None, inference_mode=False, "
                    "capture=None, intervene=None)")
#: Keras's and Flax's spellings of apply's arguments.
_APPLY_HINTS = {"training": "Keras's training=True is inference_mode=False",
                "deterministic": "Flax's deterministic=True is inference_mode=True",
                "rngs": "Flax's rngs={'dropout': key} is rng=key"}


#: The jitted function's attributes the model's ``apply`` passes on (``apply.lower(...)``).
_JIT_ATTRIBUTES = ("lower", "trace", "eval_shape", "_cache_size", "clear_cache")


def model_apply(plain: Callable, make: Callable[[Taps, tuple], Callable]) -> Callable:
    """``apply(params, state, *inputs, rng=None, inference_mode=False, capture=None,
    intervene=None)``: ``(outputs, new_state)``, or ``(outputs, new_state, captured)``
    with ``capture``. A plain function (not a bound method: it is on every call's path)
    carrying the jitted function's ``lower``, ``trace`` and ``eval_shape``."""
    # by the taps' key: patterns, and each function's code and the values it reads
    # other than floats and arrays (mlaxgraph.compiler.tap_functions)
    tapped: dict[Any, Callable] = {}
    concrete: set = set()

    def tapped_call(params, state, *inputs, rng=None, inference_mode: bool = False,
                    capture: Any = None, intervene: Any = None, **unknown: Any):
        if unknown:
            raise GraphError(unknown_keywords("apply", unknown, _APPLY_SIGNATURE, _APPLY_HINTS))
        taps = Taps.of(capture, intervene)
        if taps is None:
            out = plain(params, state, *inputs, rng=rng, inference_mode=inference_mode)
            # capture=[] (a selection of nothing) still gives the three values
            return out if capture is None else (*out, {})
        functions = taps.functions()
        key = taps.key(functions)
        if key in concrete:  # Python control flow on a float it reads: floats as constants
            functions = taps.functions(concrete=True)
            key = taps.key(functions)
        values = tuple(f.values for f in functions)
        fn = tapped.get(key)
        if fn is None:
            fn = tapped[key] = make(taps, functions)
        try:
            result = fn(params, state, *inputs, tap_values=values, rng=rng,
                        inference_mode=inference_mode)
        except (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError):
            if not any(values):
                raise
            concrete.add(key)
            return tapped_call(params, state, *inputs, rng=rng, inference_mode=inference_mode,
                               capture=capture, intervene=intervene)
        outputs, new_state, captured = result
        if capture is None:
            return outputs, new_state
        return outputs, new_state, captured

    def apply(params, state, *inputs, **keywords: Any):
        # The plain call goes straight to the jitted function after one test of its
        # keywords.
        try:
            if keywords.keys() <= _PLAIN:
                return plain(params, state, *inputs, **keywords)
            return tapped_call(params, state, *inputs, **keywords)
        except (RuntimeError, ValueError) as e:
            reraise_deleted(e, "apply", params=params, state=state)
            raise

    for name in _JIT_ATTRIBUTES:
        if hasattr(plain, name):
            setattr(apply, name, getattr(plain, name))
    apply._plain = plain  # type: ignore[attr-defined]  # the jitted function, for benchmarks
    apply.__doc__ = model_apply.__doc__
    return apply
