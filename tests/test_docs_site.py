"""The documentation site builds, as `make docs` builds it: `mkdocs build --strict`, so a
broken link, a page left out of the nav or a docstring the API reference cannot read
(an Args entry naming a parameter that does not exist) fails this test. And the API
reference documents every public name of the package.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each public module and the reference page that documents its public names (__all__).
REFERENCE = {
    "mlaxgraph": "reference/mlaxgraph",
    "mlaxgraph.ops": "reference/ops",
    "mlaxgraph.compiler.passes": "reference/compiler",
    "mlaxgraph.io": "reference/io",
    "mlaxgraph.render.dot": "reference/render",
    "mlaxgraph.render.graphviz": "reference/render",
    "mlaxgraph.render.networkx": "reference/render",
    "mlaxgraph.train": "reference/train",
    "mlaxgraph.distributed": "reference/distributed",
    "mlaxgraph.examples": "reference/examples",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"`mkdocs build --strict` exited {result.returncode} (the docs tools come "
                    f"with `pip install -e .[docs]`):\n{result.stdout}\n{result.stderr}",
                    pytrace=False)
    return out


def test_every_docs_page_is_built(site):
    # The strict build already fails on a page left out of the nav.
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), f"docs/{page.name} was not built"


def _documented_ids(page: pathlib.Path) -> set[str]:
    """The ids of the page's API entries, modules left out (``::: mlaxgraph.compile``
    would document the module compile.py rather than the function, for instance)."""
    text = page.read_text("utf-8")
    headings = re.findall(r'<h[1-6] id="([^"]+)" class="doc doc-heading">(.*?)</h[1-6]>', text,
                          re.DOTALL)
    return {html.unescape(i) for i, body in headings if "doc-module-name" not in body}


@pytest.mark.parametrize("module_name", sorted(REFERENCE))
def test_reference_documents_the_public_names(site, module_name):
    module = importlib.import_module(module_name)
    page = site / REFERENCE[module_name] / "index.html"
    assert page.is_file(), f"{module_name} has no reference page docs/{REFERENCE[module_name]}.md"
    ids = _documented_ids(page)
    # An entry's id is its path as written in the page: mlaxgraph.Graph for a name
    # documented where users import it, mlaxgraph.io.save.save for one documented in
    # the module that defines it.
    # Submodules (mg.ops, mg.train) have pages of their own; __version__ has no entry.
    missing = [name for name in module.__all__
               if name != "__version__" and not inspect.ismodule(getattr(module, name))
               and f"{module_name}.{name}" not in ids
               and not any(i.endswith(f".{name}") for i in ids)]
    assert not missing, f"{REFERENCE[module_name]} does not document {module_name}.{missing}"


def test_docstring_examples_render_as_code(site):
    # The docstrings title their doctests "Example:", which griffe alone renders as
    # Markdown, turning each ">>>" line into nested quotes; docs/_ext/griffe_examples.py
    # makes them code blocks.
    for page in sorted((site / "reference").glob("*/index.html")):
        text = page.read_text("utf-8")
        assert "<blockquote>" not in text, f"{page.parent.name}: a doctest rendered as quotes"
    graph = (site / "reference" / "mlaxgraph" / "index.html").read_text("utf-8")
    assert "&gt;&gt;&gt;" in graph
