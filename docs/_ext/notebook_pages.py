"""A mkdocs hook: the notebooks of notebooks/, executed when the site is built (with
nbclient, in a scratch folder: ``notebook_run``) and added as pages with their outputs:
text as text, figures and rendered graphs as they display in Jupyter. Nothing is written
into notebooks/ or docs/. With ``MLAXGRAPH_NOTEBOOK_CACHE`` set, the notebooks another
process of the same test session executed are read, not run again."""

from __future__ import annotations

import html
import os
import pathlib

import notebook_run  # docs/_ext, on sys.path while mkdocs loads this hook
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = "notebooks"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _fence(text: str, language: str = "text") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}\n"


def _output(output: dict) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _fence(_text(output.get("text", "")))
    if kind == "error":
        return _fence("\n".join(output.get("traceback", [])) or output.get("evalue", ""))
    data = output.get("data", {})
    if "text/html" in data:  # a graph's explorer, a table: as Jupyter shows it
        return f'<div class="mg-notebook-output">\n{_text(data["text/html"])}\n</div>\n'
    if "image/svg+xml" in data:
        return f'<div class="mg-notebook-output">\n{_text(data["image/svg+xml"])}\n</div>\n'
    if "image/png" in data:
        return f'<img alt="output" src="data:image/png;base64,{_text(data["image/png"]).strip()}">\n'
    if "text/plain" in data:
        return _fence(_text(data["text/plain"]))
    return ""


def to_markdown(notebook: dict, name: str) -> str:
    parts = [f"<!-- executed from notebooks/{html.escape(name)} when the site was built -->\n"]
    for cell in notebook.get("cells", []):
        source = _text(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            parts.append(source.rstrip() + "\n")
        elif cell.get("cell_type") == "code" and source.strip():
            parts.append(_fence(source, "python"))
            parts += [_output(o) for o in cell.get("outputs", [])]
    return "\n".join(p for p in parts if p)


def on_files(files, config):
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    executed = notebook_run.execute_all(paths, os.environ.get(notebook_run.CACHE_ENV))
    for path, notebook in zip(paths, executed):
        page = to_markdown(notebook, path.name)
        files.append(File.generated(config, f"{FOLDER}/{path.stem}.md", content=page))
    return files
