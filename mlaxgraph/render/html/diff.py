"""Two graphs (or compiled models) compared on one explorer page.

Nodes are matched by their path in each graph. The page draws the union: nodes only in
the second are ``added``, nodes only in the first ``removed``, and nodes in both whose op,
attributes, output shapes or dtypes differ ``changed`` (the details panel lists what was
before); edges only in one of them are marked the same way. A block with differences
inside is marked ``data-diff-inside`` and expands like any block. Runs of equal blocks
are not folded here, so every difference has a node to sit on.
"""

from __future__ import annotations

from typing import Any

from ...compiler.compile import CompiledModel
from ...core.errors import GraphError
from .page import check_dims, page_html, payload_of, write_page
from .payload import walk_payload

__all__ = ["diff_payload", "diff_html"]


def _signature(node: dict) -> tuple:
    return (node["op"], tuple(map(tuple, node.get("attrs", []))),
            tuple((o[0], o[1]) for o in node["outs"]))


def _changes(a: dict, b: dict) -> list[str]:
    lines = []
    if a["op"] != b["op"]:
        lines.append(f"op: {a['op']} \u2192 {b['op']}")
    before = [o[0] + o[1] for o in a["outs"]]
    after = [o[0] + o[1] for o in b["outs"]]
    if before != after:
        lines.append(f"outputs: {', '.join(before)} \u2192 {', '.join(after)}")
    attrs_a, attrs_b = dict(map(tuple, a.get("attrs", []))), dict(map(tuple, b.get("attrs", [])))
    for key in dict.fromkeys([*attrs_a, *attrs_b]):
        if attrs_a.get(key) != attrs_b.get(key):
            lines.append(f"{key}: {attrs_a.get(key, '(none)')} \u2192 {attrs_b.get(key, '(none)')}")
    return lines


def _mark_all(node: dict, status: str) -> dict:
    node = dict(node, diff=status)
    if "sub" in node:
        sub = node["sub"]
        node["sub"] = dict(sub, n=[_mark_all(n, status) for n in sub["n"]])
    return node


def _merge(sa: dict | None, sb: dict | None) -> tuple[dict, bool]:
    """The union of two scopes (either may be None) and whether anything differs."""
    na = [] if sa is None else sa["n"]
    nb = [] if sb is None else sb["n"]
    in_a = {n["name"]: n for n in na}
    in_b = {n["name"]: n for n in nb}
    # Removed nodes go right after the last node before them that both graphs have.
    after: dict[str | None, list[dict]] = {}
    anchor = None
    for n in na:
        if n["name"] in in_b:
            anchor = n["name"]
        else:
            after.setdefault(anchor, []).append(n)
    ordered: list[tuple[dict | None, dict | None]] = [(n, None) for n in after.get(None, [])]
    for n in nb:
        ordered.append((in_a.get(n["name"]), n))
        ordered += [(r, None) for r in after.get(n["name"], [])]
    nodes, differs = [], False
    for a, b in ordered:
        if b is None:
            assert a is not None  # every pair holds one of the two
            nodes.append(_mark_all(a, "removed"))
            differs = True
        elif a is None:
            nodes.append(_mark_all(b, "added"))
            differs = True
        else:
            node = dict(b)
            if _signature(a) != _signature(b):
                node["diff"] = "changed"
                node["before"] = _changes(a, b)
                differs = True
            if "sub" in a or "sub" in b:
                sub, inside = _merge(a.get("sub"), b.get("sub"))
                node["sub"] = sub
                if inside:
                    node["diffInside"] = True
                    differs = True
            nodes.append(node)
    index = {n["name"]: k for k, n in enumerate(nodes)}

    def edges_of(scope):
        if scope is None:
            return {}
        names = [n["name"] for n in scope["n"]]
        return {(names[s], o, names[t], slot): None for s, o, t, slot in scope["e"]}

    ea, eb = edges_of(sa), edges_of(sb)
    edges = []
    for key in dict.fromkeys([*eb, *ea]):
        status = None if key in ea and key in eb else "added" if key in eb else "removed"
        differs = differs or status is not None
        s, o, t, slot = key
        edge = [index[s], o, index[t], slot]
        if status:
            edge.append(status)
        edges.append(edge)
    main = sb if sb is not None else sa
    assert main is not None  # a diff compares two scopes, at least one present
    names = [n["name"] for n in main["n"]]
    return ({"n": nodes, "e": edges, "i": [[index[names[k]], slot] for k, slot in main["i"]],
             "o": [[index[names[k]], j] for k, j in main["o"]]}, differs)


def _label(obj) -> str:
    if isinstance(obj, CompiledModel):
        policy = obj.policy
        return f"{obj.graph.name} ({'no policy' if policy is None else f'{policy.compute_dtype} policy'})"
    return obj.name


def diff_payload(a, b, *, labels: tuple[str, str] | None = None, **dims: Any) -> dict:
    """The page data comparing ``a`` (before) with ``b`` (after)."""
    for side in (a, b):
        check_dims("diff_html", side, dims, ["labels"])
    pa = payload_of(a, fold=False, **dims)
    pb = payload_of(b, fold=False, **dims)
    if labels is None:
        labels = (_label(a), _label(b))
    if len(labels) != 2 or not all(isinstance(x, str) for x in labels):
        raise GraphError(f"labels must be two strings, got {labels!r}")
    if labels[0] == labels[1]:
        labels = (labels[0] + " (a)", labels[1] + " (b)")
    root, _ = _merge(pa["root"], pb["root"])
    counts = {"added": 0, "removed": 0, "changed": 0}
    for node in walk_payload(root):
        if node.get("diff") in counts:
            counts[node["diff"]] += 1
    return {**pb, "title": f"{labels[0]} \u2192 {labels[1]}", "diff": list(labels),
            "diffCounts": counts, "root": root, "unbound": sorted({*pa["unbound"], *pb["unbound"]})}


def diff_html(a, b, path: Any = None, *, labels: tuple[str, str] | None = None, **dims: int):
    """An explorer page comparing two graphs or compiled models: the text, or with
    ``path`` the page written there and its path.

    Nodes only in ``b`` carry ``data-diff="added"``, nodes only in ``a``
    ``data-diff="removed"``, nodes in both whose op, attributes, output shapes or dtypes
    differ ``data-diff="changed"``. A float32 model against its bfloat16 policy shows
    the casts the policy inserted as added and the layers now computing in bfloat16 as
    changed.

    Args:
      a: the graph or compiled model before.
      b: the one after.
      path: where to write the page; None to return its text.
      labels: the names of the two sides in the page (the graphs' names, with the
        policy of a compiled model, by default).
      **dims: values of symbolic dims for the FLOPs and byte counts (``batch=8``).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph import examples
      >>> g = examples.mlp(8, (4,), 2)
      >>> page = mg.diff_html(mg.compile(g), mg.compile(g, mg.Policy(compute_dtype="bfloat16")))
      >>> page.startswith("<!DOCTYPE html>")
      True
    """
    text = page_html(diff_payload(a, b, labels=labels, **dims))
    return text if path is None else write_page(path, text)
