"""Rendering: DOT text (no dependency), Graphviz output (svg, png, pdf), the notebook
display, and names that try to break the labels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.render import dot as dot_module
from mlaxgraph.render import dot_style
from mlaxgraph.render import graphviz as gv
from mlaxgraph.render.dot import DTYPE_COLORS, graph_to_dot

SVG = "{http://www.w3.org/2000/svg}"
DOT_FOUND = gv.shutil.which("dot") is not None
# The rendering tests need Graphviz; a machine without it fails them (with the install
# hint) rather than skipping them. `make test` installs it.
needs_dot = pytest.mark.usefixtures("dot_installed")


@pytest.fixture
def dot_installed():
    assert DOT_FOUND, gv.INSTALL_HINT


def bf16_graph():
    policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    return mg.compile(examples.residual_cnn(), policy).graph


def svg_of(graph, **options) -> ET.Element:
    """The rendered SVG, parsed (so it is well-formed XML), with no warning from dot."""
    text = graph_to_dot(graph, **options)
    done = subprocess.run([gv.find_dot(), "-Tsvg"], input=text.encode(), capture_output=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()
    return ET.fromstring(done.stdout)


def svg_texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(SVG + "text")]


def svg_nodes(root: ET.Element) -> dict[str, ET.Element]:
    """The <g class="node"> groups by the first text line (the layer's name)."""
    nodes = {}
    for g in root.iter(SVG + "g"):
        if g.get("class") == "node":
            texts = [t.text for t in g.iter(SVG + "text")]
            if texts:
                nodes[texts[0]] = g
    return nodes


def fills(group: ET.Element) -> set[str]:
    return {e.get("fill") for e in group.iter() if e.tag in (SVG + "polygon", SVG + "path")
            and e.get("fill") not in (None, "none", "transparent")}


def dot_node_line(text: str, name: str, indent: str = "") -> str:
    """The DOT statement of the node whose label starts with ``name`` in bold (at
    exactly ``indent`` when given: "  " is the top level)."""
    lines = [line for line in text.splitlines() if f"<B>{name}</B>" in line and " -> " not in line
             and (not indent or re.match(indent + r"n\d", line))]
    assert len(lines) == 1, (name, lines)
    return lines[0]


def dot_id(text: str, name: str, indent: str = "") -> str:
    return dot_node_line(text, name, indent).split()[0]


def labels_only(text: str) -> str:
    """DOT text without its tooltips (which hold each node's full printed line)."""
    return re.sub(r'tooltip="(\\\\|\\"|[^"\\])*"', "", text)


# --- DOT text -------------------------------------------------------------------------


def test_dot_is_byte_identical_across_builds():
    for make in (examples.residual_cnn, examples.lstm_classifier, bf16_graph):
        for options in ({}, {"expand_nested": True, "show_attrs": True, "show_legend": True}):
            assert graph_to_dot(make(), **options) == graph_to_dot(make(), **options)


def test_dot_is_byte_identical_across_processes():
    code = ("import sys, mlaxgraph as mg; from mlaxgraph import examples; "
            "g = mg.compile(examples.residual_cnn(), mg.Policy(compute_dtype='bfloat16')).graph; "
            "sys.stdout.buffer.write(g.to_dot(expand_nested=True, show_attrs=True).encode())")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=120)
    assert other.returncode == 0, other.stderr.decode()
    mine = mg.compile(examples.residual_cnn(), mg.Policy(compute_dtype="bfloat16")).graph
    assert other.stdout == mine.to_dot(expand_nested=True, show_attrs=True).encode()


def test_graph_to_dot_is_graph_to_dot():
    g = examples.mlp()
    assert g.to_dot(rankdir="LR") == graph_to_dot(g, rankdir="LR")
    assert g.to_dot().startswith("digraph mlp {\n") and g.to_dot().endswith("}\n")


def test_options_are_checked():
    g = examples.mlp()
    with pytest.raises(TypeError, match="show_shape.*show_shapes"):
        g.to_dot(show_shape=False)
    with pytest.raises(mg.GraphError, match="rankdir"):
        g.to_dot(rankdir="diagonal")
    assert "rankdir=LR" in g.to_dot(rankdir="lr")
    with pytest.raises(mg.GraphError, match="show_dtype is True or False, got 'no'"):
        g.to_dot(show_dtype="no")  # a truthy string: it showed them


def test_render_checks_dpi_and_a_format_its_suffix_contradicts(tmp_path):
    g = examples.mlp()
    with pytest.raises(mg.GraphError, match="dpi is a number from 1 to 2400"):
        g.render(tmp_path / "g.png", dpi=-3)  # dot hung until the timeout
    with pytest.raises(mg.GraphError, match="format='png' .*suffix says svg"):
        g.render(tmp_path / "g.svg", format="png")  # PNG bytes in a .svg file
    assert not list(tmp_path.iterdir())
    g.render(tmp_path / "g.gv", format="dot")  # the same format


def test_show_options_hide_and_show_parts():
    g = examples.residual_cnn()
    full = g.to_dot()
    assert "f32[batch,8,8,16]" in full and "params: 160" in full
    no_dtype = labels_only(g.to_dot(show_dtype=False))
    assert "[batch,8,8,16]" in no_dtype and "f32" not in no_dtype
    no_shapes = labels_only(g.to_dot(show_shapes=False))
    assert "[batch" not in no_shapes and "<BR/>f32<BR/>" in no_shapes
    assert "params:" not in g.to_dot(show_params=False)
    assert "padding=&#39;SAME&#39;" in g.to_dot(show_attrs=True)


def test_show_attrs_breaks_lines_between_names_and_keeps_every_attribute():
    from mlaxgraph.ir.printer import format_attr, non_default_attrs
    from mlaxgraph.render.dot_style import _attrs_text

    op = ops.MultiHeadAttention(2, kernel_init=ops.initializers.normal(0.02),
                                out_init=ops.initializers.normal(0.01), causal=True,
                                adapters=("query", "key", "value", "out"))
    lines = _attrs_text(op)
    assert all(len(line) <= 40 for line in lines), lines
    # each line ends after a comma, a bracket or the dot before a name: never inside one
    assert all(line[-1] in ",([" or re.search(r"[A-Za-z_]\.$", line) for line in lines[:-1]), lines
    text = lines[0]
    for line in lines[1:]:  # a long attribute's next lines are indented
        text += line[2:] if line.startswith("  ") and not text.endswith(",") else \
            (" " + line.strip() if text.endswith(",") else line.strip())
    assert text == ", ".join(f"{k}={format_attr(v)}" for k, v in non_default_attrs(op).items())
    assert "adapters=('query', 'key', 'value', 'out')" in text


def test_multi_output_edges_leave_from_their_output_port():
    g = examples.lstm_classifier()  # logits reads the LSTM's final h: output 1 of 3
    text = g.to_dot()
    lstm, logits = dot_id(text, "lstm"), dot_id(text, "logits")
    for j in range(3):
        assert f'PORT="o{j}"' in dot_node_line(text, "lstm")
    assert f"{lstm}:o1:s -> {logits} " in text
    assert f"{lstm}:o1:e -> {logits} " in g.to_dot(rankdir="LR")

    x = mg.Input(("batch", 6), name="x")
    a, b, c = ops.split(x, 3)
    g = mg.Graph(x, [ops.sub(c, a), b], name="split3")
    text = g.to_dot()
    split, sub = dot_id(text, "split"), dot_id(text, "sub")
    assert f"{split}:o2:s -> {sub}:i0:n " in text
    assert f"{split}:o0:s -> {sub}:i1:n " in text
    assert re.search(rf"{split}:o1:s -> n\d+ ", text)  # to the graph's output 1


def test_multi_input_edges_arrive_at_their_slot():
    g = examples.transformer_block()  # add(x, attention(...)): x is slot 0
    text = g.to_dot()
    x, attention, add = dot_id(text, "x"), dot_id(text, "attention"), dot_id(text, "add")
    assert f"{x} -> {add}:i0:n " in text
    assert f"{attention} -> {add}:i1:n " in text
    ln = dot_id(text, "ln_attention")  # self-attention: one tensor in slots 0 and 1
    assert f"{ln} -> {attention}:i0:n " in text and f"{ln} -> {attention}:i1:n " in text


def test_expand_nested_draws_the_block_as_a_cluster_of_its_layers():
    g = examples.residual_cnn()
    collapsed = g.to_dot()
    assert "cluster" not in collapsed and "conv_a" not in collapsed
    assert "block (7 layers)" in dot_node_line(collapsed, "res1")

    text = g.to_dot(expand_nested=True)
    start = text.index("subgraph cluster_")
    depth, end = 0, start
    for end in range(text.index("{", start), len(text)):  # the cluster's braces
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
    cluster = text[start:end]
    assert "<B>res1</B>" in cluster
    inner = examples.residual_block(16, "res1")
    for node in inner.nodes:
        assert f"<B>{node.name}</B>" in cluster
    # wired through the block's input and output: relu -> res1's x, res1's output -> max_pool
    relu, inner_x = dot_id(text, "relu", indent="  "), dot_id(cluster, "x")
    assert f"  {relu} -> {inner_x} " in text
    inner_out = re.search(r"(n\d+) \[shape=oval[^\n]*label=<output>", cluster).group(1)
    assert f"  {inner_out} -> {dot_id(text, 'max_pool')} " in text
    # edges are all outside the cluster, so no node is pulled into it
    assert " -> " not in cluster


@needs_dot
def test_expanded_svg_has_a_cluster_holding_the_inner_layers():
    root = svg_of(examples.residual_cnn(), expand_nested=True)
    clusters = [g for g in root.iter(SVG + "g") if g.get("class") == "cluster"]
    assert len(clusters) == 1
    texts = svg_texts(root)
    for path, node in examples.residual_cnn().walk():
        assert node.name in texts, path


def test_nested_blocks_expand_recursively_and_shared_blocks_are_marked():
    x = mg.Input(("batch", 4), name="x")
    inner = mg.Graph(x, ops.relu(ops.Linear(4, name="fc")(x)), name="inner")
    y = mg.Input(("batch", 4), name="y")
    middle = mg.Graph(y, inner(inner(y)), name="middle")  # inner twice: shared weights
    z = mg.Input(("batch", 4), name="z")
    g = mg.Graph(z, middle(z), name="outer")
    text = g.to_dot(expand_nested=True)
    assert text.count("subgraph cluster_") == 3
    lines = text.splitlines()
    shared = [i for i, line in enumerate(lines) if "shares weights with inner" in line]
    assert len(shared) == 1 and "<B>inner@1</B>" in lines[shared[0]]
    assert 'style="rounded,filled,dashed"' in lines[shared[0] + 1]


# --- precision, casts, sharing ----------------------------------------------------------


def test_casts_are_hexagons_and_dtypes_colour_the_nodes():
    g = bf16_graph()
    text = g.to_dot()
    cast = dot_node_line(text, "image_bf16")
    assert "shape=hexagon" in cast and "dashed" in cast and "inserted by policy" in cast
    assert f'fillcolor="{DTYPE_COLORS["bfloat16"][0]}"' in cast
    assert "cast f32 \u2192 bf16" in cast
    assert f'BGCOLOR="{DTYPE_COLORS["bfloat16"][0]}"' in dot_node_line(text, "stem")
    assert f'BGCOLOR="{DTYPE_COLORS["float32"][0]}"' in dot_node_line(text, "stem_bn")
    for line in text.splitlines():  # only casts are hexagons
        if "shape=hexagon" in line:
            assert "cast " in line


@needs_dot
def test_bf16_svg_shows_cast_nodes_distinctly():
    g = bf16_graph()
    root = svg_of(g, expand_nested=True, show_legend=True)
    nodes = svg_nodes(root)
    bf16, f32 = DTYPE_COLORS["bfloat16"][0], DTYPE_COLORS["float32"][0]
    casts = [path for path, node in g.walk() if node.op.op_name == "cast"]
    assert len(casts) == 8
    for name in ("image_bf16", "stem_f32", "conv_a_f32", "bn_b_bf16", "logits_f32"):
        group = nodes[name]
        (polygon,) = [p for p in group.iter(SVG + "polygon")]
        assert len(polygon.get("points").split()) == 7  # a hexagon (closed)
        assert polygon.get("stroke-dasharray")  # inserted: dashed
        assert polygon.get("fill") == (bf16 if name.endswith("bf16") else f32)
    assert bf16 in fills(nodes["conv_a"]) and f32 in fills(nodes["bn_a"])
    assert "inserted by policy" in svg_texts(root)


def test_user_casts_are_solid_and_int_dtypes_have_their_colour():
    tokens = mg.Input(("batch", 5), "int32", name="tokens")
    h = ops.cast(ops.Embedding(10, 4, name="embed")(tokens), "float16")
    g = mg.Graph(tokens, h, name="user_cast")
    text = g.to_dot()
    cast = dot_node_line(text, "cast")
    assert "shape=hexagon" in cast and "filled,bold" in cast and "inserted" not in cast
    assert f'fillcolor="{DTYPE_COLORS["float16"][0]}"' in cast
    assert f'fillcolor="{DTYPE_COLORS["int"][0]}"' in dot_node_line(text, "tokens")


def test_shared_layers_are_dashed_and_name_their_owner():
    x = mg.Input(("batch", 4), name="x")
    fc = ops.Linear(4, name="fc")
    g = mg.Graph(x, fc(ops.relu(fc(x))), name="twice")
    text = g.to_dot()
    shared = dot_node_line(text, "fc@1")
    assert 'STYLE="rounded,dashed"' in shared and "shares weights with fc" in shared
    assert "params:" not in shared
    assert "dashed" not in dot_node_line(text, "fc") and "params: 20" in dot_node_line(text, "fc")


def test_legend_lists_what_is_drawn():
    legend = bf16_graph().to_dot(show_legend=True)
    legend = legend[legend.index("subgraph cluster_legend"):]
    assert "<B>legend</B>" in legend
    for mark in ("float32", "bfloat16", "cast inserted", "block"):
        assert mark in legend
    assert "float16<" not in legend and "shares weights" not in legend


# --- hostile names ----------------------------------------------------------------------

# Layer names cannot hold '/' (it joins the names of a path): the closing tags are
# written with U+2044, which escaping must carry through as it is.
# Names cannot hold control characters (ASCII's: files cannot store them); Unicode's
# line and paragraph separators and C1 controls are the nearest, shown as escapes.
HOSTILE = ['q"uote', "<b>&amp;<\u2044b>", "{br|aces}", "new\u2029line", "back\\slash\\", "\u6f22\u5b57 \u00e9 \u2713 \U0001f642",
           "tab\u0085ctl\u009f", "\\N\\G\\E\\n\\l", "]]><!-- -->", "x\u2028y", "'single'", "end\\"]


def hostile_graph() -> mg.Graph:
    x = mg.Input(("batch", 8), name=HOSTILE[0])
    shared = ops.Linear(8, name=HOSTILE[1])
    a, b = ops.split(shared(x), 2)
    inner_x = mg.Input(("batch", 4), name=HOSTILE[2])
    inner = mg.Graph(inner_x, ops.relu(ops.Linear(4, name=HOSTILE[3])(inner_x)), name=HOSTILE[4])
    a = inner.as_block(HOSTILE[5])(a)
    h = ops.Cast("bfloat16", name=HOSTILE[6])(ops.concat([a, b]))
    h = shared(ops.cast(h, "float32"))
    for name in HOSTILE[7:]:
        h = ops.Linear(8, name=name)(h)
    return mg.Graph(x, [h, b], name='g"<&>\u2029\\{}\\')


@needs_dot
@pytest.mark.parametrize("options", [{}, {"expand_nested": True, "show_attrs": True, "show_legend": True},
                                     {"rankdir": "LR", "expand_nested": True}])
def test_hostile_names_are_escaped(options):
    g = hostile_graph()
    root = svg_of(g, **options)  # parses: well-formed XML, and dot printed no warning
    texts = svg_texts(root)
    joined = "\n".join(texts)
    names = [path.rsplit("/", 1)[-1] for path, _ in g.walk()] if options.get("expand_nested") \
        else [n.name for n in g.nodes]
    for name in names + [g.name]:
        shown = dot_style._visible(name)  # control characters shown as escapes
        assert shown in joined, (name, shown)
    assert "tab\\x85ctl\\x9f" in texts and "x\\u2028y" in texts
    assert HOSTILE[7] in texts  # \\N and \\G stay themselves, not the node's id
    if options.get("expand_nested"):
        assert "new\\u2029line" in texts
    # ids are generated: no name reaches an SVG <title>
    for title in root.iter(SVG + "title"):
        assert re.fullmatch(r"[A-Za-z0-9_:\-&#;>]+", title.text), title.text
    # tooltips (xlink:title) carry each node's printed line, names as they are
    tooltips = [a.get("{http://www.w3.org/1999/xlink}title") for a in root.iter(SVG + "a")]
    assert any(t and t.startswith("%" + dot_style._visible(HOSTILE[7])) for t in tooltips)
    assert any(t and t.startswith('%q"uote:') for t in tooltips)


def test_hostile_names_never_reach_dot_unescaped():
    text = hostile_graph().to_dot(expand_nested=True, show_attrs=True, show_legend=True)
    for name in HOSTILE:
        if any(c in name for c in "\"\u2029\u0085"):  # < > & are fine in quoted strings
            assert name not in text, name
    # backslashes come in pairs, but for the one escaping a quote in a quoted string
    for run, quote in re.findall(r'(\\+)("?)', text):
        assert len(run) % 2 == 0 or quote
    assert 'tooltip="g\\"<&>\\\\\\\\u2029\\\\\\\\{}\\\\\\\\"]' in text  # ends with a backslash
    assert "\u0085" not in text and "\u2029" not in text and "\u2028" not in text
    assert all(line.startswith(("digraph ", "  ", "}")) for line in text.splitlines())


# --- Graphviz output --------------------------------------------------------------------


@needs_dot
def test_rendered_svg_has_every_layer_name_and_shape(tmp_path):
    g = examples.residual_cnn()
    path = g.render(tmp_path / "cnn.svg")
    assert path == tmp_path / "cnn.svg"
    root = ET.parse(path).getroot()
    texts = svg_texts(root)
    for node in g.nodes:
        assert node.name in texts
        for spec in node.outputs:
            assert str(spec) in texts
    assert "params: 4,736 (64 non-trainable)" in texts


@needs_dot
def test_png_and_pdf_render(tmp_path):
    g = examples.transformer_block()
    png = g.render(str(tmp_path / "block.png"), dpi=50)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    pdf = g.render(tmp_path / "block.pdf", expand_nested=True)
    assert pdf.read_bytes().startswith(b"%PDF-")
    other = g.render(tmp_path / "no_suffix", format="PNG")
    assert other.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["block.pdf", "block.png", "no_suffix"]


def test_render_checks_the_format(tmp_path):
    g = examples.mlp()
    with pytest.raises(ValueError, match="format"):
        g.render(tmp_path / "mlp")
    with pytest.raises(ValueError, match="unknown format 'docx'"):
        g.render(tmp_path / "mlp.docx")
    with pytest.raises(TypeError, match="unknown option"):
        g.render(tmp_path / "mlp.svg", colour=True)
    assert g.render(tmp_path / "mlp.gv").read_text(encoding="utf-8") == g.to_dot()


@pytest.fixture
def no_dot(monkeypatch, tmp_path):
    """A PATH with no `dot` on it."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert gv.shutil.which("dot") is None


def test_missing_dot_gives_the_install_hint(no_dot, tmp_path):
    g = examples.mlp()
    message = ("Graphviz's `dot` was not found: install it with `apt-get install graphviz` "
               "(Debian/Ubuntu), `brew install graphviz` (macOS) or `conda install graphviz`")
    with pytest.raises(FileNotFoundError) as info:
        g.render(tmp_path / "mlp.svg")
    assert str(info.value) == message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, mg.MlaxGraphError)
    assert not (tmp_path / "mlp.svg").exists()
    assert g.render(tmp_path / "mlp.dot").exists()  # DOT text needs no Graphviz
    assert g.to_dot()
    assert g._repr_svg_() is None
    html = gv.repr_html(g)
    assert "<svg" not in html and "<pre>" in html and "logits" in html
    assert "<iframe srcdoc=" in g._repr_html_()  # the explorer needs no Graphviz


def test_dot_failure_and_timeout_are_clear_errors(monkeypatch, tmp_path):
    script = tmp_path / "dot"
    script.write_text("#!/bin/sh\necho 'Error: something broke' >&2\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(gv.GraphvizError, match="exit status 3.*something broke"):
        examples.mlp().render(tmp_path / "x.svg")
    with pytest.warns(RuntimeWarning, match="something broke"):
        assert examples.mlp()._repr_svg_() is None
    script.write_text("#!/bin/sh\nexec /bin/sleep 5\n")
    with pytest.raises(RuntimeError, match="did not finish in 0.2 s"):
        examples.mlp().render(tmp_path / "x.svg", timeout=0.2)
    assert not (tmp_path / "x.svg").exists()


# --- notebooks ----------------------------------------------------------------------------


@needs_dot
def test_repr_svg_and_html():
    g = hostile_graph()
    svg = g._repr_svg_()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    ET.fromstring(svg)
    html = gv.repr_html(g)
    assert html.count("<svg") == 1 and "<?xml" not in html and "<!DOCTYPE" not in html
    pre = html[html.index("<pre>") + 5: html.index("</pre>")]
    assert "<" not in pre and "&lt;b&gt;&amp;amp;&lt;\u2044b&gt;" in pre
    # the whole of it is well-formed (the SVG is XML; the summary is escaped)
    ET.fromstring(html.replace("\x01", "").replace("\x7f", ""))


# --- expanding some blocks; fonts -------------------------------------------------------


def two_block_graph():
    inner = examples.residual_block(16, "inner")
    x = mg.Input(("batch", 8, 8, 16), name="x")
    outer_x = mg.Input(("batch", 8, 8, 16), name="x")
    outer = mg.Graph(outer_x, inner.as_block("inner")(outer_x), name="outer")
    h = examples.residual_block(16, "block0").as_block("block0")(x)
    h = outer.as_block("block1")(h)
    return mg.Graph(x, h, name="two_blocks")


def cluster_titles(text: str) -> list[str]:
    return re.findall(r"label=<<B>([^<]*)</B>", "\n".join(
        line for line in text.splitlines() if line.strip().startswith("label=<<B>")))


def test_expand_nested_takes_the_names_of_the_blocks_to_expand():
    g = two_block_graph()
    assert cluster_titles(g.to_dot(expand_nested=True)) == ["block0", "block1", "inner"]
    assert cluster_titles(g.to_dot(expand_nested=["block0"])) == ["block0"]
    assert cluster_titles(g.to_dot(expand_nested="block1")) == ["block1"]
    # a nested block by its path (or its name), inside an expanded one
    assert cluster_titles(g.to_dot(expand_nested=["block1", "block1/inner"])) == ["block1", "inner"]
    assert cluster_titles(g.to_dot(expand_nested=["block1", "inner"])) == ["block1", "inner"]
    assert cluster_titles(g.to_dot(expand_nested=[])) == []
    text = g.to_dot(expand_nested=["block0"])
    assert len(re.findall(r"<B>block1</B>", text)) == 1 and "block outer (1 layers)" in text


def test_expand_nested_rejects_what_is_no_block():
    g = two_block_graph()
    with pytest.raises(mg.GraphError, match="'block7', which is no block of graph 'two_blocks'"):
        g.to_dot(expand_nested=["block7"])
    with pytest.raises(TypeError, match="expand_nested"):
        g.to_dot(expand_nested=[3])


def test_labels_name_fonts_the_system_has():
    text = examples.mlp().to_dot()
    assert text.count(f'fontname="{dot_module.FONTNAME}"') == 3 and "Helvetica\"" not in text
    families = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True,
                              timeout=60).stdout
    installed = {name.strip() for line in families.splitlines() for name in line.split(",")}
    first = dot_module.FONTNAME.split(",")[0]
    assert first in installed, f"{first} is not installed (fonts-dejavu-core)"


def test_a_typo_d_option_and_an_html_render_are_named_errors():
    g = mg.models.gpt2({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16})
    with pytest.raises(mg.GraphError, match=r"to_html got an unknown option 'expand_nestd'.*batch=, "
                       r"seq=.*'expand_nested' is an option of to_dot and render"):
        g.to_html(expand_nestd=True)
    with pytest.raises(mg.GraphError, match=r"unknown option 'fodl' \(did you mean 'fold'\?\)"):
        mg.compile(g).to_html(fodl=False)
    # the diff page and the Model Explorer files take dims the same way (a typo was a dim
    # nobody read)
    with pytest.raises(mg.GraphError, match=r"diff_html got an unknown option 'bacth' "
                                            r"\(did you mean 'batch'\?\)"):
        mg.diff_html(g, g, bacth=2)
    with pytest.raises(mg.GraphError, match=r"to_model_explorer got an unknown option 'sq' "
                                            r"\(did you mean 'seq'\?\)"):
        g.to_model_explorer("never_written.json", batch=1, sq=8)
    with pytest.raises(mg.GraphError, match=r"unknown format 'html'.*graph.to_html\(path\)"):
        g.render("x.html")
