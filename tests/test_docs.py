"""The docs' examples run: every ```python block of each docs/*.md page and of README.md.

A page's blocks run top to bottom in one namespace, as a reader pastes them into one
session. Each block is compiled with the page's path as its file name and its real line
numbers, so a failure (and any mlaxgraph error message about a node) points at the
Markdown line.
"""

from __future__ import annotations

import linecache
import pathlib
import re
import traceback

import pytest

from mlaxgraph.ops import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# A fence opening with ```python (nothing else on the line) up to the next closing ```.
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first code line, code) for each ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in PYTHON_BLOCK.finditer(text)]


def test_python_blocks_are_found():
    text = "intro\n```python\nx = 1\n```\ntext\n```text\nnot code\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (10, "y = 2\n")]


def test_every_docs_page_exists():
    names = {p.name for p in PAGES}
    for page in ("index.md", "quickstart.md", "concepts.md", "policies.md", "inspect.md",
                 "errors.md", "writing_layers.md", "design.md"):
        assert page in names, f"docs/{page} is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: pathlib.Path, tmp_path, monkeypatch):
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(ROOT))
    blocks = python_blocks(text)
    # The source lines of the page, for tracebacks and for the source line that
    # mlaxgraph's errors quote (the file name is relative, the cwd is a temp dir).
    lines = text.splitlines(keepends=True)
    linecache.cache[name] = (len(text), None, lines, name)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    saved_ops = registry.registered_ops()  # pages may register example ops
    namespace: dict = {"__name__": "__main__"}
    try:
        for number, (line, code) in enumerate(blocks, start=1):
            padded = "\n" * (line - 1) + code  # line numbers of the Markdown file
            failure = None
            try:
                exec(compile(padded, name, "exec"), namespace)
            except Exception as e:  # report which page and block, with the code
                failure = (f"{name}, python block {number} (line {line}) raised "
                           f"{type(e).__name__}:\n{e}\n\n--- block ---\n{code}\n"
                           f"--- traceback ---\n{traceback.format_exc()}")
            if failure is not None:  # failed outside the except: no chained traceback
                pytest.fail(failure, pytrace=False)
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved_ops)
        linecache.cache.pop(name, None)
