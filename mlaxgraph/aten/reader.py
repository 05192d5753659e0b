"""A torch program record (``mlaxgraph.aten.program``) as a typed graph: each module
call a nested block named by its path relative to its parent (``layer1`` >> ``0`` >>
``conv1``; ``transformer`` >> ``h.3`` >> ``attn``), the calls of ``nn.Linear``,
``nn.Conv2d``, norms and ``nn.Embedding`` as mlaxgraph's layers (``layers.py``) under
the module's name, so the weights' paths joined by dots are the state-dict names;
every other ATen operator a layer of the ``aten`` family; parameters read directly
as ``param`` layers, buffers as ``aten.buffer`` state (the non-persistent ones and
lifted constants as values the layer holds)."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..core.errors import DTypeError, GraphError, MlaxGraphError, ShapeError
from ..core.specs import as_dim
from ..ir.graph import Graph, Input
from ..ir.outline import Scope, Step, outline
from ..ops.foreign import encode_array
from ..ops.param import Param
from . import ops_nn, ops_pool, ops_random, ops_recurrent, ops_resize, ops_table, ops_tensor  # noqa: F401
from .layer import TABLE, TENSOR, Buffer, Mode, op_class
from .layers import match_layer, trains
from .ops_table import dtype_of
from .updates import buffer_updates, live_nodes

__all__ = ["read_program"]

_WEIGHT_KINDS = ("parameter",)
_SYM_OPS: dict[str, Any] = {
    "aten.sym_size.int": None,
    "<built-in function mul>": lambda a, b: a * b, "<built-in function add>": lambda a, b: a + b,
    "<built-in function sub>": lambda a, b: a - b, "<built-in function floordiv>": lambda a, b: a // b,
}
_STATE_KINDS = ("buffer", "constant_tensor")


def _safe(name: str) -> str:
    return re.sub(r"[/#\s]", "_", name) or "x"


def _dim(d: Any, where: str) -> Any:
    if isinstance(d, int):
        return d
    if isinstance(d, dict) and "sym" in d:
        expr = str(d["sym"])
        if re.search(r"\bu\d+", expr):
            raise ShapeError(f"{where}: a size that depends on the data ({expr}); mlaxgraph's "
                             f"graphs have shapes known from the input shapes")
        try:
            return as_dim(expr)
        except MlaxGraphError:
            raise ShapeError(f"{where}: the symbolic size {expr!r} is not one mlaxgraph "
                             f"can write (sums and products of dims)") from None
    raise GraphError(f"{where}: a dim {d!r} is neither an int nor a symbolic size")


class _Reader:
    def __init__(self, record: dict, tensors: dict):
        self.record, self.tensors = record, tensors
        self.inputs = {i["name"]: i for i in record["inputs"]}
        self.alias: dict[str, tuple] = {}
        self.params: dict[str, Any] = {}
        self.state: dict[str, Any] = {}
        self.steps: list[Step] = []
        self.layers: dict[tuple, Any] = {}
        self.made: dict[str, tuple] = {}   # placeholder -> the key of its layer's output
        self.uses: dict[str, int] = {}
        self.symbols: dict[str, Any] = {}  # size computations: node -> its dim
        self.shapes: dict[Hashable, tuple] = {}
        self.dissolved: set[str] = set()  # modules that are one of our layers
        self.training = False  # the program's mode (calls in another mode are no layers)

    # --- values ----------------------------------------------------------------------

    def key(self, ref: str) -> tuple:
        return self.alias.get(ref, (ref, 0))
    def placeholder(self, arg: Any, kinds: tuple) -> str | None:
        if isinstance(arg, dict) and "ref" in arg:
            entry = self.inputs.get(arg["ref"])
            if entry is not None and entry["kind"] in kinds and entry.get("target") in self.tensors:
                return entry["target"]
        return None

    def shape_of(self, arg: Any) -> tuple:
        return tuple(self.inputs[arg["ref"]]["shape"])

    # --- scopes ----------------------------------------------------------------------

    def scopes(self, stack: list, within: str | None = None) -> tuple[tuple[Scope, ...], str]:
        """The stack as scopes, each named relative to its parent, and the path of the
        innermost; with ``within``, only the modules that hold it (the scopes its
        weights sit under). A module that is itself one of our layers (a LayerNorm2d
        permuting around its norm) is no scope: its other operations sit beside it."""
        out, parent = [], ""
        for path, kind in stack:
            if within is not None and not within.startswith(path + "."):
                break
            if path in self.dissolved:
                continue
            out.append(Scope(self.relative(parent, path), _safe(kind)))
            parent = path
        return tuple(out), parent

    @staticmethod
    def relative(parent: str, path: str) -> str:
        return _safe(path[len(parent) + 1:] if parent and path.startswith(parent + ".") else path)

    def layer(self, scopes: tuple, name: str | None, make: Any) -> Any:
        """One layer object per (scope, name) and hyperparameters: a module called
        again in the same scope calls the same layer (its weights shared)."""
        if name is None:
            return make(None)
        where = tuple(s.name for s in scopes)
        base, n = name, 1
        while True:
            layer = make(name)
            known = self.layers.get((where, name))
            if known is None:
                self.layers[(where, name)] = layer
                return layer
            if known == layer:
                return known
            name, n = f"{base}_{n}", n + 1

    # --- steps -----------------------------------------------------------------------

    def weight_step(self, target: str, kind: str, placeholder: str, stack: list, where: str) -> tuple:
        """A ``param`` (or ``aten.buffer``) layer reading ``target``, in the deepest scope
        that holds its module."""
        if placeholder in self.made:
            return self.made[placeholder]
        scopes, parent = self.scopes(stack, target)
        if scopes and parent == (stack[-1][0] if stack else None) and self.uses.get(parent, 0) == 1:
            # a module of one operation is that operation's layer in its parent's scope
            # (node()): its weights sit beside it, named <module>.<weight>
            scopes, parent = self.scopes(stack, parent)
        name = self.relative(parent, target)
        array = self.tensors[target]
        key = (f"{placeholder}", 0)
        make: Any
        store: dict[str, Any] | None
        if kind in _WEIGHT_KINDS and jnp.issubdtype(array.dtype, jnp.floating):
            make = lambda n: Param(array.shape, name=n)  # noqa: E731
            store = self.params
        else:
            dtype = jnp.dtype(dtype_of(array.dtype.name, array.dtype)).name
            # not in the module's state_dict(): a value of the graph, not state
            constant = kind == "constant_tensor" or \
                self.inputs.get(placeholder, {}).get("persistent") is False
            value = encode_array(_buffer_value(array, target)) if constant else ()
            make = lambda n: Buffer(tuple(int(d) for d in array.shape), dtype, value,  # noqa: E731
                                    name=n)
            store = None if constant else self.state
        layer = self.layer(scopes, name, make)
        if store is not None:
            self.put(store, scopes, layer.name, {"value": array if store is self.params else
                                                 _buffer_value(array, target)})
        self.steps.append(Step(scopes, (), (key,), lambda layer=layer: (layer(),)))
        self.made[placeholder] = key
        return key

    def read_key(self, arg: dict, stack: list, where: str) -> tuple:
        """The key of a tensor argument; a parameter or buffer gets its layer first."""
        entry = self.inputs.get(arg["ref"])
        if entry is not None and entry["kind"] in _WEIGHT_KINDS + _STATE_KINDS:
            if entry.get("target") not in self.tensors:
                raise GraphError(f"{where}: the program holds no tensor {entry.get('target')!r}")
            return self.weight_step(entry["target"], entry["kind"], arg["ref"], stack, where)
        return self.key(arg["ref"])

    def put(self, store: dict, scopes: tuple, name: str, values: dict) -> None:
        node = store
        for s in scopes:
            node = node.setdefault(s.name, {})
        node.setdefault(name, {}).update({k: jnp.asarray(v) for k, v in values.items()})

    def node(self, node: dict) -> None:
        target, name, stack = node["target"], node["name"], node["stack"]
        module = stack[-1][0] if stack else "(the top module)"
        where = f"node {name!r} ({target}) in module {module}"
        for i, out in enumerate(node["outputs"]):
            if isinstance(out, dict) and "shape" in out:
                self.shapes[(name, i)] = tuple(_dim(d, where) for d in out["shape"])
        if target in _SYM_OPS:
            self.sym_node(node, where)
            return
        if target == "getitem":
            source, index = node["args"]
            self.alias[name] = (self.key(source["ref"])[0], int(index))
            return
        args, kwargs = node["args"], node["kwargs"]
        found = self.match(node)
        if found is not None and found.owner is not None:
            self.layer_step(node, found, stack, where)
            return
        if target not in TABLE and found is None:
            at = "".join(f" ({line.strip()})" for line in node.get("source") or [])
            raise GraphError(f"{where}{at}: the ATen operator {target} is not supported; "
                             f"mg.aten.supported_ops() lists those that are")
        # tensors: the node's references, in order of appearance
        refs: list[tuple] = []

        def encode(value: Any) -> Any:
            if isinstance(value, dict):
                if "ref" in value and value["ref"] in self.symbols:
                    return self.symbols[value["ref"]]
                if "ref" in value:
                    refs.append(self.read_key(value, stack, where))
                    return (TENSOR, len(refs) - 1)
                if "dtype" in value:
                    return str(value["dtype"])
                if "sym" in value:
                    return _dim(value, where)
                if "float" in value:
                    return float(value["float"])
                raise GraphError(f"{where}: an argument {value!r} this reader does not know")
            if isinstance(value, list):
                return tuple(encode(v) for v in value)
            return value

        enc_args = tuple(encode(a) for a in args)
        enc_kwargs = tuple(sorted((k, encode(v)) for k, v in kwargs.items()))
        n_out = len(node["outputs"]) if found is None else 1  # a dropout's mask is not kept
        cls = op_class(target)
        (scopes, innermost), layer_name = self.scopes(stack), None
        if found is not None:  # weightless layer of ours (dropout)
            layer_make: Any = lambda n: found.layer(n)  # noqa: E731
            reads: tuple = (refs[0],)
        else:
            layer_make = lambda n: cls(args=enc_args, kwargs=enc_kwargs, name=n)  # noqa: E731
            reads = tuple(refs)
        if stack and innermost == stack[-1][0] and self.uses.get(innermost, 0) == 1:
            scopes, layer_name = scopes[:-1], scopes[-1].name  # a module of one operation
        try:
            layer = self.layer(scopes, layer_name, layer_make)
        except MlaxGraphError as e:
            raise type(e)(f"{where}: {e}") from None

        def build(*tensors, layer=layer, where=where):
            try:
                out = layer(*tensors)
            except MlaxGraphError as e:
                raise type(e)(f"{where}: {e}") from None
            return out if isinstance(out, tuple) else (out,)
        self.steps.append(Step(scopes, reads, tuple((name, i) for i in range(n_out)), build))

    def sym_node(self, node: dict, where: str) -> None:
        """A size computed from a tensor's shape (``aten.sym_size.int``) or from other
        sizes: known when the graph is built, kept as a (symbolic) dim."""
        def value(a: Any) -> Any:
            if isinstance(a, dict) and "ref" in a:
                if a["ref"] in self.symbols:
                    return self.symbols[a["ref"]]
                raise GraphError(f"{where}: a size computed from tensor values; mlaxgraph's "
                                 f"graphs have shapes known from the input shapes")
            return _dim(a, where) if isinstance(a, dict) else a
        args = node["args"]
        if node["target"] == "aten.sym_size.int":
            ref = args[0]["ref"]
            shape = self.shapes.get(self.key(ref))
            if shape is None:
                raise GraphError(f"{where}: the size of {ref!r}, whose shape is not known")
            self.symbols[node["name"]] = shape[int(args[1])]
            return
        self.symbols[node["name"]] = _SYM_OPS[node["target"]](value(args[0]), value(args[1]))

    def match(self, node: dict) -> Any:
        found = match_layer(node["target"], node["args"], node["kwargs"],
                            lambda a, any_kind=False: self.placeholder(
                                a, _WEIGHT_KINDS + (_STATE_KINDS if any_kind else ())),
                            self.shape_of, self.training)
        if found is not None and found.owner == "":
            return None  # the top module's own weights: read directly, named as its state dict
        return found

    @staticmethod
    def owner(found: Any, stack: list) -> str:
        """The module a layer is named after: its weights' module, or (for a weight of
        another module: a head reading the embedding's table) the module calling it,
        which holds a copy under its own name, as its state dict does."""
        owner = found.owner
        if stack and owner not in {path for path, _ in stack} and \
                not owner.startswith(stack[-1][0] + "."):
            owner = stack[-1][0]
        return owner

    def layer_step(self, node: dict, found: Any, stack: list, where: str) -> None:
        owner = self.owner(found, stack)
        scopes, parent = self.scopes(stack, owner)
        layer = self.layer(scopes, self.relative(parent, owner), found.layer)
        params = {k: found.convert.get(k, lambda a: a)(self.tensors[t]) for k, t in found.params.items()}
        if params:
            self.put(self.params, scopes, layer.name, params)
        if found.state:
            self.put(self.state, scopes, layer.name, {k: self.tensors[t] for k, t in found.state.items()})
        x = self.read_key(found.input, stack, where)

        def build(t, layer=layer, where=where):
            try:
                return (layer(t),)
            except MlaxGraphError as e:
                raise type(e)(f"{where}: {e}") from None
        # a batch norm's further outputs (saved statistics) are read by nothing kept
        self.steps.append(Step(scopes, (x,), ((node["name"], 0),), build))

    # --- the whole program -------------------------------------------------------------

    def update_steps(self, outputs: list, updates: dict) -> list:
        """Each updated buffer's new value written to its layer's state: the layer called
        again with the first output (which it passes on, so the call is kept) and the
        value. Its layers sit at the top (named by the buffer's path), read first."""
        if updates and not outputs:
            raise GraphError("a module that updates its buffers returns nothing: return a tensor")
        for node_name, placeholder in updates.items():
            layer = self.layers[((), _safe(self.inputs[placeholder]["target"]))]
            new = (f"{placeholder}__update", 0)
            self.steps.append(Step((), (outputs[0], self.key(node_name)), (new,),
                                   lambda c, v, layer=layer: (layer(c, v),)))
            outputs = [new] + outputs[1:]
        return outputs

    def mode_step(self, inputs: dict, training: bool) -> None:
        """The program's mode as a ``Mode`` layer on its first input (which every
        reader of that input reads through)."""
        if not inputs:
            return
        first = next(iter(inputs))
        key = (f"{first[0]}__mode", 0)
        layer = Mode(training)
        self.steps.append(Step((), (first,), (key,), lambda x, layer=layer: (layer(x),)))
        self.alias[first[0]] = key
        self.shapes[key] = self.shapes[first]

    def read(self, name: str) -> tuple[Graph, dict, dict]:
        record = self.record
        inputs: dict[Hashable, Any] = {}
        for entry in record["inputs"]:
            if entry["kind"] == "user_input":
                where = f"input {entry['name']!r}"
                shape = tuple(_dim(d, where) for d in entry["shape"])
                dtype = dtype_of(entry["dtype"])
                if dtype is None:
                    raise GraphError(f"{where} is a {entry['dtype']} tensor; mlaxgraph reads "
                                     f"float, int and bool inputs")
                inputs[(entry["name"], 0)] = Input(shape, dtype, name=_safe(entry["name"]))
                self.shapes[(entry["name"], 0)] = shape
            elif entry["kind"] not in _WEIGHT_KINDS + _STATE_KINDS + ("token",):
                raise GraphError(f"input {entry['name']!r} of kind {entry['kind']} is not supported")
        self.training = bool(record.get("training", False)) or trains(record["nodes"])
        updates = buffer_updates(record, lambda n: getattr(self.match(n), "owner", None) is not None)
        nodes = live_nodes(record, updates)
        self.mode_step(inputs, self.training)
        for placeholder in updates.values():  # updated buffers: read at the top, first
            self.weight_step(self.inputs[placeholder]["target"], "buffer", placeholder, [], "")
        self.uses = {}
        run: list = [None, 0]
        for n in nodes:  # the longest run of operations of each module call
            if n["target"] == "getitem":
                continue
            leaf = n["stack"][-1][0] if n["stack"] else None
            for path, _ in n["stack"][:-1]:
                self.uses[path] = 2  # it calls modules: a block
            run = [leaf, run[1] + 1 if run[0] == leaf else 1]
            if leaf is not None:
                self.uses[leaf] = max(self.uses.get(leaf, 0), run[1])
        for n in nodes:
            found = self.match(n) if n["target"] != "getitem" else None
            if found is not None and found.owner is not None:
                owner = self.owner(found, n["stack"])
                if owner in {path for path, _ in n["stack"]}:
                    self.dissolved.add(owner)
        for n in nodes:
            self.node(n)
        outputs = []
        for i in record["user_outputs"]:
            out = record["outputs"][i]
            if not (isinstance(out, dict) and "ref" in out):
                raise GraphError(f"output {i} of the program is {out!r}; mlaxgraph reads "
                                 f"tensor outputs")
            if out["ref"] in self.inputs and self.inputs[out["ref"]]["kind"] != "user_input":
                entry = self.inputs[out["ref"]]
                outputs.append(self.weight_step(entry["target"], entry["kind"], out["ref"], [], ""))
            else:
                outputs.append(self.key(out["ref"]))
        graph = outline(inputs, self.steps, self.update_steps(outputs, updates), name=name)
        return graph, self.params, self.state


def _buffer_value(array: np.ndarray, target: str) -> np.ndarray:
    """A buffer's value as its layer stores it: a float one in float32 (as weights are),
    an integer or boolean one in its own dtype, 64-bit narrowed to 32 unless
    ``jax_enable_x64`` is on (a value 32 bits cannot hold is an error, not wrapped)."""
    if jnp.issubdtype(array.dtype, jnp.floating):
        return np.asarray(array, np.float32)
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(array.dtype))
    if dtype != array.dtype and array.size and jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise DTypeError(f"buffer {target!r} holds {array.dtype} values outside {dtype}'s "
                             f"range (up to {array.max()}); without jax_enable_x64 JAX computes "
                             f"in 32 bits: enable it (jax.config.update('jax_enable_x64', True)) "
                             f"before from_torch")
    return array.astype(dtype)


def read_program(record: dict, tensors: dict, name: str = "torch") -> tuple[Graph, dict, dict]:
    """``(graph, params, state)`` of a checked program record and its tensors."""
    return _Reader(record, tensors).read(_safe(name))
