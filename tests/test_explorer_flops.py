"""The explorer's FLOPs and activation bytes are the cost table's: for every layer, every
block (the sum of its layers') and every run of blocks (folded or scanned: the run's
total), with symbolic dims given or left at 1, and one attention layer counted by hand."""

from __future__ import annotations

import json
import re

import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.render.html.payload import walk_payload

DATA = re.compile(r'<script type="application/json" id="mlaxgraph-data">(.*?)</script>', re.DOTALL)

WIDTH, HEADS, LAYERS = 32, 4, 3
GPT2 = {"n_layer": LAYERS, "n_embd": WIDTH, "n_head": HEADS, "vocab_size": 50, "n_positions": 4096,
        "attn_pdrop": 0.1}
DIMS = {"batch": 2, "seq": 16}


def payload_of(page: str) -> dict:
    (found,) = DATA.findall(page)
    return json.loads(found)


def nodes_of(payload: dict) -> dict[str, dict]:
    return {n["id"]: n for n in walk_payload(payload["root"])}


def formula(value) -> str | None:
    return None if value is None else str(value).replace(" ", "")


def expected(node: dict, table) -> tuple[int | None, int]:
    """A node's FLOPs and activation bytes from the cost table: a layer's (or a scan's)
    row, a block's layers' sum, a fold's blocks' sum; a scan's bytes are its blocks'."""
    rows = {row.layer: row for row in table}
    if node["op"] == "input":
        return 0, 0
    if node["id"] in rows:
        row = rows[node["id"]]
        if row.op != "scan":
            return row.flops, row.activation_bytes
        inner = [r for r in table if r.within == row.layer]
        return row.flops, node["runs"] * sum(r.activation_bytes for r in inner)
    if "fold" in node:
        members = [expected(m, table) for m in node["sub"]["n"]]
        flops = [f for f, _ in members]
        return (None if None in flops else sum(flops)), sum(a for _, a in members)
    inner = [r for r in table if r.layer.startswith(node["id"] + "/") and r.within is None]
    flops = [r.flops for r in inner]
    return (None if None in flops else sum(flops)), sum(r.activation_bytes for r in inner)


def check_against_table(payload: dict, table) -> dict[str, dict]:
    """Every node's numbers are the table's; every layer's formulas are its row's."""
    nodes = nodes_of(payload)
    for row in table:
        node = nodes[row.layer]
        assert node["flops"] == formula(row.flops_formula), row.layer
        if row.op != "scan":
            assert node["act"] == formula(row.activation_bytes_formula), row.layer
    for path, node in nodes.items():
        flops, activations = expected(node, table)
        assert (node["flops_v"], node["act_v"]) == (flops, activations), path
        # no layer with a FLOP rule is a "?" (None) with every dim given
        if node["flops"] is not None:
            assert isinstance(node["flops_v"], int), path
    assert payload["unbound"] == []
    return nodes


def gpt2() -> mg.Graph:
    return mg.models.gpt2(GPT2)


@pytest.mark.parametrize("scan", [False, "always"], ids=["unscanned", "scanned"])
def test_gpt2_compiled_flops_and_bytes_are_the_cost_tables(scan):
    model = mg.compile(gpt2(), scan_blocks=scan)
    table = model.cost_table(**DIMS, xla=False)
    nodes = check_against_table(payload_of(model.to_html(**DIMS)), table)
    run = "h.0..h.2" if scan else "h.0\u2026h.2"
    assert nodes[run]["flops_v"] == table.flops - sum(
        r.flops for r in table if r.within is None and not r.layer.startswith("h."))
    attention = f"{'h.0..h.2' if scan else 'h.0'}/attn"
    assert nodes[attention]["flops_v"] == table[attention].flops > 0


def test_a_scanned_run_shows_the_runs_cost_as_the_folded_blocks_do():
    flat = nodes_of(payload_of(mg.compile(gpt2()).to_html(**DIMS)))
    scanned = nodes_of(payload_of(mg.compile(gpt2(), scan_blocks="always").to_html(**DIMS)))
    fold, scan = flat["h.0\u2026h.2"], scanned["h.0..h.2"]
    assert fold["fold"] == scan["runs"] == LAYERS
    assert scan["flops_v"] == fold["flops_v"] == LAYERS * flat["h.0"]["flops_v"]
    assert scan["act_v"] == fold["act_v"] == LAYERS * flat["h.0"]["act_v"]
    assert scan["flops"] == fold["flops"]
    # inside the scan: one block, as the cost table's rows within it
    assert scanned["h.0..h.2/attn"]["flops_v"] == flat["h.1/attn"]["flops_v"]


def test_gpt2_graph_page_matches_the_compiled_models_table():
    g = gpt2()
    table = mg.compile(g).cost_table(**DIMS, xla=False)
    check_against_table(payload_of(g.to_html(**DIMS)), table)


def test_a_dim_left_out_counts_as_one_and_is_named():
    g = gpt2()
    payload = payload_of(g.to_html(batch=2))
    assert payload["unbound"] == ["seq"]
    table = mg.compile(g).cost_table(batch=2, seq=1, xla=False)
    nodes = nodes_of(payload)
    for row in table:
        assert nodes[row.layer]["flops_v"] == row.flops, row.layer
        assert nodes[row.layer]["act_v"] == row.activation_bytes, row.layer


def attention_flops(batch: int, seq: int, width: int, heads: int) -> int:
    """GPT-2's attention by hand, counted as XLA does (ops/flops.py): a multiply-add is 2,
    an add, a compare, a select, a divide 1, exp none. Self-attention, with biases,
    causal, dropout in training, float32 throughout."""
    head_dim = width // heads
    tokens = batch * seq                       # rows of the input
    scores = batch * heads * seq * seq         # entries of q k^T
    projections = 3 * tokens * (2 * width * width + width)        # q, k, v: dot and bias
    scale = tokens * width                     # q / sqrt(head_dim)
    dots = 2 * (2 * scores * head_dim)         # q k^T and weights @ v
    softmax = 4 * scores - batch * heads * seq   # max, subtract, sum, divide (exp free)
    mask = scores + seq * seq                  # the select, the compare of two iotas
    dropout = 3 * scores                       # compare, divide, select
    out = 2 * tokens * width * width + tokens * width   # output projection and its bias
    return projections + scale + dots + softmax + mask + dropout + out


@pytest.mark.parametrize("batch, seq", [(2, 16), (64, 4096)])
def test_attention_flops_counted_by_hand(batch, seq):
    """The second size passes 2**31: the numbers are 64-bit."""
    nodes = nodes_of(payload_of(gpt2().to_html(batch=batch, seq=seq)))
    hand = attention_flops(batch, seq, WIDTH, HEADS)
    assert nodes["h.0/attn"]["flops_v"] == hand
    assert seq == 16 or hand > 2**31
    scanned = nodes_of(payload_of(mg.compile(gpt2(), scan_blocks="always").to_html(batch=batch, seq=seq)))
    assert scanned["h.0..h.2/attn"]["flops_v"] == hand


def test_residual_cnn_flops_and_bytes_are_the_cost_tables():
    g = examples.residual_cnn()
    table = mg.compile(g).cost_table(batch=4, xla=False)
    check_against_table(payload_of(g.to_html(batch=4)), table)
    check_against_table(payload_of(mg.compile(g).to_html(batch=4)), table)


def symbolic_cnn() -> mg.Graph:
    """A CNN on symbolic ``height`` and ``width``: strided ``SAME`` windows make floordivs
    of them, and two equal residual blocks fold."""
    x = mg.Input(("batch", "height", "width", 3), name="image")
    h = ops.Conv(8, (3, 3), strides=2, padding="SAME", name="stem")(x)
    h = ops.MaxPool((3, 3), strides=(2, 2), padding="SAME")(ops.relu(h))
    block = examples.residual_block(8, "res")
    h = block.as_block("res0")(h)
    h = block.as_block("res1")(h)
    h = ops.GlobalAvgPool()(h)
    return mg.Graph(x, ops.Linear(10, name="logits")(h), name="symbolic_cnn")


def test_cnn_on_symbolic_sizes_flops_and_bytes_are_the_cost_tables():
    g = symbolic_cnn()
    dims = {"batch": 3, "height": 37, "width": 30}
    table = mg.compile(g).cost_table(**dims, xla=False)
    assert "floordiv" in formula(table["stem"].flops_formula) or "//" in formula(table["stem"].flops_formula)
    nodes = check_against_table(payload_of(g.to_html(**dims)), table)
    assert nodes["res0\u2026res1"]["fold"] == 2
