"""Surgery: selecting layers by path and changing them, as rules on the rewriter.

``Graph.select`` names layers by path (``h.3/attn``, as in params); ``Graph.replace``,
``insert_after``, ``insert_before`` and ``remove`` build the new layers with the
user's function on symbolic tensors standing for the old layer's inputs (or output),
and splice them in with one ``rewrite``. The function is called once per selected
layer, equal blocks included (blocks it changes alike stay equal graphs, so their
runs still fold into one scan). A path inside a block changes that block call alone:
the other calls keep the very same graph.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..core.errors import GraphError, MlaxGraphError, ShapeError, SourceInfo, capture_source, node_message
from ..core.registry import registered_ops
from ..core.signatures import call_problem
from ..core.specs import TensorSpec
from .as_called import as_called
from .builder import Call, SymbolicTensor, trace_graph
from .graph import Graph, InputLayer
from .node import Node, Value
from .op import Layer
from .paths import is_pattern, module_view, near_names, path_matcher
from .rewrite import Rewrite, Rule, rewrite
from .scan import unfold_scans
from .verify import verify

__all__ = ["select", "surgery", "layer_paths", "shared_call_paths", "resolve_selection"]

def layer_paths(graph: Graph, prefix: str = "") -> Iterator[tuple[str, Node]]:
    """Every layer (no inputs, no blocks) with its path, through nested blocks, in graph
    order; a scan's body under each of its blocks' names (``h.0/attn`` ...), a block
    called twice (sharing weights) under its first call's name."""
    for node in graph.nodes:
        if node.name in graph.inputs:
            continue
        inner = node.op.subgraph()
        if inner is None:
            if not node.shares_weights:
                yield prefix + node.name, node
            continue
        if node.shares_weights:
            continue
        names = getattr(node.op, "names", None) or (node.name,)
        for name in names:
            yield from layer_paths(inner, f"{prefix}{name}/")


def shared_call_paths(graph: Graph, prefix: str = "") -> Iterator[tuple[str, Node]]:
    """Every further call of a layer or block (sharing its weights: GPT-2's tied head
    ``wte@1``, a block called twice ``blk@1``) with its path: the calls ``layer_paths``
    lists under their layer's name."""
    for node in graph.nodes:
        if node.shares_weights:
            yield prefix + node.name, node
            continue
        inner = node.op.subgraph()
        if inner is None:
            continue
        for name in getattr(node.op, "names", None) or (node.name,):
            yield from shared_call_paths(inner, f"{prefix}{name}/")


def block_paths(graph: Graph, prefix: str = "") -> Iterator[tuple[str, Node]]:
    """Every block call with its path (the nodes ``layer_paths`` goes through)."""
    for node in graph.nodes:
        inner = node.op.subgraph()
        if inner is None or node.shares_weights:
            continue
        names = getattr(node.op, "names", None) or (node.name,)
        for name in names:
            yield prefix + name, node
            yield from block_paths(inner, f"{prefix}{name}/")


def select(graph: Graph, pattern: str | None = None, *, op: Any = None,
           where: Callable[[Any], bool] | None = None) -> list[str]:
    """See ``Graph.select``."""
    if pattern is not None and not isinstance(pattern, str):
        raise GraphError(f"select's pattern is a glob over paths (a str), got {type(pattern).__name__}")
    ops: tuple[str, ...] | None = None
    classes: tuple[type, ...] = ()
    if op is not None:
        given = tuple(op) if isinstance(op, (list, tuple, set, frozenset)) else (op,)
        classes = tuple(c for c in given if isinstance(c, type))
        ops = tuple(c for c in given if not isinstance(c, type))
        known = registered_ops()
        # a glob of op names ("quantized_*") stands for the registered names it matches
        ops = tuple(n for name in ops for n in (sorted(fnmatch.filter(known, name)) or [name]
                    if isinstance(name, str) and set(name) & set("*?[") else [name]))
        for name in ops:
            if not isinstance(name, str) or name not in known:
                close = difflib.get_close_matches(str(name), sorted(known), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise GraphError(f"select(op=...): {name!r} is no registered op name (\"linear\") "
                                 f"nor layer class (ops.Linear){hint}")
        for cls in classes:
            if not issubclass(cls, Layer):
                raise GraphError(f"select(op=...) takes a registered op name or a layer class "
                                 f"(ops.Linear), got the class {cls.__name__}, which is no layer")
    if where is not None and not callable(where):
        raise GraphError(f"select(where=...) takes a predicate on the layer, got {where!r}")
    matches = path_matcher(pattern) if pattern is not None else None
    found = []
    for path, node in layer_paths(graph):
        if matches is not None and not matches(path):
            continue
        if ops is not None and node.op.op_name not in ops and not isinstance(node.op, classes):
            continue
        if where is not None and not _where(where, path, node):
            continue
        found.append(path)
    return found


def _where(where: Callable[[Any], bool], path: str, node: Node) -> bool:
    try:
        return bool(where(node.op))
    except Exception as e:
        raise GraphError(
            f"select(where=...): the predicate raised {type(e).__name__} on layer {path!r} (op "
            f"{node.op.op_name}, {type(node.op).__name__}): {e}. It is called on every layer the "
            f"pattern and op= leave: narrow them (op=\"linear\") or read attributes with "
            f"getattr(layer, name, None)") from e


def resolve_selection(graph: Graph, selection: Any, action: str, calls: bool = False) -> list[str]:
    """The layer paths a selection names (a pattern, a path or a list of paths); an
    empty selection or a path that is not a layer is an error listing near names.
    With ``calls`` (surgery, which acts on calls), also a block's path and a further
    call of a layer (``wte@1``); a pattern that matches no layer matches those."""
    what = f"{action}({selection!r})"
    if isinstance(selection, str):
        items = [selection]
    elif isinstance(selection, (list, tuple)) and all(isinstance(s, str) for s in selection):
        items = list(selection)
    else:
        raise GraphError(f"{action} takes a path, a glob pattern or a list of paths "
                         f"(what select returns), got {selection!r}")
    if not items:
        raise GraphError(f"{what}: the selection is empty, so there is nothing to change; "
                         f"graph.select(...) lists the layers a pattern matches")
    known = [path for path, _ in layer_paths(graph)]
    known_set = set(known)
    views = _views(known)
    blocks = [path for path, _ in block_paths(graph)]
    others = blocks + [path for path, _ in shared_call_paths(graph)] if calls else []
    paths: list[str] = []
    for item in items:
        if is_pattern(item):
            matched = select(graph, item)
            if not matched and others:
                matches = path_matcher(item)
                matched = [path for path in others if matches(path)]
            if not matched:
                kind = "layer, block or call" if calls else "layer"
                matches = path_matcher(item)
                hint = next((f"; it matches blocks ({', '.join(b for b in blocks if matches(b))}): "
                             f"select their layers ({item.rstrip('/')}/*)"
                             for b in blocks if matches(b)), near_names(item, known + others))
                raise GraphError(f"{what}: pattern {item!r} matches no {kind} of graph "
                                 f"{graph.name!r}{hint}")
            paths.extend(matched)
        elif item in known_set or item in others:
            paths.append(item)
        elif item in views:
            paths.append(views[item])
        else:
            problem = (f"{item!r} is a block, not a layer: select its layers ({item}/*)"
                       if item in blocks else f"graph {graph.name!r} has no layer {item!r}")
            for call, node in shared_call_paths(graph):
                if item.startswith(call + "/"):  # inside a block called again: its layer's
                    owner = call[: len(call) - len(node.name)] + node.layer
                    problem += (f"; {call!r} calls block {owner!r} again, sharing its weights: "
                                f"its layers are named under {owner!r} ({owner}{item[len(call):]}), "
                                f"and a change there changes every call")
            raise GraphError(f"{what}: {problem}{near_names(item, known + others)}")
    return list(dict.fromkeys(paths))


def _views(paths: Sequence[str]) -> dict[str, str]:
    """Each path's ``module_view`` that differs from it and names no other path, to the
    path (``h.3/mlp/act`` -> ``h.3/mlp.act``)."""
    taken = set(paths)
    views = {module_view(path): path for path in paths}
    return {view: path for view, path in views.items() if view not in taken}


def surgery(graph: Graph, action: str, selection: Any, fn: Any) -> Graph:
    """``graph`` with ``action`` (``replace``, ``insert_after``, ``insert_before``,
    ``remove``) applied to the selected layers; see the ``Graph`` methods."""
    source = capture_source()
    if not isinstance(graph, Graph):
        raise GraphError(f"{action} works on a Graph, got {type(graph).__name__}")
    if action != "remove" and not callable(fn):
        raise GraphError(f"{action} takes a function building the new layers, got {fn!r}")
    graph = _unfold(graph)
    paths = resolve_selection(graph, selection, action, calls=True)
    targets = frozenset(tuple(path.split("/")) for path in paths)
    rule = _Surgery(action, fn, targets, source)
    where = f" at {source}" if source is not None else ""
    try:
        result = rewrite(rewrite(graph, rule, memo={}), _Promote())  # nothing kept after
    except MlaxGraphError as e:
        raise type(e)(f"{action}({selection!r}){where} breaks the graph:\n{e}") from None
    try:
        verify(result)
    except GraphError as e:
        untouched = _untouched_calls(graph, paths)
        if not untouched:
            raise
        raise GraphError(
            f"{action}({selection!r}){where}: {_calls_text(untouched)}, which {action} leaves "
            f"as {'it is' if len(untouched) == 1 else 'they are'}, and the new layer under that "
            f"name holds another op. Select the calls together "
            f"({sorted({*paths, *(c for c, _ in untouched)})!r}; the function gets each "
            f"call's inputs) or give the new layer a name of its own (name=...), which unties "
            f"the other calls from it\n{e}") from None
    return result


def _untouched_calls(graph: Graph, paths: list[str]) -> list[tuple[str, str]]:
    """(path, layer path) of the further calls of a selected layer not selected."""
    chosen = set(paths)
    found = []
    for path, node in shared_call_paths(graph):
        layer = path.rsplit("/", 1)[0] + "/" + node.layer if "/" in path else node.layer
        if layer in chosen and path not in chosen:
            found.append((path, layer))
    return found


def _calls_text(calls: list[tuple[str, str]]) -> str:
    return "; ".join(f"layer {layer!r} is also called as {path!r} (sharing its weights)"
                     for path, layer in calls)


def _unfold(graph: Graph) -> Graph:
    """Scans (a compiled graph's folded runs) back to their blocks: paths name blocks."""
    return unfold_scans(graph)


@dataclasses.dataclass(frozen=True)
class _Surgery(Rule):
    action: str
    fn: Any
    targets: frozenset[tuple[str, ...]]
    source: SourceInfo | None = dataclasses.field(compare=False, hash=False)
    #: the path of the block being rewritten: equal blocks are rewritten (and the
    #: user's function called) once each, not once for all (the rewriter's memo)
    block: tuple[str, ...] = ()

    def _hit(self, node: Node) -> bool:
        # a path names one call: a layer called again (a tied head, wte@1) by its own
        return (node.name,) in self.targets

    def nested(self, node: Node) -> Rule | None:
        inner = frozenset(t[1:] for t in self.targets
                          if len(t) > 1 and t[0] in (node.name, node.layer))
        return (_Surgery(self.action, self.fn, inner, self.source, (*self.block, node.name))
                if inner else None)

    def visit(self, node: Node, rewrite: Rewrite):
        if not self._hit(node):
            return None
        if self.action == "remove":
            return self._remove(node, rewrite)
        self._check_signature(node)
        if self.action == "insert_after":
            kept = rewrite.keep(node)
            outputs = [kept.value(i) for i in range(len(kept.outputs))]
            return _splice(rewrite, node, outputs, lambda *xs: self.fn(*xs), self.source,
                           what="insert_after's function")
        if self.action == "insert_before":
            new_inputs = _splice(rewrite, node, list(node.inputs), lambda *xs: self.fn(*xs),
                                 self.source, what="insert_before's function",
                                 count=len(node.inputs))
            return node.replace(inputs=tuple(new_inputs))
        layer = as_called(node.op, [rewrite.graph.spec(v) for v in node.inputs])
        return _splice(rewrite, node, list(node.inputs), lambda *xs: self.fn(layer, *xs),
                       self.source, what="replace's function", keep_name=True)

    def _check_signature(self, node: Node) -> None:
        names = [f"x{i}" if len(node.inputs) > 1 else "x" for i in range(len(node.inputs))]
        if self.action == "replace":
            count, form = 1 + len(node.inputs), f"fn(layer, {', '.join(names)})"
        elif self.action == "insert_before":
            count, form = len(node.inputs), f"fn({', '.join(names)})"
        else:
            count = len(node.outputs)
            form = "fn(y)" if count == 1 else f"fn({', '.join(f'y{i}' for i in range(count))})"
        problem = call_problem(self.fn, count)
        if problem is not None:
            path = "/".join((*self.block, node.name))
            raise GraphError(node_message(
                node.name, node.op.op_name,
                f"{self.action} calls its function as {form} at {path!r} (a layer of "
                f"{len(node.inputs)} input{'s' if len(node.inputs) != 1 else ''} and "
                f"{len(node.outputs)} output{'s' if len(node.outputs) != 1 else ''}), and "
                f"{problem}", source=self.source))

    def _remove(self, node: Node, rewrite: Rewrite):
        if len(node.inputs) > 1:
            ins = ", ".join(str(rewrite.spec(v)) for v in node.inputs)
            raise GraphError(node_message(
                node.name, node.op.op_name,
                f"remove takes out a layer of one input (its readers read that input), and "
                f"this one reads {len(node.inputs)}: removing it would drop the others and what "
                f"computes them. To keep {'them' if len(node.outputs) > 1 else 'one of them'}, "
                f"replace the layer: replace({'/'.join((*self.block, node.name))!r}, lambda "
                f"layer, *xs: xs{'' if len(node.outputs) > 1 else '[0]'})",
                got=f"inputs {ins}", source=self.source))
        if not node.inputs or len(node.outputs) != 1 or rewrite.spec(node.inputs[0]) != node.outputs[0]:
            ins = ", ".join(str(rewrite.spec(v)) for v in node.inputs) or "no inputs"
            raise ShapeError(node_message(
                node.name, node.op.op_name,
                "remove takes out a layer whose output has its first input's spec, and this "
                "one's differs; use replace to put something in its place",
                got=f"inputs {ins} -> outputs {', '.join(map(str, node.outputs))}",
                source=self.source))
        return (node.inputs[0],)


@dataclasses.dataclass(frozen=True)
class _Promote(Rule):
    """A layer's first call taken out, its next call takes the layer's name (``wte@1``
    becomes ``wte``): its weights keep their path, and it is listed and printed as a
    layer, as a graph built with that call alone."""

    def prepare(self, graph: Graph) -> dict[str, str]:
        names, first = {node.name for node in graph.nodes}, dict[str, str]()
        for node in graph.nodes:
            if node.shares_weights and node.layer not in names:
                first.setdefault(node.layer, node.name)
        return {call: layer for layer, call in first.items()}

    def visit(self, node: Node, rewrite: Rewrite):
        name = rewrite.data.get(node.name)
        return None if name is None else node.replace(name=name)


def _placeholders(specs: Sequence[TensorSpec]) -> list[SymbolicTensor]:
    tensors = []
    for i, spec in enumerate(specs):
        layer = InputLayer(spec.shape, spec.dtype, None, name=f"__surgery_input_{i}")
        call = Call(layer, (), (spec,), None)
        tensors.append(SymbolicTensor(spec, call, 0))
    return tensors


def _splice(rewrite: Rewrite, old: Node, values: list[Value], build: Callable,
            source: SourceInfo | None, *, what: str, keep_name: bool = False,
            count: int | None = None) -> list[Value]:
    """Calls ``build`` on symbolic tensors standing for ``values``, adds the layers it
    made to the graph being rewritten (names made unique; a layer the user named keeps
    its name where it is free), and returns the values standing for its results."""
    specs = [rewrite.spec(v) for v in values]
    tensors = _placeholders(specs)
    try:
        result = build(*tensors)
    except TypeError as e:
        if "SymbolicTensor" not in str(e):
            raise
        raise GraphError(node_message(
            old.name, old.op.op_name,
            f"{what} got symbolic tensors, which hold no data: build with layers "
            f"(ops.tanh(x), ops.Linear(8)(x)) or wrap array code as one (ops.F(fn)(x)); "
            f"jax.numpy functions take arrays ({e})", source=source)) from None
    outs = result if isinstance(result, (tuple, list)) else (result,)
    want = len(old.outputs) if count is None else count
    if len(outs) != want or not all(isinstance(t, SymbolicTensor) for t in outs):
        got = ", ".join(type(t).__name__ for t in outs)
        raise GraphError(node_message(
            old.name, old.op.op_name,
            f"{what} must return {want} symbolic tensor{'s' if want != 1 else ''} "
            f"(made by layers called on the tensors it gets), got {got}", source=source))
    try:
        nodes, input_names, output_values = trace_graph(tensors, list(outs))
    except GraphError as e:
        if "is not in the graph's inputs" not in str(e):
            raise
        raise GraphError(node_message(
            old.name, old.op.op_name, f"{what} read a tensor it was not given ("
            f"{str(e).split(', which is not', 1)[0].removeprefix('the outputs depend on ')}): "
            f"build its result from the tensors it gets alone", source=source)) from None
    mapping: dict[Value, Value] = {Value(name, 0): v for name, v in zip(input_names, values)}
    names: dict[str, str] = {}
    layers: dict[str, str] = {}  # a traced call of the old layer -> the weights it uses
    produced = {v.node for v in output_values}
    for node in nodes:
        if node.name in input_names:
            continue
        if node.op is old.op and not node.shares_weights:
            # the old layer called again keeps its name and weights (a further call,
            # wte@1, those of the layer it calls again)
            new_name = old.name
            layers[node.name] = old.layer
            rewrite.names.add(new_name)
        elif (keep_name and node.op.name in (None, old.name) and node.name in produced
              and len(produced) == 1 and old.name not in names.values()):
            # the layer in its place takes its name (also when named so: it is free)
            new_name = old.name
        else:
            new_name = rewrite.fresh(node.name) if node.name in rewrite.names else node.name
            rewrite.names.add(new_name)
        names[node.name] = new_name
        layer = layers.get(node.layer) or names.get(node.layer, node.layer)
        inputs = tuple(mapping.get(v, v) for v in node.inputs)
        emitted = rewrite.emit(Node(new_name, node.op, inputs, node.outputs, layer,
                                    node.source or source))
        for i in range(len(emitted.outputs)):
            mapping[Value(node.name, i)] = emitted.value(i)
    return [mapping.get(v, v) for v in output_values]

