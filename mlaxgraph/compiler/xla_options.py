"""The XLA options mlaxgraph compiles its programs with: ``model.init``'s, chosen for
compile time, and the train step's, chosen from the model's layers.

Every option is checked against the installed jaxlib (a trial compile of an empty
program) once: options another XLA version does not know are left out of the
defaults, and an option a user names that this XLA does not know is a ``ConfigError``.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax

from ..core.donated import reraise_deleted
from ..core.errors import ConfigError

if TYPE_CHECKING:
    from .program import Program

__all__ = ["INIT_COMPILER_OPTIONS", "STEP_COMPILER_OPTIONS", "init_compiler_options",
           "step_compiler_options", "checked_compiler_options", "TopLevelJit"]

#: ``model.init`` runs once, so it is compiled for compile time: XLA's first level of
#: backend optimization, and on CPU the elemental emitter rather than the fusion
#: emitters, which compile each kernel several times slower (init has a kernel per weight).
INIT_COMPILER_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 1,
                                         "xla_cpu_use_fusion_emitters": False}

#: The train step of a model without convolutions: XLA's region-based analysis when it
#: inserts copies. A step whose state is donated updates each weight in place while
#: the backward pass still reads it; XLA's default analysis cannot always prove the
#: reads come first, so it copies the weight at the start of the step. The region
#: analysis proves more of them and drops the copies: GPT-2 small's train step 0.96x
#: the time (its 154 MB token table was copied every step), the MLP's peak memory
#: 0.95x. Steps with convolutions keep XLA's default: the ResNet-style CNN's step
#: measured 7 – 9% slower without the copies (benchmarks/RESULTS.md, section 14).
STEP_COMPILER_OPTIONS: dict[str, Any] = {"xla_cpu_copy_insertion_use_region_analysis": True}


@functools.cache
def _refusal(name: str, value: Any) -> str | None:
    """Why this jaxlib's XLA refuses the option, or None when it takes it."""
    try:
        jax.jit(lambda: 0).lower().compile(compiler_options={name: value})
    except Exception as e:  # noqa: BLE001  (XLA's runtime error, by message)
        return str(e).removeprefix("INVALID_ARGUMENT: ").strip()
    return None


def _known(name: str, value: Any) -> bool:
    return _refusal(name, value) is None


def _known_part(options: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if _known(name, value)}


def init_compiler_options() -> dict[str, Any]:
    """INIT_COMPILER_OPTIONS less those this jaxlib does not know."""
    return _known_part(INIT_COMPILER_OPTIONS)


def _convolves(program: Program) -> bool:
    from ..ops.spatial import CONVOLUTION_OPS  # ops import the compiler's modules

    return any(step.op.op_name in CONVOLUTION_OPS for step in program.all_steps())


def step_compiler_options(program: Program) -> dict[str, Any]:
    """The train step's options for ``program``: STEP_COMPILER_OPTIONS (less those this
    jaxlib does not know) when no layer convolves, else XLA's defaults."""
    return {} if _convolves(program) else _known_part(STEP_COMPILER_OPTIONS)


def checked_compiler_options(options: Any, where: str) -> dict[str, Any]:
    """``options`` as given by a user: a mapping of XLA option names to values, each one
    this jaxlib knows. ``where`` names the call in the error."""
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: compiler_options is a mapping of XLA option names to "
                          f"values (e.g. {{'xla_backend_optimization_level': 1}}), got "
                          f"{type(options).__name__}")
    for name, value in options.items():
        if not isinstance(name, str):
            why: str | None = "option names are strings"
        elif not isinstance(value, (bool, int, float, str)):
            why = f"values are booleans, numbers or strings, got {type(value).__name__}"
        else:
            why = _refusal(name, value)
        if why is not None:
            known = [*INIT_COMPILER_OPTIONS, *STEP_COMPILER_OPTIONS]
            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near and near[0] != name else ""
            raise ConfigError(f"{where}: XLA (jaxlib {jax.__version__}) refuses the compiler "
                              f"option {name!r} = {value!r}{hint}: {why}")
    return dict(options)


class TopLevelJit:
    """``jax.jit(fn, **jit_kwargs)`` compiled with ``compiler_options`` where jax allows
    them: a call from Python (and ``lower``, ``trace``) runs the jit with the options; a
    call inside another trace (``jax.make_jaxpr``, an outer ``jax.jit``) runs the same
    jit without them, as jax takes compiler options on top-level jits only (the outer
    program is compiled with its own). Nothing is checked per call: jax refuses the
    options when it stages the call into the outer trace, and that refusal sends the
    call to the jit without them (whose trace counts once more, the first time)."""

    def __init__(self, fn: Callable, compiler_options: Mapping[str, Any] | None,
                 name: str | None = None, argnames: tuple[str, ...] = (), **jit_kwargs: Any):
        self._plain = jax.jit(fn, **jit_kwargs)
        self._top = (jax.jit(fn, compiler_options=dict(compiler_options), **jit_kwargs)
                     if compiler_options else self._plain)
        # given: a failed call whose arguments hold a deleted (donated) array names it
        self._name, self._argnames = name, argnames

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._top(*args, **kwargs)
        except (ValueError, RuntimeError) as e:
            return self.after_failure(e, args, kwargs)

    @property
    def first_try(self) -> Callable:
        """What a call runs first: a caller with its own checks (``CheckedStep``) calls it
        directly, one Python frame fewer, and hands a ``ValueError`` or ``RuntimeError``
        it raises to ``after_failure``."""
        return self._top

    def after_failure(self, e: Exception, args: tuple, kwargs: dict) -> Any:
        """``first_try(*args, **kwargs)`` raised ``e``: inside another trace, the same
        jit without the options; else ``e`` (naming a deleted argument where one is)."""
        if self._top is self._plain or "top-level" not in str(e):
            if self._name is not None:
                reraise_deleted(e, self._name, **dict(zip(self._argnames, args)), **kwargs)
            raise e
        return self._plain(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self._top.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return self._top.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        return self._plain.eval_shape(*args, **kwargs)
