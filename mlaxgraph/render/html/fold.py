"""Runs of equal blocks folded into one node of the explorer's data: two or more
consecutive blocks running structurally equal graphs, each one's output the next one's
first input and read by nothing else, any further inputs (a decoder's positions, cache
index and mask) the same for all, become one node (``fold``: the count) drawn as
``block0 … block31: transformer_block × 32``. The folded node reads those further inputs
once; its ``sub`` scope chains the blocks and, like a block's, holds an input node for
each further input, read by every block of the run."""

from __future__ import annotations

from ...compiler.passes.fold_repeated_blocks import repeated_runs

__all__ = ["fold_runs"]


def _sum(values):
    total = 0
    for v in values:
        total = total + v
    return total


def fold_runs(graph, scope: dict, builder) -> dict:
    """The scope with each run of two or more equal consecutive blocks (structurally
    equal graphs, each one's output the next one's first input, read by nothing else,
    the further inputs the same for all) folded into one node whose ``sub`` chains them
    and hands each of them the further inputs."""
    nodes = graph.nodes
    position_of = {node.name: k for k, node in enumerate(nodes)}
    runs = []  # (first position, last position) of the runs standing side by side
    for run in repeated_runs(graph):
        positions = [position_of[name] for name in run]
        if positions == list(range(positions[0], positions[-1] + 1)):
            runs.append((positions[0], positions[-1]))
    if not runs:
        return scope
    old = scope["n"]
    new_index: dict[int, tuple[int, str]] = {}  # old index -> (new index, role)
    new_nodes: list[dict] = []
    first_of = {a: b for a, b in runs}
    position = 0
    while position < len(old):
        if position in first_of:
            last = first_of[position]
            members = old[position:last + 1]
            fold = _fold_node(members, nodes[position].op.subgraph().name, builder)
            for k in range(position, last + 1):
                new_index[k] = (len(new_nodes), "first" if k == position else
                                "last" if k == last else "inner")
            new_nodes.append(fold)
            position = last + 1
        else:
            new_index[position] = (len(new_nodes), "")
            new_nodes.append(old[position])
            position += 1
    edges = []
    for s, out, t, slot in scope["e"]:
        ns, nt = new_index[s][0], new_index[t][0]
        if ns == nt:  # inside a fold: its chain
            continue
        if new_index[t][1] in ("inner", "last"):  # a further input: the fold reads it once,
            continue  # from its first block's edge
        edges.append([ns, out, nt, slot])
    return {"n": new_nodes, "e": edges, "i": [[new_index[k][0], slot] for k, slot in scope["i"]],
            "o": [[new_index[k][0], j] for k, j in scope["o"]]}


def _fold_node(members: list[dict], graph_name: str, builder) -> dict:
    first, last = members[0], members[-1]
    count = len(members)
    fold_id = f"{first['id']}\u2026{last['name']}"
    # Each further input enters the unfolded run at an input node of its own (as a
    # block's inputs do), which hands it to every block.
    extra = []
    for slot, (node, _) in enumerate(first["sub"]["i"][1:first.get("nin", 1)], start=1):
        entry = dict(first["sub"]["n"][node])
        entry.update(id=f"{fold_id}/{entry['name']}", params=0)
        extra.append((slot, entry))
    chain = [[len(extra) + k, 0, len(extra) + k + 1, 0] for k in range(count - 1)]
    reads = [[e, 0, len(extra) + k, slot] for e, (slot, _) in enumerate(extra) for k in range(count)]
    fold = {"id": fold_id, "name": f"{first['name']} \u2026 {last['name']}",
            "op": "block", "fold": count, "graph": graph_name,
            "title": f"{first['name']} \u2026 {last['name']}: {graph_name} \u00d7 {count}",
            "outs": last["outs"], "cat": last["cat"], "layers": first.get("layers", 0),
            "params": sum(m.get("params", 0) for m in members),
            "sub": {"n": [entry for _, entry in extra] + members, "e": chain + reads,
                    "i": [[len(extra), 0]] + [[e, 0] for e in range(len(extra))],
                    "o": [[len(extra) + count - 1, j] for j in range(len(last["outs"]))]}}
    if "nin" in first:
        fold["nin"] = first["nin"]
    flops = [m.get("_flops") for m in members]
    fold["flops_f"] = None if any(f is None for f in flops) else _sum(flops)
    fold["act_f"] = _sum(m.get("_act", 0) for m in members)
    builder.finish(fold)
    return fold
