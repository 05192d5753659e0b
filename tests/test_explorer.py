"""The explorer page without a browser: its embedded data (paths, ops, weights, FLOPs and
bytes checked against hand counts and the cost table), folding, overlays, diffs, the
escaping of hostile names, Model Explorer's JSON format, the entry points and the CLI."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import pathlib
import re

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.cli import main
from mlaxgraph.render.html.page import notebook_html
from mlaxgraph.render.html.payload import walk_payload

DATA = re.compile(r'<script type="application/json" id="mlaxgraph-data">(.*?)</script>', re.DOTALL)


def data_of(page: str) -> dict:
    found = DATA.findall(page)
    assert len(found) == 1
    return json.loads(found[0])


def nodes_of(page_or_payload) -> dict[str, dict]:
    payload = data_of(page_or_payload) if isinstance(page_or_payload, str) else page_or_payload
    return {n["id"]: n for n in walk_payload(payload["root"])}


def gpt(blocks: int = 4, width: int = 32) -> mg.Graph:
    block = examples.transformer_block(length=8, width=width, heads=2, mlp=2 * width)
    x = mg.Input(("batch", 8, width), name="x")
    h = x
    for i in range(blocks):
        h = block.as_block(f"block{i}")(h)
    return mg.Graph(x, ops.Linear(10, name="head")(h), name="gpt")


def bf16() -> mg.Policy:
    return mg.Policy(compute_dtype="bfloat16", output_dtype="float32")


# --- the page ---------------------------------------------------------------------------


def test_page_is_self_contained_and_allows_only_its_own_script():
    page = examples.residual_cnn().to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # nothing from the network: the only URL is the SVG namespace
    assert re.findall(r"https?://[^\s\"'<>)]*", page) == ["http://www.w3.org/2000/svg"] * 2
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=\"(?!data:)", page)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert f"script-src 'sha256-{digest}'" in policy and "default-src 'none'" in policy
    assert 'type="search"' in page and "data-panel" in page


def test_payload_has_every_layer_with_its_path_and_op():
    g = examples.residual_cnn()
    nodes = nodes_of(g.to_html())
    expected = {path: node.op.op_name for path, node in g.walk()}
    assert {path: n["op"] for path, n in nodes.items()} == expected
    assert nodes["res1"]["op"] == "block" and nodes["res1/conv_a"]["name"] == "conv_a"
    assert nodes["res1"]["sub"]["i"] == [[0, 0]]  # the block's input enters its node `x`
    assert nodes["stem"]["src"].startswith(f"{__file__}:")


def test_weights_flops_and_bytes_match_hand_counts():
    g = examples.mlp(784, (256,), 10)
    nodes = nodes_of(g.to_html(batch=8))
    dense = nodes["dense"]
    assert dense["weights"] == [["kernel", "[784,256]", "f32", "trainable", "embed,mlp"],
                                ["bias", "[256]", "f32", "trainable", "mlp"]]
    # a quantized layer's int8 values and their scales as the summary counts them
    quantized = nodes_of(mg.quantize(g, "int8_weight_only").to_html(batch=8))["dense"]["weights"]
    assert {w[0]: (w[2], w[3]) for w in quantized}["kernel"] == ("i8", "non-trainable")
    assert dense["params"] == 784 * 256 + 256
    # a multiply-add is 2 FLOPs, plus one add per output for the bias
    assert dense["flops"] == f"{2 * 784 * 256 + 256}*batch"
    assert dense["flops_v"] == 8 * (2 * 784 * 256 + 256)
    assert dense["act"] == f"{256 * 4}*batch" and dense["act_v"] == 8 * 256 * 4
    assert dense["outs"] == [["f32", "[batch,256]", "float32"]]
    assert data_of(g.to_html())["unbound"] == ["batch"]  # counted at batch=1 and said so


def test_flops_and_bytes_agree_with_the_cost_table_under_a_policy():
    model = mg.compile(examples.residual_cnn(), bf16())
    table = model.cost_table(batch=4, xla=False)
    nodes = nodes_of(model.to_html(batch=4))
    for row in table:
        node = nodes[row.layer]
        assert node["flops"] == str(row.flops_formula).replace(" ", ""), row.layer
        assert node["flops_v"] == row.flops and node["act_v"] == row.activation_bytes
    # a block's numbers are the sums of its layers'
    inner = [r for r in table if r.layer.startswith("res1/")]
    assert nodes["res1"]["flops_v"] == sum(r.flops for r in inner)
    assert nodes["res1"]["params"] == sum(r.params + r.state for r in inner)
    assert nodes["stem"]["casts"] == ["stem_f32: casts the output to f32",
                                      "image_bf16: casts the input to bf16"]
    assert nodes["image_bf16"]["inserted"] is True
    assert data_of(model.to_html())["policy"] == repr(model.policy)


def test_hlo_lists_each_layers_optimized_operations():
    model = mg.compile(examples.mlp(8, (4,), 2))
    nodes = nodes_of(model.to_html(hlo=True, batch=2))
    by_layer = model.hlo_by_layer(batch=2)
    assert nodes["dense"]["hlo"] == [str(op) for op in by_layer["dense"]]
    assert any(" dot " in line or "= fusion" in line for line in nodes["dense"]["hlo"])
    with pytest.raises(mg.ShapeError, match="batch"):
        model.to_html(hlo=True)
    with pytest.raises(mg.GraphError, match="compiled model"):
        examples.mlp().to_html(hlo=True)


# --- folding runs of equal blocks ----------------------------------------------------------


def test_runs_of_equal_blocks_are_folded_with_their_count():
    g = gpt(blocks=6)
    root = data_of(g.to_html())["root"]
    assert [n["id"] for n in root["n"]] == ["x", "block0\u2026block5", "head"]
    fold = root["n"][1]
    assert fold["fold"] == 6 and fold["title"] == "block0 \u2026 block5: transformer_block \u00d7 6"
    assert [n["id"] for n in fold["sub"]["n"]] == [f"block{i}" for i in range(6)]
    assert fold["sub"]["e"] == [[i, 0, i + 1, 0] for i in range(5)]
    assert root["e"] == [[0, 0, 1, 0], [1, 0, 2, 0]]
    assert fold["params"] == sum(n["params"] for n in fold["sub"]["n"]) == 6 * fold["sub"]["n"][0]["params"]
    assert [n["id"] for n in data_of(g.to_html(fold=False))["root"]["n"]][1:3] == ["block0", "block1"]


def test_only_chains_of_equal_blocks_fold():
    block = examples.transformer_block(length=8, width=32, heads=2, mlp=64)
    other = examples.transformer_block(length=8, width=32, heads=4, mlp=64)
    x = mg.Input(("batch", 8, 32), name="x")
    a = block.as_block("a0")(x)
    a = block.as_block("a1")(a)
    b = other.as_block("b0")(a)            # another graph: ends the run
    c0 = block.as_block("c0")(b)
    c1 = block.as_block("c1")(c0)          # c0 is also read by the add: no fold
    g = mg.Graph(x, ops.add(c0, c1), name="mixed")
    ids = [n["id"] for n in data_of(g.to_html())["root"]["n"]]
    assert ids == ["x", "a0\u2026a1", "b0", "c0", "c1", "add"]


# --- overlays ---------------------------------------------------------------------------------


def test_custom_overlay_values_and_block_sums():
    g = examples.residual_cnn()
    values = {"stem": 1.5e-3, "res1/conv_a": 2e-3, "res1/conv_b": 1e-3}
    payload = data_of(g.to_html(overlay=values))
    nodes = nodes_of(payload)
    assert payload["overlay"] == "custom" and payload["custom"] is True
    assert nodes["stem"]["val"] == 1.5e-3 and "val" not in nodes["logits"]
    assert nodes["res1"]["val"] == pytest.approx(3e-3)
    assert data_of(g.to_html(overlay="flops"))["overlay"] == "flops"


@pytest.mark.parametrize("overlay, message", [
    ("speed", "overlay must be one of dtype, flops, params, activation_bytes"),
    ({"nope": 1.0}, "'nope', which is no layer path"),
    ({"stem": "fast"}, r"overlay\['stem'\] must be a number"),
    ({"stem": float("nan")}, "must be finite"),
    (3, "got int"),
])
def test_bad_overlays_are_graph_errors(overlay, message):
    with pytest.raises(mg.GraphError, match=message):
        examples.residual_cnn().to_html(overlay=overlay)


def test_bad_inputs_are_graph_errors():
    with pytest.raises(mg.GraphError, match="got int"):
        mg.show(3, open_browser=False)
    with pytest.raises(mg.GraphError, match="dims are non-negative ints"):
        examples.mlp().to_html(batch="eight")
    with pytest.raises(mg.GraphError, match="explorer page"):
        mg.show("not a page", open_browser=False)


# --- hostile names ---------------------------------------------------------------------------

# Layer names cannot hold '/' (graph names can: the title below closes tags); an HTML
# comment opening a script is the nearest a layer name comes to leaving the data.
HOSTILE = ["<!--<script>window.pwned=1<\u2044script>", '<img src=x onerror="window.pwned=2">',
           "quote\"'`&amp;\u2028\u2029", "x" * 5000]


def hostile_graph() -> mg.Graph:
    x = mg.Input(("batch", 4), name=HOSTILE[0])
    h = x
    for name in HOSTILE[1:]:
        h = ops.Linear(4, name=name)(h)
    return mg.Graph(x, h, name="<b>hostile</b></title>")


def test_hostile_names_stay_inside_the_data_and_read_back_as_they_are():
    page = hostile_graph().to_html()
    body = page[page.index("<body>"):]
    assert "</script><script>" not in body.replace("</script>\n<script>", "")
    assert "<img" not in page and "\u2028" not in page and "\u2029" not in page
    assert "<title><b>" not in page and "&lt;b&gt;hostile&lt;/b&gt;&lt;/title&gt;" in page
    data = DATA.findall(page)[0]
    assert not set(data) & set("<>&")
    assert set(nodes_of(page)) == set(HOSTILE)
    assert data_of(page)["title"] == "<b>hostile</b></title>"


def test_notebook_frame_holds_the_page_escaped():
    g = hostile_graph()
    frame = g._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and 'sandbox="allow-scripts"' in frame
    srcdoc = re.match(r'<iframe srcdoc="([^"]*)"', frame).group(1)
    assert html.unescape(srcdoc) == g.to_html()
    model = mg.compile(g)
    assert html.unescape(re.match(r'<iframe srcdoc="([^"]*)"', model._repr_html_()).group(1)) \
        == model.to_html()


# --- files and entry points -------------------------------------------------------------------


def test_to_html_writes_the_page(tmp_path):
    g = examples.residual_cnn()
    path = g.to_html(tmp_path / "cnn.html")
    assert path == tmp_path / "cnn.html" and path.read_text("utf-8") == g.to_html()
    model = mg.compile(g, bf16())
    assert model.to_html(str(tmp_path / "m.html")).read_text("utf-8") == model.to_html()
    with pytest.raises(FileNotFoundError):
        g.to_html(tmp_path / "missing" / "cnn.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.html", "m.html"]  # no temp files


def test_show_writes_a_page_outside_a_notebook():
    g = examples.mlp()
    path = mg.show(g, open_browser=False)
    try:
        assert path.suffix == ".html" and path.read_text("utf-8") == g.to_html()
    finally:
        path.unlink()
    page = mg.diff_html(g, g)
    path = mg.show(page, open_browser=False)
    try:
        assert path.read_text("utf-8") == page
    finally:
        path.unlink()


def test_view_command_writes_the_page(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["view", "mlaxgraph.examples:residual_cnn", "--policy", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == "wrote residual_cnn.html"
    nodes = nodes_of((tmp_path / "residual_cnn.html").read_text("utf-8"))
    assert "image_bf16" in nodes
    assert main(["view", "mlaxgraph.examples:mlp", "--batch", "2", "--hlo", "--out", "m.html"]) == 0
    assert nodes_of((tmp_path / "m.html").read_text("utf-8"))["dense"]["hlo"]
    assert main(["view", "mlaxgraph.examples:mlp", "--hlo"]) == 2
    assert "--batch" in capsys.readouterr().err


# --- diffs -------------------------------------------------------------------------------------


def test_diff_of_a_policy_shows_its_casts_as_added():
    g = examples.residual_cnn()
    a, b = mg.compile(g), mg.compile(g, bf16())
    payload = data_of(mg.diff_html(a, b))
    nodes = nodes_of(payload)
    casts = {path for path, node in b.graph.walk() if node.op.op_name == "cast"}
    assert casts and {p for p, n in nodes.items() if n.get("diff") == "added"} == casts
    assert not [p for p, n in nodes.items() if n.get("diff") == "removed"]
    changed = {p for p, n in nodes.items() if n.get("diff") == "changed"}
    # the layers whose outputs went to bfloat16 changed; the float32 islands did not
    expected = {path for path, node in b.graph.walk() if path not in casts
                and path in dict(a.graph.walk())
                and node.outputs != dict(a.graph.walk())[path].outputs}
    assert changed == expected and "stem" in changed and "stem_bn" not in changed
    assert nodes["stem"]["before"] == ["outputs: f32[batch,8,8,16] \u2192 bf16[batch,8,8,16]"]
    assert nodes["res1"].get("diffInside") is True
    assert payload["diff"] == ["residual_cnn (no policy)", "residual_cnn (bfloat16 policy)"]
    assert payload["diffCounts"] == {"added": len(casts), "removed": 0, "changed": len(changed)}
    # the edge the cast now sits on is gone, the two new ones are added
    root = payload["root"]
    names = [n["name"] for n in root["n"]]
    marked = {(names[e[0]], names[e[2]], e[4]) for e in root["e"] if len(e) > 4}
    assert ("image", "stem", "removed") in marked and ("image", "image_bf16", "added") in marked


def test_diff_of_two_graphs_marks_added_removed_and_changed(tmp_path):
    def build(features: int, extra: bool):
        x = mg.Input(("batch", 4), name="x")
        h = ops.Linear(features, name="fc")(x)
        h = ops.relu(h) if extra else h
        return mg.Graph(x, ops.Linear(2, name="out")(h), name="net")

    a, b = build(8, True), build(16, False)
    path = mg.diff_html(a, b, tmp_path / "diff.html", labels=("before", "after"))
    payload = data_of(path.read_text("utf-8"))
    nodes = nodes_of(payload)
    assert {p: n.get("diff") for p, n in nodes.items()} == {
        "x": None, "fc": "changed", "relu": "removed", "out": None}
    assert nodes["fc"]["before"] == ["outputs: f32[batch,8] \u2192 f32[batch,16]",
                                     "features: 8 \u2192 16"]
    assert payload["title"] == "before \u2192 after"
    with pytest.raises(mg.GraphError, match="labels must be two strings"):
        mg.diff_html(a, b, labels=("one",))


# --- Model Explorer ------------------------------------------------------------------------------

# Model Explorer's documented graph format (graph_builder.py of ai-edge-model-explorer):
# field -> type, for the records our files use.
GRAPH_NODE = {"id": str, "label": str, "namespace": str, "attrs": list, "incomingEdges": list,
              "outputsMetadata": list}
INCOMING_EDGE = {"sourceNodeId": str, "sourceNodeOutputId": str, "targetNodeInputId": str}


def check_fields(record: dict, fields: dict) -> None:
    assert set(record) <= set(fields) | {"subgraphIds", "inputsMetadata", "style", "config"}, record
    for key, kind in fields.items():
        assert isinstance(record[key], kind), (key, record)


def test_model_explorer_graph_follows_the_documented_format(tmp_path):
    g = examples.residual_cnn()
    written = g.to_model_explorer(tmp_path / "cnn.json", batch=4)
    assert [p.name for p in written] == ["cnn.json", "cnn.flops.json", "cnn.params.json",
                                         "cnn.activation_bytes.json"]
    collection = json.loads(written[0].read_text("utf-8"))
    # a graph collection, as the app loads a .json file: {label, graphs}
    assert set(collection) == {"label", "graphs"} and collection["label"] == "residual_cnn"
    (graph,) = collection["graphs"]
    assert set(graph) == {"id", "nodes"} and graph["id"] == "residual_cnn"
    nodes = {n["id"]: n for n in graph["nodes"]}
    ids = [n["id"] for n in graph["nodes"]]
    for n in graph["nodes"]:
        check_fields(n, GRAPH_NODE)
        for kv in n["attrs"]:
            assert set(kv) == {"key", "value"} and all(isinstance(v, str) for v in kv.values())
        for edge in n["incomingEdges"]:
            check_fields(edge, INCOMING_EDGE)
            assert ids.index(edge["sourceNodeId"]) < ids.index(n["id"])
        for item in n["outputsMetadata"]:
            assert set(item) == {"id", "attrs"}
    # layers, not blocks, are nodes; blocks are namespaces
    expected = {p for p, node in g.walk() if node.op.op_name != "block"}
    assert set(nodes) == expected
    assert nodes["res1/conv_a"]["label"] == "conv_a" and nodes["res1/conv_a"]["namespace"] == "res1"
    # into the block: its input node; out of it: the node making its output
    assert [e["sourceNodeId"] for e in nodes["res1/x"]["incomingEdges"]] == ["relu"]
    inner_output = g.node("res1").op.graph.outputs[0].node
    assert [e["sourceNodeId"] for e in nodes["max_pool"]["incomingEdges"]] == [f"res1/{inner_output}"]
    assert {"key": "op", "value": "conv"} in nodes["stem"]["attrs"]
    assert nodes["stem"]["outputsMetadata"][0]["attrs"][:2] == [
        {"key": "shape", "value": "[batch,8,8,16]"}, {"key": "dtype", "value": "f32"}]


def test_model_explorer_node_data_holds_the_cost_tables_numbers(tmp_path):
    g = examples.residual_cnn()
    values = {"stem": 0.25, "logits": 0.5}
    written = g.to_model_explorer(tmp_path / "cnn.json", overlay=values, batch=4)
    assert written[-1].name == "cnn.values.json"
    table = mg.compile(g).cost_table(batch=4, xla=False)
    for name, attribute in (("flops", "flops"), ("activation_bytes", "activation_bytes")):
        data = json.loads((tmp_path / f"cnn.{name}.json").read_text("utf-8"))
        assert set(data) == {"residual_cnn"}
        results = data["residual_cnn"]["results"]
        assert all(set(r) == {"value"} for r in results.values())
        assert data["residual_cnn"]["gradient"][0]["stop"] == 0
        assert data["residual_cnn"]["gradient"][-1]["stop"] == 1
        for row in table:
            assert results[row.layer]["value"] == getattr(row, attribute), (name, row.layer)
    params = json.loads((tmp_path / "cnn.params.json").read_text("utf-8"))["residual_cnn"]
    assert params["results"]["stem"]["value"] == 16 * 3 * 3 * 1 + 16
    custom = json.loads(written[-1].read_text("utf-8"))["residual_cnn"]["results"]
    assert custom == {"stem": {"value": 0.25}, "logits": {"value": 0.5}}
