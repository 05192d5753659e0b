"""The docs' examples run: every ```python block of each docs/*.md page and of README.md.

A page's blocks run top to bottom in one namespace, as a reader pastes them into one
session. Each block is compiled with the page's path as its file name and its real line
numbers, so a failure (and any mlaxgraph error message about a node) points at the
Markdown line.

What a page shows as output is what the code prints: a ```text block right after a
```python block (nothing but blank lines between them) is that block's output, and must
match what it prints, line by line (trailing spaces aside); a line ``...`` in it stands
for any number of lines. Output shown for another setup (more devices, another process)
has a sentence before it, which makes it an illustration rather than the block's output.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import pathlib
import re
import traceback

import pytest

from mlaxgraph.core import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# A fenced block: a fence opening with ```<language> (nothing else on the line) up to the
# next closing ```; group 1 is the language, group 2 the text.
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first code line, code) for each ```python block."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == "python"]


def shown_outputs(text: str) -> dict[int, str]:
    """For each ```python block directly followed by a ```text block (blank lines
    between them at most): the python block's first code line -> the text shown."""
    fences = list(FENCE.finditer(text))
    shown = {}
    for block, after in zip(fences, fences[1:]):
        if (block.group(1) == "python" and after.group(1) == "text"
                and not text[block.end():after.start()].strip()):
            shown[text.count("\n", 0, block.start(2)) + 1] = after.group(2)
    return shown


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def output_matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` shows; a line ``...`` matches any lines."""
    want, got = _lines(shown), _lines(printed)

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and want[i] == got[j] and match(i + 1, j + 1)

    return match(0, 0)


def test_shown_outputs_are_found_and_matched():
    text = ("```python\nprint(1)\n```\n\n```text\n1\n```\n"
            "```python\nprint(2)\n```\nOn 8 devices:\n```text\n8\n```\n")
    assert shown_outputs(text) == {2: "1\n"}
    assert output_matches("a\n...\nd\n", "a\nb\nc\nd  \n")
    assert output_matches("a\n...\n", "a\n")
    assert not output_matches("a\nb\n", "a\nc\n")
    assert not output_matches("a\n", "a\nb\n")


def test_python_blocks_are_found():
    text = "intro\n```python\nx = 1\n```\ntext\n```text\nnot code\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (10, "y = 2\n")]


def test_every_docs_page_exists():
    names = {p.name for p in PAGES}
    for page in ("index.md", "quickstart.md", "concepts.md", "policies.md", "inspect.md",
                 "errors.md", "writing_layers.md", "design.md"):
        assert page in names, f"docs/{page} is missing"


#: Pages that print the optimized HLO: its fusions are XLA's default CPU emitter's.
XLA_DEFAULT_PAGES = ("inspect.md",)


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.xla_default) if p.name in XLA_DEFAULT_PAGES else p
    for p in PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: pathlib.Path, tmp_path, monkeypatch):
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(ROOT))
    blocks = python_blocks(text)
    shown = shown_outputs(text)
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
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(padded, name, "exec"), namespace)
            except Exception as e:  # report which page and block, with the code
                failure = (f"{name}, python block {number} (line {line}) raised "
                           f"{type(e).__name__}:\n{e}\n\n--- block ---\n{code}\n"
                           f"--- traceback ---\n{traceback.format_exc()}")
            else:
                if line in shown and not output_matches(shown[line], printed.getvalue()):
                    failure = (f"{name}, python block {number} (line {line}): the output the "
                               f"page shows is not what the block prints\n--- shown ---\n"
                               f"{shown[line]}--- printed ---\n{printed.getvalue()}")
            if failure is not None:  # failed outside the except: no chained traceback
                pytest.fail(failure, pytrace=False)
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved_ops)
        linecache.cache.pop(name, None)
