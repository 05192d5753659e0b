"""Rendering with Graphviz's ``dot`` executable: files (svg, png, pdf, ...) and the
notebook display of a ``Graph`` (``_repr_svg_`` / ``_repr_html_``).

``dot`` runs as a subprocess with the DOT text on its standard input and a timeout;
nothing else from Graphviz (nor its Python package) is needed.
"""

from __future__ import annotations

import html
import os
import pathlib
import re
import shutil
import subprocess
import warnings
from typing import Any

from ..core.errors import GraphError, MlaxGraphError
from ..io.weights import write_atomic
from .dot import graph_to_dot

__all__ = ["render_graph", "render_bytes", "repr_svg", "repr_html", "find_dot",
           "GraphvizError", "GraphvizNotFoundError", "FORMATS", "INSTALL_HINT"]

#: Output formats ``render_graph`` accepts. ``dot`` / ``gv`` write the DOT text itself
#: and need no Graphviz.
FORMATS = ("svg", "png", "pdf", "jpg", "jpeg", "gif", "ps", "eps", "dot", "gv")

INSTALL_HINT = ("Graphviz's `dot` was not found: install it with `apt-get install graphviz` "
                "(Debian/Ubuntu), `brew install graphviz` (macOS) or `conda install graphviz`")

#: Seconds ``dot`` may run before it is stopped.
DEFAULT_TIMEOUT = 60.0


class GraphvizError(MlaxGraphError, RuntimeError):
    """Graphviz's ``dot`` failed, timed out or was not found."""


class GraphvizNotFoundError(GraphvizError, FileNotFoundError):
    """Graphviz's ``dot`` is not on the PATH (also a ``FileNotFoundError``)."""


def find_dot() -> str:
    """The path of the ``dot`` executable on the PATH; ``GraphvizNotFoundError`` (a
    ``FileNotFoundError`` and ``RuntimeError``) with install instructions when missing."""
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFoundError(INSTALL_HINT)
    return dot


def render_bytes(dot_text: str, format: str = "svg", *, dpi: float | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """Runs ``dot -T<format>`` on ``dot_text``; returns what it wrote."""
    command = [find_dot(), f"-T{format}"]
    if dpi is not None:
        command.append(f"-Gdpi={float(dpi):g}")
    try:
        done = subprocess.run(command, input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GraphvizError(f"Graphviz's `dot` did not finish in {timeout:g} s "
                            f"(rendering {format}); pass a larger timeout=") from None
    except FileNotFoundError:  # removed between the lookup and the run
        raise GraphvizNotFoundError(INSTALL_HINT) from None
    except OSError as e:
        raise GraphvizError(f"Graphviz's `dot` could not run: {e}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise GraphvizError(f"Graphviz's `dot -T{format}` failed (exit status "
                            f"{done.returncode}): {message or 'no message'}")
    return done.stdout


def render_graph(graph, path: Any, format: str | None = None, *, dpi: float | None = None,
                 timeout: float = DEFAULT_TIMEOUT, **options: Any) -> pathlib.Path:
    """Renders ``graph`` to the file ``path`` with Graphviz's ``dot``.

    Args:
      graph: an ``mg.Graph``.
      path: the file to write (parent folders must exist); written as given, the
        format's suffix is not added.
      format: ``svg``, ``png``, ``pdf`` (or another of ``FORMATS``); by default the
        suffix of ``path``.
      dpi: resolution of raster formats (png, jpg, gif); Graphviz's default is 96.
      timeout: seconds ``dot`` may take.
      **options: the drawing options of ``graph_to_dot`` (``show_shapes``,
        ``show_dtype``, ``show_params``, ``show_attrs``, ``expand_nested``,
        ``rankdir``, ``show_legend``).

    Returns:
      ``path`` as a ``pathlib.Path``.

    Raises:
      GraphvizNotFoundError: ``dot`` is not installed (a ``FileNotFoundError``).
      GraphvizError: ``dot`` failed or timed out (a ``RuntimeError``).
      GraphError: no format could be told from the arguments, or a ``dpi`` that is not
        a number from 1 to 2400 (a ``ValueError``).
    """
    path = pathlib.Path(os.fspath(path))
    if format is None:
        format = path.suffix.lstrip(".")
        if not format:
            raise GraphError(f"render: cannot tell the format of {str(path)!r}: give the file a "
                             f"suffix or pass format= (one of {', '.join(FORMATS)})")
    if dpi is not None and (isinstance(dpi, bool) or not isinstance(dpi, (int, float))
                            or not 0 < dpi <= 2400):  # a negative one made dot hang
        raise GraphError(f"render: dpi is a number from 1 to 2400 (Graphviz's default is 96), "
                         f"got {dpi!r}")
    format = format.lower().lstrip(".")
    suffix = path.suffix.lower().lstrip(".")
    if suffix in FORMATS and suffix != format and {suffix, format} not in ({"jpg", "jpeg"},
                                                                            {"dot", "gv"}):
        raise GraphError(f"render: format={format!r} for {str(path)!r}, whose suffix says "
                         f"{suffix}: a {format} file named .{suffix} is a mistake either way")
    if format not in FORMATS:
        page = ("; the interactive page is graph.to_html(path)"
                if format in ("html", "htm") else "")
        raise GraphError(f"render: unknown format {format!r} (of {str(path)!r}); Graphviz "
                         f"writes one of {', '.join(FORMATS)}{page}")
    text = graph_to_dot(graph, **options)
    if format in ("dot", "gv"):
        data = text.encode("utf-8")
    else:
        data = render_bytes(text, "jpeg" if format == "jpg" else format, dpi=dpi, timeout=timeout)
    write_atomic(path, lambda f: f.write(data))  # a failed render leaves no partial file
    return path


_PROLOG = re.compile(r"\A\s*<\?xml[^>]*\?>\s*(<!DOCTYPE[^>]*>\s*)?", re.DOTALL)


def repr_svg(graph, **options: Any) -> str | None:
    """The graph as SVG text, for notebooks; ``None`` when ``dot`` is missing or fails
    (a warning says why), so the notebook falls back to the next representation."""
    try:
        return render_bytes(graph_to_dot(graph, **options), "svg").decode("utf-8")
    except GraphvizNotFoundError:
        return None
    except GraphvizError as e:
        warnings.warn(f"cannot draw graph {graph.name!r}: {e}", RuntimeWarning, stacklevel=2)
        return None


def repr_html(graph, **options: Any) -> str:
    """HTML with the SVG drawing (when ``dot`` is there) and ``graph.summary()`` in a
    ``<pre>``, everything from the graph escaped."""
    parts = ['<div class="mlaxgraph-graph">']
    svg = repr_svg(graph, **options)
    if svg is not None:
        parts.append(f"<div>{_PROLOG.sub('', svg)}</div>")
    parts.append(f"<pre>{html.escape(graph.summary())}</pre>")
    parts.append("</div>")
    return "\n".join(parts)
