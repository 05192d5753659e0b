"""A griffe extension for the API reference: mlaxgraph's docstrings title their doctests
``Example:`` (Google style, singular), which griffe reads as a plain admonition and
renders as Markdown (so ``>>>`` lines become quotes). This reads them as the
``Examples:`` section they are, rendered as code. The package's files are not touched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames each ``Example:`` section header of a docstring to ``Examples:``."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _rename(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _rename(pkg)  # the top-level package gets no on_object


def _rename(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
