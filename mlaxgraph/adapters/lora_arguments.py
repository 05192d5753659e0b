"""``mg.lora``'s arguments, checked: ``rank``, ``alpha``, ``dropout``, ``use_rslora``,
``init_weights``, and the keywords it does not take (PEFT's ``LoraConfig`` spellings
named as the argument meant)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..core.errors import ConfigError
from ..core.signatures import unknown_keywords

__all__ = ["INIT_WEIGHTS", "LORA_SIGNATURE", "checked_arguments"]


def _number(name: str, value: Any) -> float:
    """A real number (NumPy's and JAX's scalars too), finite."""
    if getattr(value, "shape", None) == () and hasattr(value, "dtype") \
            and not isinstance(value, bool):
        value = value.item()  # a NumPy or JAX scalar: float32 is no Python float
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"lora: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"lora: {name} must be finite, got {value!r}")
    return float(value)


def _scale(rank: Any, alpha: Any, dropout: Any, use_rslora: Any) -> float:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"lora: rank must be a positive int, got {rank!r}")
    alpha = float(rank) if alpha is None else _number("alpha", alpha)
    if alpha <= 0:
        raise ConfigError(f"lora: alpha must be > 0 (the adapter's output is scaled by "
                          f"alpha / rank), got {alpha!r}")
    dropout = _number("dropout", dropout)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"lora: dropout must be in [0, 1), got {dropout!r}")
    if not isinstance(use_rslora, bool):
        raise ConfigError(f"lora: use_rslora must be a bool, got {use_rslora!r}")
    return alpha / (math.sqrt(rank) if use_rslora else rank)


#: ``init_weights`` values: PEFT's ``init_lora_weights`` that only choose how the adapters
#: start (the others, PiSSA, OLoRA, LoftQ ..., change the base weights too).
INIT_WEIGHTS = (True, False, "gaussian")


LORA_SIGNATURE = ("lora(graph, targets, *, rank, alpha=None, dropout=0.0, use_rslora=False, "
                   "init_weights=True)")
#: PEFT's ``LoraConfig`` spellings of lora's arguments.
_PEFT_NAMES = {"r": "PEFT's r is rank=", "lora_alpha": "PEFT's lora_alpha is alpha=",
               "lora_dropout": "PEFT's lora_dropout is dropout=",
               "target_modules": "PEFT's target_modules are lora's second argument, targets",
               "init_lora_weights": "PEFT's init_lora_weights is init_weights=",
               "use_dora": "mg.lora makes LoRA adapters; DoRA is not built"}


def checked_arguments(targets: Any, rank: Any, alpha: Any, dropout: Any, use_rslora: Any,
                      init_weights: Any, unknown: dict) -> tuple[int, float]:
    """``(rank, scale)`` from ``lora``'s arguments, or a ``ConfigError`` naming the
    wrong one: a keyword it does not take, targets or rank missing, a value out of
    range."""
    if unknown:
        raise ConfigError(unknown_keywords("lora", unknown, LORA_SIGNATURE, _PEFT_NAMES))
    if targets is None or rank is None:
        missing = " and ".join(n for n, v in (("targets (PEFT's target_modules)", targets),
                                              ("rank= (PEFT's r)", rank)) if v is None)
        raise ConfigError(f"lora needs {missing}; it takes {LORA_SIGNATURE}")
    if isinstance(rank, numbers.Integral) and not isinstance(rank, bool):
        rank = int(rank)  # NumPy's ints too
    scale = _scale(rank, alpha, dropout, use_rslora)
    if not any(init_weights == v and type(init_weights) is type(v) for v in INIT_WEIGHTS):
        raise ConfigError(f"lora: init_weights must be one of {INIT_WEIGHTS} (PEFT's "
                          f"init_lora_weights), got {init_weights!r}")
    return rank, scale
