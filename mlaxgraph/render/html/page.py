"""The explorer page: one self-contained HTML document (styles, script and the graph's
data inline; nothing is fetched), and its uses: a file, a notebook cell, a browser tab.

The data travels as JSON in a ``<script type="application/json">`` element, with ``<``,
``>``, ``&`` and the line separators U+2028/U+2029 written as ``\\u`` escapes, so no name
can close the element or open another; the script reads it with ``JSON.parse`` and puts
every text on the page with ``textContent``. A Content-Security-Policy allows only the
page's own script (by its hash) and nothing from the network.
"""

from __future__ import annotations

import base64
import difflib
import functools
import hashlib
import html
import importlib.resources
import json
import os
import pathlib
import sys
import tempfile
from typing import Any

from ...compiler.compile import CompiledModel
from ...core.errors import GraphError
from ...core.specs import dim_names
from ...io.weights import write_atomic
from ...ir.graph import Graph
from ..dot_style import DEFAULT_OPTIONS, unknown_option
from .payload import graph_payload, model_payload

__all__ = ["to_html", "page_html", "payload_of", "embed_json", "notebook_html", "show", "write_page"]

_BODY = """<div id="mg-bar">
<span id="mg-heading"></span><span id="mg-meta"></span>
<input type="search" id="mg-search" placeholder="search layers (Enter: next)" aria-label="search layers">
<button type="button" id="mg-prev" title="previous match">&#8593;</button>
<button type="button" id="mg-next" title="next match">&#8595;</button>
<span id="mg-count"></span>
<select id="mg-overlay" aria-label="colour by"></select>
<button type="button" id="mg-expand-all" data-state="collapsed">expand all</button>
<button type="button" id="mg-zoom-out" title="zoom out">&#8722;</button>
<button type="button" id="mg-zoom-in" title="zoom in">+</button>
<button type="button" id="mg-fit" title="fit to the window">fit</button>
</div>
<div id="mg-main">
<svg id="mg-svg" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="model graph">
<defs><marker id="mg-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"
 orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#868e96"/></marker></defs>
<g id="mg-world"><g id="mg-clusters"></g><g id="mg-edges"></g><g id="mg-nodes"></g></g>
</svg>
<div id="mg-legend"></div>
<aside data-panel hidden><button type="button" id="mg-close" title="close">&#215;</button>
<div id="mg-panel-body"></div></aside>
</div>"""


@functools.cache
def _static(name: str) -> str:
    return importlib.resources.files(__package__).joinpath("static", name).read_text("utf-8")


_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                 "\u2029": "\\u2029"}


def embed_json(data: Any) -> str:
    """JSON text safe inside a ``<script>`` element: ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped (JSON.parse reads them back as they were).

    Example:
      >>> embed_json({"name": "</script>"})
      '{"name":"\\\\u003c/script\\\\u003e"}'
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escape in _JSON_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def page_html(payload: dict) -> str:
    """The page for a payload (``payload.graph_payload``, ``model_payload`` or
    ``diff.diff_payload``)."""
    script = _static("explorer.js")
    style = _static("explorer.css")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    policy = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
              "img-src data:; base-uri 'none'; form-action 'none'")
    data = embed_json(payload)
    title = html.escape(f"{payload['title']} \u2014 mlaxgraph explorer")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<link rel="icon" href="data:,">\n'
            f"<title>{title}</title>\n<style>\n{style}</style>\n</head>\n<body>\n{_BODY}\n"
            f'<script type="application/json" id="mlaxgraph-data">{data}</script>\n'
            f"<script>{script}</script>\n</body>\n</html>\n")


def payload_of(obj, *, overlay=None, hlo: bool = False, title: str | None = None,
               fold: bool = True, **dims: int) -> dict:
    """The page data of a graph or a compiled model; ``GraphError`` for anything else."""
    if isinstance(obj, CompiledModel):
        return model_payload(obj, overlay=overlay, dims=dims, hlo=hlo, title=title, fold=fold)
    if isinstance(obj, Graph):
        if hlo:
            raise GraphError("hlo=True needs a compiled model (mg.compile(graph)): a graph "
                             "has no HLO")
        return graph_payload(obj, overlay=overlay, dims=dims, title=title, fold=fold)
    raise GraphError(f"the explorer draws an mg.Graph or an mg.CompiledModel, got "
                     f"{type(obj).__name__}")


def write_page(path: Any, text: str) -> pathlib.Path:
    """Writes the page to ``path`` atomically (no partial file on failure)."""
    path = pathlib.Path(os.fspath(path))
    data = text.encode("utf-8")
    write_atomic(path, lambda f: f.write(data))
    return path


def to_html(obj, path: Any = None, *, overlay=None, hlo: bool = False, title: str | None = None,
            fold: bool = True, **dims: int):
    """The explorer page of a graph or compiled model: the HTML text, or, given ``path``,
    the page written there (atomically) and its ``pathlib.Path``.

    Args:
      obj: an ``mg.Graph`` or ``mg.CompiledModel``.
      path: where to write the page; None to return the text.
      overlay: what colours the nodes at first: ``"dtype"`` (the default), ``"flops"``,
        ``"params"``, ``"activation_bytes"``, or a dict of layer path -> number (measured
        times, say) shown as the ``values`` overlay; the page switches between them.
      hlo: for a compiled model, list each layer's optimized HLO operations in its
        details (compiles the model; every symbolic dim needs a value).
      title: the page's heading; the graph's name by default.
      fold: draw runs of equal consecutive blocks folded, with their count.
      **dims: values of symbolic dims (``batch=8``) at which FLOPs and activation bytes
        are evaluated (a dim without one counts as 1, and the legend says so).
    """
    check_dims("to_html", obj, dims, ["overlay", "hlo", "title", "fold"])
    text = page_html(payload_of(obj, overlay=overlay, hlo=hlo, title=title, fold=fold, **dims))
    if path is None:
        return text
    return write_page(path, text)


def check_dims(function: str, obj: Any, dims: dict, options: list[str]) -> None:
    """Each keyword beyond ``options`` must be a symbolic dim of the graph's inputs: a
    typo'd option is an error suggesting the near name, not a dim binding."""
    graph = obj.graph if isinstance(obj, CompiledModel) else obj
    if not isinstance(graph, Graph):
        return  # the payload names what it takes
    known = sorted({name for spec in graph.input_specs for name in dim_names(spec.shape)})
    for name in dims:
        if name not in known:
            more = (f" (the last {len(known)} the graph's symbolic dims, as name=int)" if known
                    else " (the graph has no symbolic dims to bind)")
            drawing = difflib.get_close_matches(name, list(DEFAULT_OPTIONS), n=1, cutoff=0.6)
            if drawing:
                more += f"; {drawing[0]!r} is an option of to_dot and render"
            raise unknown_option(function, name, options + known, more)


def notebook_html(page: str, height: int = 560) -> str:
    """The page in a sandboxed ``<iframe srcdoc>`` for a notebook cell, so several
    pages on one notebook never share ids or scripts."""
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" '
            f'style="width:100%;height:{int(height)}px;border:1px solid #dee2e6;border-radius:4px" '
            'title="mlaxgraph explorer"></iframe>')


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and hasattr(shell, "kernel")


def show(obj, *, height: int = 560, open_browser: bool = True, **options: Any):
    """Shows the explorer of a graph, a compiled model or a diff page.

    In a notebook the page displays in the cell (and ``None`` is returned); elsewhere it
    is written to a temporary file, opened in the web browser (unless
    ``open_browser=False``), and its path returned.

    Args:
      obj: an ``mg.Graph``, an ``mg.CompiledModel``, or page text from ``to_html`` /
        ``mg.diff_html``.
      height: the height of the notebook frame, in pixels.
      open_browser: outside a notebook, open the page in the default browser.
      **options: as ``to_html`` (``overlay``, ``hlo``, dims ...).
    """
    page = obj if isinstance(obj, str) else to_html(obj, **options)
    if isinstance(obj, str) and options:
        raise GraphError("options apply to a graph or compiled model, not to page text")
    if isinstance(obj, str) and not obj.lstrip().startswith("<!DOCTYPE html>"):
        raise GraphError("mg.show takes a graph, a compiled model or an explorer page's text")
    if _in_notebook():
        from IPython.display import HTML, display

        display(HTML(notebook_html(page, height)))
        return None
    handle, name = tempfile.mkstemp(prefix="mlaxgraph-", suffix=".html")
    os.close(handle)
    path = write_page(name, page)
    if open_browser:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return path
