"""A ``torch.export`` program as mlaxgraph's torch program record (a JSON-ready dict)
and its tensors as NumPy arrays: the one place that imports torch (lazily, inside
``capture``), so the rest of the importer and its files need none."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..core.errors import ConfigError, GraphError
from .layers import trains
from .program import FORMAT, VERSION

__all__ = ["capture", "require_torch"]


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("mg.from_torch on a module or ExportedProgram needs PyTorch: "
                          "pip install mlaxgraph[torch] (files written by "
                          "mg.aten.save_program load without it)") from None
    return torch


_NAMES: dict[str, str] = {}  # torch's symbols -> the user's Dim names, while capturing


def _dim(d: Any) -> Any:
    if isinstance(d, (int, np.integer)):
        return int(d)
    text = str(d).replace(" ", "")
    if _NAMES:
        text = re.sub(r"\b[su]\d+\b", lambda m: _NAMES.get(m.group(0), m.group(0)), text)
    try:
        return int(text)
    except ValueError:
        return {"sym": text}


def _dim_names(program: Any, dynamic_shapes: Any) -> dict[str, str]:
    """torch's symbol of each user input dim given as a named ``torch.export.Dim``."""
    if dynamic_shapes is None:
        return {}
    specs = list(dynamic_shapes.values()) if isinstance(dynamic_shapes, dict) else list(dynamic_shapes)
    users = [n for n in program.graph.nodes if n.op == "placeholder"
             and n.name in {s.arg.name for s in program.graph_signature.input_specs
                            if s.kind.name.lower() == "user_input"}]
    names = {}
    for node, spec in zip(users, specs):
        dims = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        shape = getattr(node.meta.get("val"), "shape", ())
        for i, dim in dims:
            name = getattr(dim, "__name__", None)
            if name and i < len(shape) and not isinstance(shape[i], int):
                names[str(shape[i])] = re.sub(r"\W", "_", name)
    return names


def _spec(value: Any) -> dict | None:
    torch = require_torch()
    if isinstance(value, torch.Tensor):
        return {"shape": [_dim(d) for d in value.shape], "dtype": str(value.dtype).replace("torch.", "")}
    return None


def _arg(value: Any, ref: Any = None) -> Any:
    """A node's argument as the record writes it; ``ref(node)`` the record of a node
    it reads (``{"ref": name}`` unless given)."""
    torch = require_torch()
    if isinstance(value, torch.fx.Node):
        return ref(value) if ref is not None else {"ref": value.name}
    if isinstance(value, (list, tuple)):
        return [_arg(v, ref) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return None
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _dim(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and not np.isfinite(value):
            return {"float": str(value)}
        return value
    raise GraphError(f"an argument of type {type(value).__name__} is not supported: {value!r}")


def _target(node: Any) -> str:
    import operator

    if node.target is operator.getitem:
        return "getitem"
    return str(node.target)


def capture(program: Any, dynamic_shapes: Any = None) -> tuple[dict, dict[str, np.ndarray]]:
    """``(record, tensors)`` of an ``ExportedProgram``: the record as
    ``mlaxgraph.aten.program`` documents it, the tensors its parameters, buffers and
    constants by their state-dict names. Symbolic dims take the names of the
    ``torch.export.Dim``s in ``dynamic_shapes`` (torch's own, ``s0``, otherwise)."""
    _NAMES.clear()
    _NAMES.update(_dim_names(program, dynamic_shapes))
    try:
        return _capture(program)
    finally:
        _NAMES.clear()


def _writes_in_place(program: Any) -> bool:
    """Whether an operator writes into a tensor the program computes (``fill_`` on a
    slice of a mask): such programs are made functional first (``slice_scatter``)."""
    for node in program.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith("aten."):
            continue
        op = str(node.target).split(".")[1]
        if op.endswith("_") and not op.endswith("__") and node.args and \
                getattr(node.args[0], "op", None) != "placeholder":
            return True
    return False


#: Higher-order operators whose body runs as is (inlined): the position of the body.
_WRAPS = {"wrap_with_set_grad_enabled": 1, "wrap_with_autocast": 4}


class _Body:
    """A graph's call_function nodes as records, appended to ``nodes``; the bodies of
    the wrappers torch.export leaves around ``torch.no_grad()`` and ``torch.autocast``
    blocks (``wrap_with_set_grad_enabled``) inlined, their nodes named
    ``<wrapper>_<node>`` and in the wrapper's module."""

    def __init__(self, module: Any, nodes: list):
        self.module = module
        self.nodes = nodes
        self.alias: dict[str, Any] = {}  # a node's full name -> the record it stands for
        self.results: dict[str, list] = {}  # a wrapper's full name -> its outputs' records

    def read(self, graph: Any, prefix: str, stack: dict) -> list:
        """The records of the graph's outputs (the placeholders of a body are aliased
        beforehand)."""
        def ref(n: Any) -> Any:
            return self.alias.get(prefix + n.name, {"ref": prefix + n.name})

        outputs: list = []
        for node in graph.nodes:
            if node.op == "call_function":
                wrap = _WRAPS.get(str(node.target))
                if wrap is not None:
                    self.inline(node, wrap, prefix, ref)
                elif str(node.target) == "cond":
                    self.cond(node, prefix, ref, node.meta.get("nn_module_stack") or stack)
                elif _target(node) == "getitem" and prefix + node.args[0].name in self.results:
                    self.alias[prefix + node.name] = self.results[prefix + node.args[0].name][node.args[1]]
                else:
                    self.node(node, prefix, ref, node.meta.get("nn_module_stack") or stack)
            elif node.op == "output":
                outputs = [_arg(a, ref) for a in node.args[0]]
            elif node.op == "placeholder":
                continue  # the program's inputs (read above), a body's (aliased)
            elif node.op == "get_attr" and all(str(u.target) in _WRAPS or str(u.target) == "cond"
                                               for u in node.users):
                continue  # a wrapper's body, read where the wrapper is called
            else:
                raise GraphError(f"node {node.name!r}: {node.op} nodes are not supported "
                                 f"(torch.export gives placeholders, call_function and output)")
        return outputs

    def inline(self, node: Any, position: int, prefix: str, ref: Any,
               operands: Any = None, inner: str = "") -> list:
        body = getattr(self.module, node.args[position].target)
        inner = inner or f"{prefix}{node.name}_"
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        for p, a in zip(placeholders, node.args[position + 1:] if operands is None else operands):
            self.alias[inner + p.name] = _arg(a, ref)
        outputs = self.read(body.graph, inner, node.meta.get("nn_module_stack") or {})
        self.results[prefix + node.name] = outputs
        return outputs

    def cond(self, node: Any, prefix: str, ref: Any, stack: dict) -> None:
        """``torch.cond(pred, true_fn, false_fn, operands)``: both branches computed (their
        nodes named ``<cond>_true_<node>``, ``<cond>_false_<node>``), each output the
        branch ``pred`` picks (``aten.where.self``)."""
        name = prefix + node.name
        chosen = [self.inline(node, i, prefix, ref, node.args[3], f"{name}_{branch}_")
                  for i, branch in ((1, "true"), (2, "false"))]
        vals = node.meta.get("val") or ()
        results = []
        for i, (a, b) in enumerate(zip(*chosen)):
            self.nodes.append({"name": f"{name}_{i}", "target": "aten.where.self",
                               "args": [_arg(node.args[0], ref), a, b], "kwargs": {},
                               "outputs": [_spec(vals[i] if i < len(vals) else None)],
                               "stack": _stack(stack), "source": _source(node)})
            results.append({"ref": f"{name}_{i}"})
        self.results[name] = results

    def node(self, node: Any, prefix: str, ref: Any, stack: dict) -> None:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        self.nodes.append({
            "name": prefix + node.name, "target": _target(node),
            "args": [_arg(a, ref) for a in node.args],
            "kwargs": {k: _arg(v, ref) for k, v in node.kwargs.items()},
            "outputs": [_spec(v) for v in vals],
            "stack": _stack(stack), "source": _source(node),
        })


def _stack(stack: dict) -> list:
    return [[path, getattr(kind, "__name__", str(kind)).rpartition(".")[2]]
            for path, kind in stack.values() if path and not path.startswith("_empty_nn_module_stack")]


def _source(node: Any) -> list:
    """The user's line a node comes from (``File "...", line 5, in forward``: the
    innermost frame outside torch's own modules), as a list."""
    import os

    frames = [line.strip() for line in (node.meta.get("stack_trace") or "").splitlines()
              if line.strip().startswith('File "')]
    own = [f for f in frames if f"{os.sep}torch{os.sep}" not in f]
    return (own or frames)[-1:]


def _bound(value: Any) -> int | None:
    """A range bound of a symbolic dim as an int, or None for an unbounded one: a
    ``Dim`` without ``max`` has torch's ``int_oo``, which sympy calls finite."""
    if isinstance(value, (int, np.integer)) or getattr(value, "is_Integer", False):
        return int(value)
    return None


_VIEWS = {"slice", "select", "view", "unsqueeze", "squeeze", "transpose", "permute", "expand",
          "alias", "narrow", "diagonal", "as_strided", "t", "unflatten", "flatten"}


def _in_place(node: Any) -> bool:
    if node.op != "call_function" or not str(node.target).startswith("aten."):
        return False
    op = str(node.target).split(".")[1]
    return op.endswith("_") and not op.endswith("__")


def _updated_buffers(program: Any) -> list[str]:
    """The buffers the program writes (``self.count += 1``, ``self.ema.mul_(0.9)``) that no
    layer of ours keeps (a BatchNorm's running statistics and its ``num_batches_tracked``
    are left out): such a program is made functional, its updates read as new state."""
    buffers = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
               if spec.kind.name.lower() == "buffer"}
    nodes = {n.name: n for n in program.graph.nodes}
    written = []
    for node in program.graph.nodes:  # in place, as torch.export writes a module's updates
        if _in_place(node) and node.args:
            source = node.args[0]  # through in-place results and views to what they write
            while getattr(source, "op", None) == "call_function" and source.args and (
                    _in_place(source) or str(source.target).split(".")[1] in _VIEWS):
                source = source.args[0]
            if getattr(source, "op", None) == "placeholder" and source.name in buffers:
                written.append(buffers[source.name])
    for spec in program.graph_signature.output_specs:  # made functional: the new values
        if spec.kind.name.lower() == "buffer_mutation":
            made = nodes.get(spec.arg.name)
            while made is not None and _target(made) == "getitem":
                made = made.args[0]
            if made is None or "batch_norm" not in str(made.target):
                written.append(spec.target)
    return sorted({t for t in written if t.rpartition(".")[2] != "num_batches_tracked"})


def _top_batch_norm_trains(program: Any) -> bool:
    """Whether the top module's own BatchNorm (a bare ``nn.BatchNorm2d``, read as the
    ATen operator) trains: made functional, its statistics' updates are the program's."""
    buffers = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
               if spec.kind.name.lower() == "buffer"}
    return any(str(n.target) == "aten.batch_norm.default" and len(n.args) > 5 and n.args[5] is True
               and "." not in buffers.get(getattr(n.args[3], "name", ""), ".")
               for n in program.graph.nodes if n.op == "call_function")


def _capture(program: Any) -> tuple[dict, dict[str, np.ndarray]]:
    torch = require_torch()
    if _updated_buffers(program) or _writes_in_place(program) or _top_batch_norm_trains(program):
        program = program.run_decompositions({})  # functional: buffer updates as outputs
    sig = program.graph_signature
    kinds: dict[str, tuple[str, str | None]] = {}
    transient = set()  # buffers registered with persistent=False: not in the state dict
    for spec in sig.input_specs:
        name = getattr(spec.arg, "name", None)
        kinds[str(name)] = (spec.kind.name.lower(), spec.target)
        if getattr(spec, "persistent", None) is False:
            transient.add(str(name))
    inputs: list[dict] = []
    nodes: list[dict] = []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            kind, target = kinds.get(node.name, ("user_input", None))
            if kind == "user_input" and _spec(node.meta.get("val")) is None:
                raise GraphError(
                    f"input {node.name!r} of the module is {node.meta.get('val')!r}, not a tensor: "
                    f"torch.export fixes a None or a number given among the example inputs, and "
                    f"mlaxgraph's graphs take tensors; pass a tensor, or fix the value in a "
                    f"wrapper module whose forward calls the module with it")
            inputs.append({"name": node.name, "kind": kind, "target": target,
                           **({"persistent": False} if node.name in transient else {}),
                           **(_spec(node.meta.get("val")) or {})})
    outputs = _Body(program.graph_module, nodes).read(program.graph, "", {})
    mutations = {o.arg.name: o.target for o in sig.output_specs
                 if o.kind.name.lower() == "buffer_mutation"}
    user_outputs = [i for i, o in enumerate(sig.output_specs) if o.kind.name.lower() == "user_output"]
    ranges = {}
    for symbol, r in program.range_constraints.items():
        ranges[_NAMES.get(str(symbol), str(symbol))] = [_bound(r.lower) or 0, _bound(r.upper)]
    record = {"format": FORMAT, "version": VERSION, "torch": torch.__version__,
              "training": trains(nodes), "inputs": inputs, "nodes": nodes,
              "outputs": outputs, "user_outputs": user_outputs, "mutations": mutations,
              "dims": ranges}
    tensors: dict[str, np.ndarray] = {}
    for source in (program.state_dict, program.constants):
        for name, t in source.items():
            if isinstance(t, torch.Tensor):
                if t.is_meta:
                    raise GraphError(f"the module's tensor {name!r} is on the meta device (it has "
                                     f"no values): materialize the module first (module.to_empty("
                                     f"device='cpu') then load_state_dict(...) of its weights)")
                t = t.detach().cpu()
                if t.dtype == torch.bfloat16:
                    t = t.float()
                tensors[name] = t.numpy().copy()
    return record, tensors
