"""The rotary embedding's settings from a config, in both forms Hugging Face writes:
``rope_theta`` and ``rope_scaling`` (transformers 4.x), or ``rope_parameters``
(transformers 5.x: the base and the scaling in one dict)."""

from __future__ import annotations

import math
from typing import Any

from ..core.errors import ConfigError
from .config import Config

__all__ = ["rope_settings", "ROPE_FIELDS"]

#: The config fields read here (defaults: none given).
ROPE_FIELDS = {"rope_theta": 10000.0, "rope_scaling": None, "rope_parameters": None}

#: Each rope_type's parameters (Hugging Face's names); "default" has none.
_PARAMETERS = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings"),
               "yarn": ()}

#: Each rope_type's parameters that may be left out.
_OPTIONAL = {"yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                      "beta_slow", "mscale", "mscale_all_dim", "truncate")}


def _scaling(c: Config, field: str, value: Any) -> tuple[str, dict[str, Any], float | None]:
    """(rope_type, its parameters, the rope_theta inside) of a scaling dict."""
    if not isinstance(value, dict):
        raise ConfigError(f"{c.model}: config field {field!r} must be a dict "
                          f"(rope_type and its parameters), got {value!r}")
    value = dict(value)
    theta = value.pop("rope_theta", None)
    kind = value.pop("rope_type", None)
    legacy = value.pop("type", None)  # the older name of rope_type
    kind = kind or legacy or "default"
    if kind not in _PARAMETERS:
        raise ConfigError(f"{c.model}: config field {field!r} has rope_type {kind!r}, which is "
                          f"not supported (supported: {', '.join(map(repr, _PARAMETERS))})")
    # Fields Hugging Face keeps beside the parameters and that change nothing here.
    for harmless in ("attention_factor",) if kind == "default" else ():
        value.pop(harmless, None)
    wanted = set(_PARAMETERS[kind])
    optional = set(_OPTIONAL.get(kind, ()))
    unknown, missing = sorted(set(value) - wanted - optional), sorted(wanted - set(value))
    if unknown or missing:
        raise ConfigError(f"{c.model}: config field {field!r} of rope_type {kind!r} takes "
                          f"{', '.join(sorted(wanted | optional)) or 'no parameters'}"
                          + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                          + (f"; missing: {', '.join(missing)}" if missing else ""))
    return kind, value, theta


def rope_settings(c: Config) -> tuple[float, dict[str, Any] | None]:
    """``(base, scaling)`` for ``ops.MultiHeadAttention(rope=base, rope_scaling=scaling)``
    (``scaling`` None when unscaled). ``rope_parameters`` (5.x) and ``rope_theta`` /
    ``rope_scaling`` (4.x) are both read; given both, they must agree."""
    theta = c.get("rope_theta")
    kind: str = "default"
    params: dict[str, Any] = {}
    if c.get("rope_scaling") is not None:
        kind, params, inner = _scaling(c, "rope_scaling", c["rope_scaling"])
        if inner is not None:
            theta = inner
    if c.get("rope_parameters") is not None:
        new_kind, new_params, new_theta = _scaling(c, "rope_parameters", c["rope_parameters"])
        if c.get("rope_scaling") is not None and (new_kind, new_params) != (kind, params):
            raise ConfigError(f"{c.model}: config fields 'rope_scaling' and 'rope_parameters' "
                              f"disagree ({c['rope_scaling']!r} and {c['rope_parameters']!r}); "
                              f"give one")
        if new_theta is not None:
            if "rope_theta" in c.given and float(c.given["rope_theta"]) != float(new_theta):
                raise ConfigError(f"{c.model}: config fields 'rope_theta' ({c.given['rope_theta']!r}) "
                                  f"and rope_parameters['rope_theta'] ({new_theta!r}) disagree")
            theta = new_theta
        kind, params = new_kind, new_params
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ConfigError(f"{c.model}: the rope base rope_theta must be a number > 1, got {theta!r}")
    if kind == "default":
        return float(theta), None
    if kind == "yarn":
        params = _yarn(c, params)
    return float(theta), {"rope_type": kind, **params}


def _yarn(c: Config, given: dict[str, Any]) -> dict[str, Any]:
    """YaRN's parameters as transformers 5 reads them: the original context
    ``original_max_position_embeddings`` (else ``max_position_embeddings``), ``factor``
    (else their ratio), the attention factor given, or from ``mscale`` and
    ``mscale_all_dim`` when both are given; a null field left out, for
    ``ops.MultiHeadAttention``'s ``rope_scaling`` to give its default (the attention
    factor ``0.1 ln(factor) + 1``, ``beta_fast`` 32, ``beta_slow`` 1, ``truncate``)."""
    p = {k: v for k, v in given.items() if v is not None}
    original = p.pop("original_max_position_embeddings", None) or c.get("max_position_embeddings")
    if original is None:
        raise ConfigError(f"{c.model}: rope_type 'yarn' needs original_max_position_embeddings "
                          f"(in the scaling) or max_position_embeddings")
    factor = p.pop("factor", None)
    if factor is None:
        factor = c.get("max_position_embeddings", original) / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = p.pop("mscale", None), p.pop("mscale_all_dim", None)
    if "attention_factor" not in p and m and m_all:
        p["attention_factor"] = mscale(factor, m) / mscale(factor, m_all)
    return {"factor": factor, "original_max_position_embeddings": original, **p}
