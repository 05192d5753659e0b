"""A graph as DOT text for Graphviz, with no dependency.

Every node is an HTML-like label in a table: the layer's name, its op, its output
spec(s) and its parameter count. Nodes are filled by the dtype of their (first) output,
so float32 and bfloat16 regions ("precision islands") show at a glance; ``Cast`` nodes
are hexagons (dashed when a dtype policy inserted them); nodes that share another
layer's weights have a dashed border and say whose. Multi-output nodes have one cell
(port) per output and each edge leaves from the output it reads; multi-input nodes
have one numbered cell per input slot and each edge arrives at its slot.

Names are never trusted: every text reaches the DOT file through ``_html`` (HTML-like
labels) or ``_esc_string`` (tooltips), node and cluster ids are generated (``n0``,
``n1``, ...), so any name (quotes, ``<``, braces, newlines, backslashes, unicode)
renders as itself. The output is deterministic: the same graph gives the same bytes.

Example:
  >>> from mlaxgraph import examples
  >>> text = graph_to_dot(examples.mlp(4, (3,), 2))
  >>> text.splitlines()[0]
  'digraph mlp {'
  >>> text == graph_to_dot(examples.mlp(4, (3,), 2))
  True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.specs import dtype_str, shape_str
from ..ir.graph import Graph, InputLayer
from ..ops.cast import Cast
from .dot_style import (
    _BLOCK_FILL,
    _BLOCK_LINE,
    _COMPASS,
    _INPUT_SHAPE,
    _TEXT_GREY,
    DEFAULT_OPTIONS,
    DTYPE_COLORS,
    FONTNAME,
    _attrs_text,
    _check_blocks,
    _esc_string,
    _html,
    _node_line,
    _plain_id,
    check_options,
    dtype_category,
    layer_category,
)
from .summary import count_params, count_text

__all__ = ["graph_to_dot", "DEFAULT_OPTIONS", "DTYPE_COLORS", "dtype_category", "check_options",
           "FONTNAME"]


@dataclasses.dataclass
class _Endpoint:
    node: str
    port: str | None = None

    def at(self, compass: str) -> str:
        """The DOT endpoint: the node, or its port with the side edges attach to."""
        return f"{self.node}:{self.port}:{compass}" if self.port else self.node


class _Writer:
    def __init__(self, options: dict[str, Any]):
        self.o = options
        self.count = 0
        self.edges: list[str] = []
        self.categories: dict[str, None] = {}
        self.marks: dict[str, None] = {}
        self.tail_compass, self.head_compass = _COMPASS[options["rankdir"]]
        self.horizontal = options["rankdir"] in ("LR", "RL")
        self.reversed = options["rankdir"] in ("BT", "RL")
        self.prefix = ""  # the path of the expanded block being drawn, for sharding labels

    def expands(self, node) -> bool:
        """Whether the block ``node`` is drawn as a cluster of its layers."""
        which = self.o["expand_nested"]
        if isinstance(which, frozenset):
            return node.name in which or self.prefix + node.name in which
        return which

    def new_id(self) -> str:
        ident = f"n{self.count}"
        self.count += 1
        return ident

    # --- labels ---------------------------------------------------------------------

    def spec_text(self, spec) -> str:
        parts = []
        if self.o["show_dtype"]:
            parts.append(dtype_str(spec.dtype))
        if self.o["show_shapes"]:
            parts.append(shape_str(spec.shape))
        return "".join(parts)

    def params_text(self, counts, node) -> str | None:
        if node.shares_weights:
            return None
        trainable, state = counts.get(node.layer, (0, 0))
        if not self.o["show_params"] or trainable + state == 0:
            return None
        text = f"params: {count_text(trainable + state)}"
        if state:
            text += f" ({count_text(state)} non-trainable)"
        return text

    def ports(self, prefix: str, cells: list[tuple[str, str | None]]) -> str:
        """A nested table of port cells across the flow (a row for TB/BT, a column for
        LR/RL); cells are (html text, background colour or None)."""
        tds = []
        for i, (text, color) in enumerate(cells):
            bg = f' BGCOLOR="{color}"' if color else ""
            tds.append(f'<TD PORT="{prefix}{i}"{bg}>{text}</TD>')
        if self.horizontal:
            rows = "".join(f"<TR>{td}</TR>" for td in tds)
        else:
            rows = "<TR>" + "".join(tds) + "</TR>"
        return ('<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="2" '
                f'COLOR="{_TEXT_GREY}">{rows}</TABLE>')

    def table(self, body_lines: list[str], in_cells, out_cells, *, style: str | None,
              fill: str | None, border: int, color: str) -> str:
        """An HTML-like label: the input ports, the body and the output ports along the
        flow direction."""
        body = "<BR/>".join(body_lines)
        bands = []
        if in_cells:
            bands.append(f"<TD>{self.ports('i', in_cells)}</TD>")
        bands.append(f'<TD CELLPADDING="5">{body}</TD>')
        if out_cells:
            bands.append(f"<TD>{self.ports('o', out_cells)}</TD>")
        if self.reversed:
            bands.reverse()
        if self.horizontal:
            rows = "<TR>" + "".join(bands) + "</TR>"
        else:
            rows = "".join(f"<TR>{b}</TR>" for b in bands)
        attrs = [f'BORDER="{border}"', 'CELLBORDER="0"', 'CELLSPACING="0"', 'CELLPADDING="2"',
                 f'COLOR="{color}"']
        if fill is not None:
            attrs.append(f'BGCOLOR="{fill}"')
        if style:
            attrs.append(f'STYLE="{style}"')
        return f"<<TABLE {' '.join(attrs)}>{rows}</TABLE>>"

    def body_lines(self, node, graph, counts, *, op_line: str, one_spec: bool) -> list[str]:
        lines = [f"<B>{_html(node.op.display_name(node.name))}</B>", _html(op_line)]
        if self.o["show_attrs"]:
            lines += [f'<FONT POINT-SIZE="8">{_html(t)}</FONT>' for t in self.op_attrs(node)]
        if one_spec:
            text = self.spec_text(node.outputs[0])
            if text:
                lines.append(_html(text))
        params = self.params_text(counts, node)
        if params:
            lines.append(f'<FONT COLOR="{_TEXT_GREY}">{_html(params)}</FONT>')
        if node.shares_weights:
            lines.append(f"<I>{_html('shares weights with ' + node.layer)}</I>")
        lines += self.sharding_lines(node)
        return lines

    def sharding_lines(self, node) -> list[str]:  # a compiled model's notes: sharding, remat
        path, remat = self.prefix + node.name, (self.o["remat"] or {}).get(self.prefix + node.name)
        texts = [(self.o["sharding"] or {}).get(path), f"remat {remat}" if remat else None]
        return [f'<FONT POINT-SIZE="8" COLOR="{_TEXT_GREY}">{_html(t)}</FONT>' for t in texts if t]

    def op_attrs(self, node) -> list[str]:
        if node.op.subgraph() is not None or isinstance(node.op, (InputLayer, Cast)):
            return []
        return _attrs_text(node.op)

    # --- nodes ------------------------------------------------------------------------

    def emit_graph(self, graph, indent: str, scope_inputs: list[tuple[_Endpoint, str]] | None,
                   lines: list[str]) -> list[_Endpoint]:
        """Writes the nodes of ``graph`` (clusters for expanded blocks) to ``lines`` and
        their edges to ``self.edges``; returns the endpoints of the graph's outputs.

        ``scope_inputs``: for an expanded block, the endpoint (and spec) feeding each of
        its inputs."""
        counts = count_params(graph)
        out_of: dict[tuple[str, int], _Endpoint] = {}

        def edge(source: _Endpoint, target: _Endpoint, spec) -> None:
            category = dtype_category(spec.dtype)
            color = DTYPE_COLORS[category][1]
            self.edges.append(
                f"{source.at(self.tail_compass)} -> {target.at(self.head_compass)} "
                f'[color="{color}", tooltip={_esc_string(spec)}];')

        for node in graph.nodes:
            if isinstance(node.op, InputLayer):
                ident = self.new_id()
                spec = node.outputs[0]
                fill, line = self.fill(spec.dtype)
                body = [f"<B>{_html(node.name)}</B>", "input"]
                text = self.spec_text(spec)
                if text:
                    body.append(_html(text))
                body += self.sharding_lines(node)
                label = "<" + "<BR/>".join(body) + ">"
                lines.append(f'{indent}{ident} [{_INPUT_SHAPE[self.o["rankdir"]]}, style=filled, fillcolor="{fill}", '
                             f'color="{line}", label={label}, tooltip={_esc_string(_node_line(node))}];')
                out_of[(node.name, 0)] = _Endpoint(ident)
                if scope_inputs is not None:
                    position = graph.inputs.index(node.name)
                    source, outer_spec = scope_inputs[position]
                    edge(source, _Endpoint(ident), outer_spec)
                continue

            input_specs = graph.input_specs_of(node)
            if node.op.subgraph() is not None and self.expands(node):
                outs = self.emit_cluster(node, graph, counts, indent, lines,
                                         [(out_of[(v.node, v.index)], s)
                                          for v, s in zip(node.inputs, input_specs)])
                for j, endpoint in enumerate(outs):
                    out_of[(node.name, j)] = endpoint
                continue

            ident = self.new_id()
            if isinstance(node.op, Cast):
                self.emit_cast(ident, node, input_specs, indent, lines)
            else:
                self.emit_layer(ident, node, graph, counts, indent, lines)
            many_in = len(node.inputs) > 1
            many_out = len(node.outputs) > 1
            for j in range(len(node.outputs)):
                out_of[(node.name, j)] = _Endpoint(ident, f"o{j}" if many_out else None)
            for slot, (v, spec) in enumerate(zip(node.inputs, input_specs)):
                edge(out_of[(v.node, v.index)], _Endpoint(ident, f"i{slot}" if many_in else None), spec)

        results = []
        for j, v in enumerate(graph.outputs):
            ident = self.new_id()
            text = "output" if len(graph.outputs) == 1 else f"output {j}"
            lines.append(f'{indent}{ident} [shape=oval, style=filled, fillcolor="white", '
                         f'color="{_TEXT_GREY}", fontsize=9, label=<{text}>, '
                         f"tooltip={_esc_string(f'{text}: {v} {graph.spec(v)}')}];")
            edge(out_of[(v.node, v.index)], _Endpoint(ident), graph.spec(v))
            results.append(_Endpoint(ident))
        return results

    def fill(self, dtype) -> tuple[str, str]:
        category = dtype_category(dtype)
        self.categories.setdefault(category)
        return DTYPE_COLORS[category]

    def emit_layer(self, ident, node, graph, counts, indent, lines) -> None:
        many_out = len(node.outputs) > 1
        category = layer_category(node.op, graph.input_specs_of(node), node.outputs[0].dtype)
        self.categories.setdefault(category)
        fill, line = DTYPE_COLORS[category]
        op_line = node.op.op_name
        inner = node.op.subgraph()
        if inner is not None:
            layers = sum(1 for n in inner.nodes if n.name not in inner.inputs)
            op_line = f"block {inner.name} ({layers} layers)" if inner.name != node.name else \
                f"block ({layers} layers)"
            self.marks.setdefault("block")
        body = self.body_lines(node, graph, counts, op_line=op_line, one_spec=not many_out)
        in_cells = ([(f'<FONT POINT-SIZE="8">{i}</FONT>', None) for i in range(len(node.inputs))]
                    if len(node.inputs) > 1 else None)
        out_cells = None
        if many_out:
            out_cells = []
            for j, spec in enumerate(node.outputs):
                text = self.spec_text(spec)
                text = f"{j}: {text}" if text else f"output {j}"
                out_cells.append((f'<FONT POINT-SIZE="9">{_html(text)}</FONT>',
                                  self.fill(spec.dtype)[0]))
        style = "rounded"
        if node.shares_weights:
            style = "rounded,dashed"
            self.marks.setdefault("shared")
        border = 2 if inner is not None else 1
        label = self.table(body, in_cells, out_cells, style=style, fill=fill, border=border, color=line)
        lines.append(f"{indent}{ident} [shape=plain, label={label}, "
                     f"tooltip={_esc_string(_node_line(node))}];")

    def emit_cast(self, ident, node, input_specs, indent, lines) -> None:
        fill, line = self.fill(node.outputs[0].dtype)
        source = dtype_str(input_specs[0].dtype) if input_specs else "?"
        body = [f"<B>{_html(node.name)}</B>",
                _html(f"cast {source} \u2192 {dtype_str(node.outputs[0].dtype)}")]
        text = self.spec_text(node.outputs[0])
        if self.o["show_shapes"] and text:
            body.append(_html(text))
        inserted = bool(getattr(node.op, "inserted", False))
        if inserted:
            body.append('<I><FONT POINT-SIZE="8">inserted by policy</FONT></I>')
            self.marks.setdefault("inserted cast")
        else:
            self.marks.setdefault("cast")
        style = "filled,dashed" if inserted else "filled,bold"
        label = "<" + "<BR/>".join(body) + ">"
        lines.append(f'{indent}{ident} [shape=hexagon, style="{style}", fillcolor="{fill}", '
                     f'color="{line}", margin="0.02,0.02", label={label}, '
                     f"tooltip={_esc_string(_node_line(node))}];")

    def emit_cluster(self, node, graph, counts, indent, lines, scope_inputs) -> list[_Endpoint]:
        cluster = f"cluster_{self.new_id()}"
        inner = node.op.graph
        title = [f"<B>{_html(node.name)}</B>"]
        if inner.name != node.name:
            title.append(_html(f"block {inner.name}"))
        else:
            title.append("block")
        params = self.params_text(counts, node)
        if params:
            title.append(_html(params))
        style = "rounded,filled"
        if node.shares_weights:
            style += ",dashed"
            title.append(f"<I>{_html('shares weights with ' + node.layer)}</I>")
            self.marks.setdefault("shared")
        self.marks.setdefault("block")
        lines.append(f"{indent}subgraph {cluster} {{")
        inner_indent = indent + "  "
        lines.append(f'{inner_indent}label=<{" &middot; ".join(title)}>;')
        lines.append(f'{inner_indent}style="{style}"; fillcolor="{_BLOCK_FILL}"; '
                     f'color="{_BLOCK_LINE}"; tooltip={_esc_string(_node_line(node))};')
        outer, self.prefix = self.prefix, f"{self.prefix}{node.name}/"
        outs = self.emit_graph(inner, inner_indent, scope_inputs, lines)
        self.prefix = outer
        lines.append(f"{indent}}}")
        return outs

    def legend(self, indent: str) -> list[str]:
        lines = [f"{indent}subgraph cluster_legend {{",
                 f'{indent}  label=<<B>legend</B>>; style="rounded"; color="{_BLOCK_LINE}";']
        entries = []
        for category in DTYPE_COLORS:
            if category in self.categories:
                fill, line = DTYPE_COLORS[category]
                entries.append(f'shape=box, style="rounded,filled", fillcolor="{fill}", '
                               f'color="{line}", label=<{category}>')
        if "inserted cast" in self.marks:
            entries.append('shape=hexagon, style="dashed", label=<cast inserted<BR/>by policy>')
        if "cast" in self.marks:
            entries.append('shape=hexagon, style="bold", label=<cast>')
        if "shared" in self.marks:
            entries.append('shape=box, style="rounded,dashed", label=<shares weights>')
        if "block" in self.marks:
            if self.o["expand_nested"]:
                entries.append(f'shape=box, style="rounded,filled", fillcolor="{_BLOCK_FILL}", '
                               f'color="{_BLOCK_LINE}", label=<nested block>')
            else:
                entries.append('shape=box, style="rounded", penwidth=2, label=<block>')
        ids: list[str] = []
        for entry in entries:
            ident = f"legend_{len(ids)}"
            ids.append(ident)
            lines.append(f"{indent}  {ident} [{entry}, fontsize=9, tooltip=\"legend\"];")
        if len(ids) > 1:  # a row (or column) of samples: invisible edges keep their order
            lines.append(f"{indent}  {' -> '.join(ids)} [style=invis];")
            lines.append(f"{indent}  {{rank=same; {'; '.join(ids)};}}")
        lines.append(f"{indent}}}")
        return lines


def graph_to_dot(graph, **options: Any) -> str:
    """The graph as DOT text (no dependency; render it with Graphviz's ``dot``).

    Args:
      graph: an ``mg.Graph``.

    Keyword Args:
      show_shapes: show output shapes (symbolic dims by name). Default True.
      show_dtype: show output dtypes. Default True.
      show_params: show parameter counts (trainable + non-trainable). Default True.
      show_attrs: show each op's non-default hyperparameters. Default False.
      expand_nested: draw nested blocks as clusters of their layers, wired to the
        block's inputs and outputs; otherwise one node per block. True expands every
        block, a list of names (or paths: ``block0/attention``) only those blocks.
        Default False. A name that is no block of the graph raises ``GraphError``.
      rankdir: ``"TB"`` (top to bottom), ``"LR"``, ``"BT"`` or ``"RL"``. Default "TB".
      show_legend: add a legend of the dtype colours and marks the drawing uses.
      sharding: layer path (``layer`` or ``block/layer``) -> a sharding label shown
        under the layer; ``CompiledModel.to_dot`` fills it when compiled with a mesh.
      remat: block or layer path -> its rematerialization policy, shown under it;
        ``CompiledModel.to_dot`` fills it when compiled with ``remat``.

    Returns:
      The DOT text, ending with a newline; the same graph always gives the same text.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph_to_dot takes an mg.Graph, got {type(graph).__name__}")
    o = check_options(options)
    if isinstance(o["expand_nested"], frozenset):
        _check_blocks(graph, o["expand_nested"])
    writer = _Writer(o)
    body: list[str] = []
    writer.emit_graph(graph, "  ", None, body)
    counts = count_params(graph)
    total = sum(t + s for t, s in counts.values())
    title = f"<B>{_html(graph.name)}</B>"
    if o["show_params"]:
        title += f" &middot; {count_text(total)} params"
    head = [
        f"digraph {_plain_id(graph.name)} {{",
        f'  graph [rankdir={o["rankdir"]}, label=<{title}>, labelloc=t, fontname="{FONTNAME}", '
        f'fontsize=12, nodesep=0.3, ranksep=0.35, tooltip={_esc_string(graph.name)}];',
        f'  node [fontname="{FONTNAME}", fontsize=10, margin="0.12,0.05"];',
        f'  edge [fontname="{FONTNAME}", fontsize=8, arrowsize=0.7, penwidth=1.2];',
    ]
    tail = []
    if o["show_legend"]:
        tail = writer.legend("  ")
    lines = head + body + tail + ["  " + e for e in writer.edges] + ["}"]
    return "\n".join(lines) + "\n"

