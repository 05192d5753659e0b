"""Policy: which dtypes a compiled model keeps its weights in, computes in and returns."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.errors import DTypeError
from ..core.signatures import KeywordsNamed
from ..core.specs import as_dtype

__all__ = ["Policy"]

_FLOAT32 = np.dtype("float32")


@dataclasses.dataclass(frozen=True)
class Policy(KeywordsNamed):
    """A mixed-precision policy for ``mg.compile``.

    Args:
      param_dtype: dtype weights are created and kept in (cast to the compute dtype
        inside each layer).
      compute_dtype: dtype layers compute in; float graph inputs are cast to it.
        Precision-sensitive layers (BatchNorm, softmax, ...) compute in float32.
      output_dtype: dtype float graph outputs are cast to; defaults to
        ``compute_dtype``, as in Keras. Give ``output_dtype="float32"`` for float32
        logits from a half-precision model.
      overrides: layer name -> the dtype that layer computes in, overriding both rules
        above (a block's name sets the compute dtype of its layers). Names must be
        layers of the compiled graph. A dict is accepted; it is stored as sorted pairs
        so a Policy is hashable.

    Example:
      >>> Policy(compute_dtype="bfloat16", overrides={"logits": "float32"})
      Policy(param_dtype=float32, compute_dtype=bfloat16, output_dtype=bfloat16, overrides={'logits': 'float32'})
    """

    param_dtype: Any = "float32"
    compute_dtype: Any = "float32"
    output_dtype: Any = None
    overrides: Any = ()

    def __post_init__(self):
        set_ = object.__setattr__
        for field in ("param_dtype", "compute_dtype"):
            dtype = as_dtype(getattr(self, field))
            if not np.issubdtype(dtype, np.floating) and dtype.name != "bfloat16":
                raise DTypeError(f"Policy.{field} must be a float dtype, got {dtype}")
            set_(self, field, dtype)
        set_(self, "output_dtype", self.compute_dtype if self.output_dtype is None
             else as_dtype(self.output_dtype))
        overrides = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
        try:
            pairs = tuple(sorted((str(name), as_dtype(dtype)) for name, dtype in overrides))
        except (TypeError, ValueError) as e:
            raise DTypeError(f"Policy.overrides must map layer names to dtypes, got "
                             f"{self.overrides!r}") from e
        set_(self, "overrides", pairs)

    def dtype_for(self, name: str, precision_sensitive: bool) -> np.dtype:
        """The dtype the layer called ``name`` computes in under this policy."""
        for layer, dtype in self.overrides:
            if layer == name:
                return dtype
        return _FLOAT32 if precision_sensitive else self.compute_dtype

    @classmethod
    def named(cls, name: str) -> Policy:
        """The policy for a short name, as the command line takes it: ``float32``,
        ``bfloat16`` or ``float16`` (Keras's ``mixed_bfloat16`` and ``mixed_float16``
        are accepted too): weights in float32, computing in that dtype.

        Example:
          >>> Policy.named("mixed_bfloat16").compute_dtype
          dtype(bfloat16)
        """
        key = str(name).lower().removeprefix("mixed_")
        if key not in ("float32", "bfloat16", "float16"):
            short = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16",
                     "fp32": "float32", "f32": "float32"}.get(key)
            near = short or next(iter(difflib.get_close_matches(key, ("float32", "bfloat16",
                                                                       "float16"), n=1)), None)
            hint = f" (did you mean {near!r}?)" if near else ""
            raise DTypeError(f"unknown policy {name!r}{hint}: use float32, bfloat16 or float16")
        return cls(compute_dtype=key)

    def __repr__(self) -> str:
        overrides = {k: str(v) for k, v in self.overrides}
        return (f"Policy(param_dtype={self.param_dtype}, compute_dtype={self.compute_dtype}, "
                f"output_dtype={self.output_dtype}, overrides={overrides})")
