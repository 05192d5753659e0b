"""The rotary embedding's settings from a config, in both forms Hugging Face writes:
``rope_theta`` and ``rope_scaling`` (transformers 4.x), or ``rope_parameters``
(transformers 5.x: the base and the scaling in one dict)."""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError
from .config import Config

__all__ = ["rope_settings", "ROPE_FIELDS"]

#: The config fields read here (defaults: none given).
ROPE_FIELDS = {"rope_theta": 10000.0, "rope_scaling": None, "rope_parameters": None}

#: Each rope_type's parameters (Hugging Face's names); "default" has none.
_PARAMETERS = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings")}


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
    unknown, missing = sorted(set(value) - wanted), sorted(wanted - set(value))
    if unknown or missing:
        raise ConfigError(f"{c.model}: config field {field!r} of rope_type {kind!r} takes "
                          f"{', '.join(sorted(wanted)) or 'no parameters'}"
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
    return float(theta), {"rope_type": kind, **params}
