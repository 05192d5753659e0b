"""The stages of a compiled model, as JAX gives them: its jaxpr, its lowering (StableHLO
text), its compiled form (optimized HLO text, XLA's cost analysis) and its
``jax.export`` artifact. Thin wrappers over ``jax.make_jaxpr``, ``jax.jit(...).lower(...)``
and ``jax.export``, read by ``CompiledModel``'s inspection methods, the analysis
(``mlaxgraph.analysis``) and the exported files (``mlaxgraph.io.exported``). Symbolic
dims are bound by name (``batch=8``) or taken from example arrays."""

from __future__ import annotations

import difflib
import functools
from typing import Any

import jax

from ..core.errors import ConfigError, ShapeError
from ..core.specs import dim_names, is_int, is_symbolic, match_shape

__all__ = ["abstract_args", "dim_values", "jaxpr", "lower", "hlo", "cost", "export"]


def _rng_spec(model, inference_mode: bool):
    if inference_mode or not model.program.random_paths():
        return None
    return jax.eval_shape(jax.random.key, 0)


#: The inspection methods' keyword arguments, which a misspelling turns into a dim name.
_KEYWORDS = ("optimized", "inference_mode", "debug_info", "xla", "every")


def _check_dims(model, example: tuple, dims: dict[str, Any]) -> None:
    """Dim values name symbolic dims of the graph's inputs (a misspelt keyword such as
    ``optimised=True`` would otherwise be a dim nobody reads), and come without example
    arrays, whose shapes give the dims."""
    known = list(dict.fromkeys(n for s in model.graph.input_specs for n in dim_names(s.shape)))
    for name in dims:
        if name not in known:
            near = difflib.get_close_matches(name, [*known, *_KEYWORDS], n=1)
            hint = f"; did you mean {near[0]}=?" if near else ""
            raise ShapeError(f"{name}={dims[name]!r} names no symbolic dim of graph "
                             f"{model.graph.name!r} (its inputs' symbolic dims: "
                             f"{', '.join(known) or 'none'}){hint}")
    for name, value in dims.items():  # batch=-1 was a TypeError, "2" and 2.0 taken
        if not is_int(value) or value < 1:
            raise ShapeError(f"dim {name}={value!r}: dim values are positive ints (batch=8)")
    if example and dims:
        raise ShapeError(f"give example arrays or the symbolic dims' values "
                         f"({', '.join(f'{k}={v!r}' for k, v in dims.items())}), not both: the "
                         f"arrays' shapes give the dims")


def abstract_args(model, example: tuple, dims: dict[str, int], inference_mode: bool):
    """(params, state, inputs, rng) as ShapeDtypeStructs for ``model.apply``."""
    _check_dims(model, example, dims)
    specs = model.graph.input_specs
    if example:
        if len(example) != len(specs):
            raise ShapeError(f"graph {model.graph.name!r} takes {len(specs)} inputs, "
                             f"got {len(example)} example arrays")
        inputs = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in example)
    else:
        needed = [n for s in specs for n in dim_names(s.shape)]
        missing = [n for n in dict.fromkeys(needed) if n not in dims]
        if missing:
            raise ShapeError(f"give a value for each symbolic dim ({', '.join(f'{n}=...' for n in missing)}) "
                             f"or example arrays")
        inputs = tuple(s.bind(dims) for s in specs)
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    return params, state, inputs, _rng_spec(model, inference_mode)


def dim_values(model, example: tuple, dims: dict[str, int]) -> dict[str, int]:
    """The value of each symbolic dim of the graph's inputs, by name: from ``dims`` or
    read off the example arrays' shapes."""
    _check_dims(model, example, dims)
    specs = model.graph.input_specs
    if example:
        if len(example) != len(specs):
            raise ShapeError(f"graph {model.graph.name!r} takes {len(specs)} inputs, "
                             f"got {len(example)} example arrays")
        found: dict[str, Any] = {}
        for spec, x in zip(specs, example):
            if not match_shape(spec.shape, tuple(x.shape), found):
                raise ShapeError(f"an example array of shape {tuple(x.shape)} does not fit "
                                 f"the input {spec}")
        return {name: int(value) for name, value in found.items()}
    needed = list(dict.fromkeys(n for s in specs for n in dim_names(s.shape)))
    missing = [n for n in needed if n not in dims]
    if missing:
        raise ShapeError(f"give a value for each symbolic dim ({', '.join(f'{n}=...' for n in missing)}) "
                         f"or example arrays")
    return {name: int(dims[name]) for name in needed}


def jaxpr(model, *example: Any, inference_mode: bool = False, **dims: int):
    params, state, inputs, rng = abstract_args(model, example, dims, inference_mode)
    fn = functools.partial(model.apply_fn, inference_mode=inference_mode)
    return jax.make_jaxpr(fn)(params, state, *inputs, rng=rng)


def lower(model, example: tuple, dims: dict[str, int], inference_mode: bool):
    """``model.apply`` lowered (``jax.stages.Lowered``) for example arrays or dim values."""
    params, state, inputs, rng = abstract_args(model, example, dims, inference_mode)
    return model.apply.lower(params, state, *inputs, rng=rng, inference_mode=inference_mode)


def hlo(model, *example: Any, optimized: bool = False, inference_mode: bool = False,
        debug_info: bool = True, **dims: int) -> str:
    lowered = lower(model, example, dims, inference_mode)
    if optimized:
        return lowered.compile().as_text()
    # debug_info keeps the locations that name each operation's layer (named scopes).
    return lowered.as_text(debug_info=debug_info)


def cost(model, *example: Any, inference_mode: bool = False, **dims: int) -> dict[str, float]:
    analysis = lower(model, example, dims, inference_mode).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX returned one dict per device
        analysis = analysis[0] if analysis else {}
    # Keys like 'bytes accessed0{}' are per operand of the entry computation: dropped.
    return {k: float(v) for k, v in (analysis or {}).items() if not k.endswith("}")}


def export(model, *, inference_mode: bool = True, platforms=None):
    """``jax.export.export`` of ``apply`` with the graph's symbolic dims kept symbolic."""
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    inputs = tuple(s.to_jax() for s in model.graph.input_specs)
    rng = _rng_spec(model, inference_mode)
    fn = jax.jit(functools.partial(model.apply_fn, inference_mode=inference_mode))
    kwargs: dict[str, Any] = {} if platforms is None else {"platforms": _platforms(platforms)}
    if rng is None:
        return jax.export.export(fn, **kwargs)(params, state, *inputs)
    return jax.export.export(fn, **kwargs)(params, state, *inputs, rng=rng)


#: The platforms jax.export lowers for.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _platforms(platforms: Any) -> tuple[str, ...]:
    """``export(platforms=...)``: a platform name or a sequence of them, each one jax
    lowers for ("cpu" was read as the platforms 'c', 'p', 'u')."""
    names = (platforms,) if isinstance(platforms, str) else platforms
    if not isinstance(names, (tuple, list)) or not names or \
            not all(isinstance(n, str) and n.lower() in PLATFORMS for n in names):
        raise ConfigError(f"export(platforms={platforms!r}): platforms is one of {PLATFORMS} or "
                          f"a tuple of them (('cpu', 'cuda') for an artifact that runs on both)")
    return tuple(n.lower() for n in names)


def dim_limits(graph) -> dict[str, int]:
    """The largest value a symbolic input dim may take, by name, where a layer bounds it
    (``ops.arange(seq, limit=...)``: a position table's size). ``jax.export`` artifacts do
    not carry these bounds (their dims are the graph's, unconstrained): ``save_hlo``'s
    manifest records them and ``load_exported``'s ``apply`` checks them."""
    from ..ops.creation import Arange  # ops import the compiler's modules

    limits: dict[str, int] = {}
    for _, node in graph.walk():
        op = node.op
        if isinstance(op, Arange) and op.limit is not None and is_symbolic(op.n) \
                and op.n._to_var() is not None:
            name = op.n._to_var()
            limits[name] = min(limits.get(name, op.limit), op.limit)
    return limits
