"""The explorer page in headless Chromium (Selenium): it loads offline with no console
error, blocks expand and collapse one at a time, search marks and steps, the details
panel shows what is pinned, folds unfold, diffs are marked, overlays recolour, names
run no script, and a screenshot is not blank. One browser for the module."""

from __future__ import annotations

import pathlib

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops

from _browser import console_errors, png_pixels, quit_browser, start_browser

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    session = start_browser()
    yield session
    quit_browser(session)


@pytest.fixture
def open_page(browser, tmp_path):
    """Writes a page and opens it from disk; returns the browser, ready."""
    def open_(page: str, name: str = "page.html"):
        path = tmp_path / name
        path.write_text(page, encoding="utf-8")
        browser.get(path.resolve().as_uri())
        WebDriverWait(browser, 30).until(
            lambda b: b.execute_script("return document.body.getAttribute('data-ready')") == "true")
        return browser
    return open_


def drawn(browser, selector: str = "#mg-world [data-node]") -> list[str]:
    return [e.get_attribute("data-node") for e in browser.find_elements(By.CSS_SELECTOR, selector)]


def node(browser, path: str):
    (element,) = [e for e in browser.find_elements(By.CSS_SELECTOR, "#mg-world [data-node]")
                  if e.get_attribute("data-node") == path]
    return element


def click(browser, path: str) -> None:
    node(browser, path).click()


def two_blocks() -> mg.Graph:
    x = mg.Input(("batch", 8, 8, 16), name="x")
    h = examples.residual_block(16, "a").as_block("block_a")(x)
    h = examples.residual_block(16, "b").as_block("block_b")(ops.relu(h))
    return mg.Graph(x, h, name="two_blocks")


def gpt(blocks: int) -> mg.Graph:
    block = examples.transformer_block(length=8, width=32, heads=2, mlp=64)
    x = mg.Input(("batch", 8, 32), name="x")
    h = x
    for i in range(blocks):
        h = block.as_block(f"block{i}")(h)
    return mg.Graph(x, ops.Linear(10, name="head")(h), name="gpt")


def test_page_loads_offline_with_every_top_level_node(open_page):
    g = examples.residual_cnn()
    browser = open_page(g.to_html())
    assert console_errors(browser) == []
    assert browser.title == "residual_cnn \u2014 mlaxgraph explorer"
    assert drawn(browser) == [n.name for n in g.nodes]
    ops_drawn = {e.get_attribute("data-node"): e.get_attribute("data-op")
                 for e in browser.find_elements(By.CSS_SELECTOR, "#mg-world [data-node]")}
    assert ops_drawn == {n.name: n.op.op_name for n in g.nodes}
    assert browser.find_element(By.CSS_SELECTOR, "[data-panel]").get_attribute("hidden") == "true"
    assert browser.find_element(By.CSS_SELECTOR, "input[type=search]")


def test_a_click_expands_and_collapses_that_block_only(open_page):
    browser = open_page(two_blocks().to_html())
    assert "block_a/conv_a" not in drawn(browser)
    click(browser, "block_a")
    nodes = drawn(browser)
    assert {"block_a/x", "block_a/conv_a", "block_a/bn_b"} <= set(nodes)
    assert not [n for n in nodes if n.startswith("block_b/")]
    assert node(browser, "block_a").get_attribute("data-expanded") == "true"
    browser.find_element(By.CSS_SELECTOR, '.mg-cluster[data-node="block_a"] .mg-cluster-head').click()
    assert not [n for n in drawn(browser) if "/" in n]
    # expand all, then collapse all
    button = browser.find_element(By.ID, "mg-expand-all")
    button.click()
    nodes = set(drawn(browser))
    assert {"block_a/conv_b", "block_b/conv_b"} <= nodes
    assert nodes == {p for p, _ in two_blocks().walk()}
    button.click()
    assert drawn(browser) == [n.name for n in two_blocks().nodes]
    assert console_errors(browser) == []


def test_search_marks_matches_and_steps_into_blocks(open_page):
    browser = open_page(two_blocks().to_html())
    box = browser.find_element(By.CSS_SELECTOR, "input[type=search]")
    box.send_keys("relu")
    marked = drawn(browser, '#mg-world [data-match="true"]')
    assert marked == ["relu"]  # the blocks' relus are inside, not drawn yet
    assert set(drawn(browser, '[data-contains-match="true"]')) == {"block_a", "block_b"}
    # relu, block_a/relu, block_a/relu_1, block_b/relu, block_b/relu_1
    assert browser.find_element(By.ID, "mg-count").text == "0 / 5"
    box.send_keys(Keys.ENTER)  # the first match in graph order: inside block_a
    assert browser.find_element(By.ID, "mg-count").text == "1 / 5"
    assert drawn(browser, '[data-current="true"]') == ["block_a/relu"]
    assert set(drawn(browser, '#mg-world [data-match="true"]')) == {"relu", "block_a/relu",
                                                                    "block_a/relu_1"}
    panel = browser.find_element(By.CSS_SELECTOR, "[data-panel]")
    assert panel.get_attribute("data-panel") == "block_a/relu" and panel.is_displayed()
    for _ in range(3):
        box.send_keys(Keys.ENTER)
    assert drawn(browser, '[data-current="true"]') == ["block_b/relu"]
    box.send_keys(Keys.SHIFT, Keys.ENTER)  # back
    assert drawn(browser, '[data-current="true"]') == ["relu"]
    box.clear()
    box.send_keys("conv")  # an op name matches too
    assert browser.find_element(By.ID, "mg-count").text == "0 / 4"


def test_the_panel_shows_the_pinned_details(open_page):
    model = mg.compile(examples.residual_cnn(), mg.Policy(compute_dtype="bfloat16",
                                                          output_dtype="float32"))
    table = model.cost_table(batch=2, xla=False)
    browser = open_page(model.to_html(hlo=True, batch=2))
    assert console_errors(browser) == []
    click(browser, "stem")
    panel = browser.find_element(By.CSS_SELECTOR, "[data-panel]")
    assert panel.is_displayed() and panel.get_attribute("data-panel") == "stem"
    text = panel.text
    row = table["stem"]
    for expected in ("conv", "features", "16", "kernel_size", "(3, 3)",   # op and attributes
                     "bf16[batch,8,8,16]",                                # output
                     "kernel", "f32[16,3,3,1]", "bias", "f32[16]",        # weights
                     "axes mlp,-,-,embed",                                # logical sharding
                     f"{str(row.flops_formula).replace(' ', '')} = {row.flops:,} at batch=2",
                     f"{str(row.activation_bytes_formula).replace(' ', '')} bytes",
                     "image_bf16: casts the input to bf16", "stem_f32: casts the output to f32",
                     f"{__file__}:", "OPTIMIZED HLO", "convolution"):
        assert expected in text, expected
    click(browser, "image_bf16")
    assert "inserted by the dtype policy" in panel.text
    browser.find_element(By.ID, "mg-close").click()
    assert not panel.is_displayed()


def test_the_panel_and_the_bar_break_no_word(open_page):
    """Labels stay whole ("params", not "param s"), values break only where they must,
    and the search box shows its whole placeholder."""
    model = mg.compile(examples.residual_cnn(), mg.Policy(compute_dtype="bfloat16"))
    browser = open_page(model.to_html(hlo=True, batch=2))
    click(browser, "stem")
    cells = browser.execute_script("""
      return [...document.querySelectorAll('[data-panel] tr')].map(tr => {
        const td = tr.querySelector('td'), range = document.createRange();
        range.selectNodeContents(td);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        return [td.textContent, lines.size, getComputedStyle(tr.lastElementChild).overflowWrap,
                getComputedStyle(tr.lastElementChild).wordBreak];
      });""")
    labels = {c[0] for c in cells}
    assert {"params", "FLOPs", "activations"} <= labels, cells
    for label, lines, wrap, word_break in cells:
        assert lines == (1 if label else 0), (label, lines)  # one line: no word broken
        assert wrap == "anywhere" and word_break != "break-all", (label, wrap, word_break)
    rows = browser.execute_script(
        "return [...document.querySelectorAll('[data-panel] .mg-row, [data-panel] .mg-path')]"
        ".map(e => getComputedStyle(e).wordBreak)")
    assert rows and "break-all" not in rows
    fits = browser.execute_script("""
      const input = document.getElementById('mg-search'), style = getComputedStyle(input);
      const context = document.createElement('canvas').getContext('2d');
      context.font = style.font;
      const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      return [context.measureText(input.placeholder).width, room];""")
    assert fits[0] <= fits[1], fits


def test_equal_blocks_fold_and_unfold(open_page):
    browser = open_page(gpt(5).to_html())
    fold = browser.find_element(By.CSS_SELECTOR, "[data-fold]")
    assert fold.get_attribute("data-fold") == "5" and fold.get_attribute("data-op") == "block"
    assert "block0 \u2026 block4: transformer_block \u00d7 5" in fold.text
    assert drawn(browser) == ["x", "block0\u2026block4", "head"]
    fold.click()
    assert drawn(browser, ".mg-node[data-node]") == ["x", *[f"block{i}" for i in range(5)], "head"]
    click(browser, "block2")
    assert "block2/attention" in drawn(browser) and "block1/attention" not in drawn(browser)
    assert console_errors(browser) == []


_EDGE_ENDS = """
const boxes = [...document.querySelectorAll('#mg-nodes .mg-node')].map(g => {
  const m = /translate\\(([-\\d.e]+),([-\\d.e]+)\\)/.exec(g.getAttribute('transform'));
  const b = g.getBBox();
  return {id: g.getAttribute('data-node'), x: +m[1], y: +m[2], w: b.x + b.width};
});
return [...document.querySelectorAll('#mg-edges .mg-edge')].map(p => {
  const xy = p.getAttribute('d').split(/[ ,CLM]/).filter(Boolean).slice(-2).map(Number);
  const hit = boxes.filter(b => Math.abs(b.y - xy[1]) < 0.5 && xy[0] >= b.x && xy[0] <= b.x + b.w);
  return hit.length ? hit[0].id : null;
});
"""


def test_a_fold_of_blocks_with_further_inputs_routes_them_to_each_block(open_page):
    # A decoder's blocks also read positions, the cache index and mask: the fold reads
    # them once, and unfolded every block reads them (no edge ends off a node).
    g = mg.models.gpt2({"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32})
    dec = mg.decoder(g, max_length=32)
    browser = open_page(dec.model(1).to_html())
    ends = browser.execute_script(_EDGE_ENDS)
    assert None not in ends and ends.count("h.0\u2026h.3") == 4, ends
    browser.find_element(By.CSS_SELECTOR, "[data-fold]").click()
    browser.find_element(By.XPATH, "//button[text()='fit']").click()
    ends = browser.execute_script(_EDGE_ENDS)
    assert None not in ends, ends
    assert len(dec.decode_graph(1).node("h.1").inputs) == 4
    for name in ("h.0", "h.1", "h.2", "h.3"):
        assert ends.count(name) == 4, (name, ends)
    assert console_errors(browser) == []


def test_diff_marks_the_policy_casts_as_added(open_page):
    g = examples.residual_cnn()
    a, b = mg.compile(g), mg.compile(g, mg.Policy(compute_dtype="bfloat16"))
    browser = open_page(mg.diff_html(a, b))
    casts = [n.name for n in b.graph.nodes if n.op.op_name == "cast"]
    assert drawn(browser, '.mg-node[data-diff="added"]') == casts
    assert "stem" in drawn(browser, '.mg-node[data-diff="changed"]')
    edges = browser.find_elements(By.CSS_SELECTOR, '.mg-edge[data-diff]')
    assert {e.get_attribute("data-diff") for e in edges} == {"added", "removed"}
    assert drawn(browser, '.mg-node[data-diff="removed"]') == []
    assert drawn(browser, '[data-diff-inside="true"]') == ["res1"]
    legend = browser.find_element(By.ID, "mg-legend").text
    assert "added in residual_cnn (bfloat16 policy)" in legend
    # the diff's outlines in colours none of the dtypes' swatches has
    swatches = browser.execute_script(
        "return [...document.querySelectorAll('#mg-legend .mg-swatch')].map(s => "
        "[s.getAttribute('data-diff'), getComputedStyle(s).borderTopColor])")
    dtypes = {colour for diff, colour in swatches if diff is None}
    diffs = {diff: colour for diff, colour in swatches if diff is not None}
    assert set(diffs) == {"added", "removed", "changed"} and not set(diffs.values()) & dtypes, swatches
    assert console_errors(browser) == []


def test_overlays_recolour_with_a_legend(open_page):
    g = examples.residual_cnn()
    browser = open_page(g.to_html(overlay={"stem": 1.0, "logits": 100.0}, batch=8))
    legend = browser.find_element(By.ID, "mg-legend")
    assert "colour: values" in legend.text and "1 \u2026 100 (log scale)" in legend.text

    def fill(path):
        return node(browser, path).find_element(By.CSS_SELECTOR, ".mg-shape").get_attribute("fill")

    assert fill("stem") != fill("logits")
    Select(browser.find_element(By.ID, "mg-overlay")).select_by_value("params")
    assert "colour: params" in legend.text
    flops_free = fill("relu")  # no params: the no-value colour
    assert flops_free == "#f8f9fa" and fill("logits") != flops_free
    Select(browser.find_element(By.ID, "mg-overlay")).select_by_value("dtype")
    assert "float32" in legend.text and fill("stem") == "#d0e4f5"
    assert console_errors(browser) == []


def test_hostile_names_run_no_script(open_page):
    # layer names cannot hold '/'; the graph's own name closes the script tag
    names = ["<!--<script>window.pwned=1<\u2044script>", '<img src=x onerror="window.pwned=2">',
             "\"'><svg onload=window.pwned=3>", "y" * 3000]
    x = mg.Input(("batch", 4), name=names[0])
    h = x
    for name in names[1:]:
        h = ops.Linear(4, name=name)(h)
    g = mg.Graph(x, h, name="<script>window.pwned=4</script>")
    for page in (g.to_html(), mg.diff_html(g, mg.compile(g, mg.Policy(compute_dtype="bfloat16")))):
        browser = open_page(page)
        assert browser.execute_script("return typeof window.pwned") == "undefined"
        assert browser.find_elements(By.CSS_SELECTOR, "#mg-world img, #mg-world script") == []
        assert set(names) <= set(drawn(browser))
        click(browser, names[1])
        assert names[1] in browser.find_element(By.CSS_SELECTOR, "[data-panel]").text
        assert browser.execute_script("return typeof window.pwned") == "undefined"
        assert console_errors(browser) == []


def test_screenshot_is_not_blank(open_page, tmp_path):
    browser = open_page(mg.compile(examples.residual_cnn(),
                                   mg.Policy(compute_dtype="bfloat16")).to_html())
    browser.set_window_size(640, 520)
    try:
        browser.find_element(By.ID, "mg-fit").click()
        png = browser.get_screenshot_as_png()
    finally:
        browser.set_window_size(1280, 860)
    (tmp_path / "explorer.png").write_bytes(png)
    width, height, rows = png_pixels(png)
    assert width > 300 and height > 300
    step = len(rows[0]) // width
    pixels = [row[i:i + 3] for row in rows[::2] for i in range(0, len(row), step * 2)]
    colours = set(pixels)
    assert len(colours) > 20  # text, dtype fills, edges
    mean = sum(sum(p) for p in pixels) / (3 * len(pixels))
    variance = sum((sum(p) / 3 - mean) ** 2 for p in pixels) / len(pixels)
    assert variance > 100
    orange = sum(1 for p in pixels if p[0] > 240 and 200 < p[1] < 225 and 150 < p[2] < 180)
    assert orange > 200  # bfloat16 nodes' fill (#ffd8a8) is on screen


def test_a_large_graph_draws_only_what_is_in_view(open_page):
    x = mg.Input(("batch", 4), name="x")
    h = x
    for i in range(1500):
        h = ops.relu(h) if i % 2 else ops.Linear(4, name=f"fc{i}")(h)
    browser = open_page(mg.Graph(x, h, name="deep").to_html())
    nodes = drawn(browser)
    assert nodes[:3] == ["x", "fc0", "relu"] and 5 < len(nodes) < 200
    box = browser.find_element(By.CSS_SELECTOR, "input[type=search]")
    box.send_keys("fc1498", Keys.ENTER)  # stepping to a match far below draws it
    assert drawn(browser, '[data-current="true"]') == ["fc1498"]
    assert "fc0" not in drawn(browser)
    assert console_errors(browser) == []
