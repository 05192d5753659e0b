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
import urllib.parse
from html.parser import HTMLParser

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
    "mlaxgraph.render.html.page": "reference/render",
    "mlaxgraph.render.html.diff": "reference/render",
    "mlaxgraph.render.html.model_explorer": "reference/render",
    "mlaxgraph.render.html.payload": "reference/render",
    "mlaxgraph.train": "reference/train",
    "mlaxgraph.distributed": "reference/distributed",
    "mlaxgraph.examples": "reference/examples",
    "mlaxgraph.models": "reference/models",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory, notebook_cache) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    # the notebooks test_notebooks.py executed in this session are read, not run again
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MLAXGRAPH_NOTEBOOK_CACHE": str(notebook_cache)}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)  # a hang guard
    if result.returncode != 0:
        pytest.fail(f"`mkdocs build --strict` exited {result.returncode} (the docs tools come "
                    f"with `pip install -e .[docs]`):\n{result.stdout}\n{result.stderr}",
                    pytrace=False)
    return out


def test_every_docs_page_is_built(site):
    # The strict build already fails on a page left out of the nav.
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / f"{page.stem}.html"  # use_directory_urls: false, for file://
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
    page = site / f"{REFERENCE[module_name]}.html"
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
    for page in sorted((site / "reference").glob("*.html")):
        text = page.read_text("utf-8")
        assert "<blockquote>" not in text, f"{page.name}: a doctest rendered as quotes"
    graph = (site / "reference" / "mlaxgraph.html").read_text("utf-8")
    assert "&gt;&gt;&gt;" in graph


# --- the site opened from disk ---------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (name == "src" and tag in (
                    "script", "img", "iframe")) or (tag == "link" and name == "href")):
                self.urls.append(value)


def test_every_local_link_lands_on_a_file(site):
    # Opened from disk, a link to a folder shows a directory listing: every relative
    # link of every page must name a file of the site.
    checked = 0
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":
            continue  # for a web server to send: its links are absolute
        parser = _Links()
        parser.feed(page.read_text("utf-8"))
        for url in parser.urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # other sites (never fetched by the page), data: and #anchors
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve()
            assert target.is_file(), f"{page.relative_to(site)} links to {url}: no such file"
            checked += 1
    assert checked > 500
    # nothing the pages load comes from the network (links to other sites aside)
    for page in sorted(site.rglob("*.html")):
        text = page.read_text("utf-8")
        assert not re.search(r'<(script|img|iframe)[^>]*\ssrc="https?:', text), page.name
        assert not re.search(r'<link[^>]*rel="stylesheet"[^>]*href="https?:', text), page.name


def test_site_from_disk_navigates_and_searches_offline(site):
    from _browser import console_errors, quit_browser, start_browser
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = start_browser()
    try:
        browser.get((site / "index.html").as_uri())
        links = [a.get_attribute("href") for a in
                 browser.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link[href]")]
        pages = sorted({link.split("#")[0] for link in links})
        assert len(pages) >= 20 and (site / "explorer.html").as_uri() in pages
        for url in pages:
            browser.get(url)
            assert browser.find_element(By.CSS_SELECTOR, "article h1").text, url
            assert "Index of" not in browser.title, url
        assert console_errors(browser) == []
        browser.get((site / "explorer.html").as_uri())
        frame = browser.find_element(By.CSS_SELECTOR, 'iframe[src$="residual_cnn_bf16.html"]')
        browser.switch_to.frame(frame)
        WebDriverWait(browser, 30).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, '[data-node="stem"]'))
        browser.switch_to.default_content()
        svg = browser.find_element(By.CSS_SELECTOR, 'img[src$="residual_cnn.svg"]')
        assert browser.execute_script("return arguments[0].naturalWidth", svg) > 100
        # search, offline: the index inlined, the worker run in a frame
        box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
        browser.execute_script("arguments[0].focus()", box)  # loads the index
        browser.execute_script("document.getElementById('__search').checked = true")
        box.send_keys("expand_nested")
        WebDriverWait(browser, 30).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
        assert console_errors(browser) == []
    finally:
        quit_browser(browser)


def test_the_notebooks_are_pages_with_their_outputs(site):
    # Executed when the site is built: each notebook's page holds its code and what it
    # printed (numbers computed then, not copied from the .ipynb file).
    pages = sorted((site / "notebooks").glob("*.html"))
    assert [p.stem for p in pages] == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    deep = (site / "notebooks" / "07_deep_models.html").read_text()
    assert "largest difference:" in deep and "block0 … block7: transformer_block × 8" in deep
    assert "memory plan at batch=4" in deep
    digits = (site / "notebooks" / "04_train_on_digits.html").read_text()
    assert "accuracy" in digits
