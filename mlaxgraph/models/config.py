"""A model's configuration: the original config's fields as a dict (what Hugging Face's
``config.to_dict()`` or a checkpoint's ``config.json`` gives), read with defaults, and
checked: a field the builder cannot honour is a ``ConfigError`` naming it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import ConfigError

__all__ = ["Config"]


class Config:
    """The fields of ``fields`` (a mapping, or a path to a ``config.json``) over the
    builder's ``defaults``. Fields the builder does not read (token ids, the names of
    the original classes, generation settings) are ignored, as Hugging Face does.

    Example:
      >>> c = Config("gpt2", {"n_embd": 64}, {"n_embd": 768, "n_head": 12})
      >>> c["n_embd"], c["n_head"]
      (64, 12)
    """

    def __init__(self, model: str, fields: Mapping[str, Any] | str | os.PathLike | None,
                 defaults: Mapping[str, Any]):
        self.model = model
        if isinstance(fields, (str, os.PathLike)):
            with open(fields, encoding="utf-8") as f:
                fields = json.load(f)
        if fields is None:
            fields = {}
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{model}: the config is a dict of the original config's fields "
                              f"(config.to_dict() or config.json), got {type(fields).__name__}")
        self.fields = {**defaults, **{k: v for k, v in fields.items() if v is not None or k not in defaults}}

    def __getitem__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise ConfigError(f"{self.model}: the config has no field {name!r}") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def positive_int(self, name: str) -> int:
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.model}: config field {name!r} must be a positive int, "
                              f"got {value!r}")
        return value

    def number(self, name: str, low: float = 0.0, high: float = float("inf")) -> float:
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
            raise ConfigError(f"{self.model}: config field {name!r} must be a number in "
                              f"[{low}, {high}), got {value!r}")
        return float(value)

    def choice(self, name: str, supported: Iterable[Any]) -> Any:
        """The field's value, which must be one of ``supported``."""
        value, supported = self[name], list(supported)
        if value not in supported:
            raise ConfigError(f"{self.model}: config field {name!r} = {value!r} is not "
                              f"supported; supported: {', '.join(repr(s) for s in supported)}")
        return value

    def unsupported(self, name: str, *allowed: Any) -> None:
        """A field whose other values the builder does not implement: absent, or one of
        ``allowed`` (the original's default)."""
        if name in self.fields and self.fields[name] not in allowed:
            raise ConfigError(f"{self.model}: config field {name!r} = {self.fields[name]!r} is "
                              f"not supported (supported: "
                              f"{', '.join(repr(a) for a in allowed)})")
