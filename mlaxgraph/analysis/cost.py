"""The per-layer cost table: params, FLOPs (forward, and forward plus backward) and
activation bytes of each layer, from the specs of the compiled graph at the policy's
dtypes, as formulas of the symbolic dims evaluated for given ones, next to XLA's own
count of each layer.

The FLOP rules live with the ops (``Layer.flops``; conventions in ``ops/flops.py``).
The cross-check lowers each layer's ``apply`` alone, unoptimized, at the given dims,
and reads ``cost_analysis()["flops"]``, the number XLA's ``HloCostAnalysis`` gives.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from ..compiler.policy import Policy
from ..compiler.program import get_in
from ..compiler.stages import dim_values, lower
from ..core.errors import GraphError, ShapeError
from ..core.specs import Dim, bind_dims, flatten_specs, is_symbolic, shape_str
from ..ops.flops import size

__all__ = ["LayerCost", "CostTable", "cost_table", "step_formulas", "evaluate", "TOLERANCE"]

#: Relative difference from XLA's count beyond which a row gets a note.
TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One layer's row of a ``CostTable``.

    Attributes:
      layer: the layer's path (``block/layer`` inside nested blocks).
      op: its op name.
      params: its trainable weights (0 for a call sharing another's weights).
      state: its non-trainable weights.
      flops_formula: forward FLOPs, an int or a formula of the symbolic dims; None
        when the op has no FLOP rule.
      training_flops_formula: forward plus backward FLOPs, likewise.
      activation_bytes_formula: bytes of the layer's outputs, likewise.
      flops, training_flops, activation_bytes: the same at the table's dims.
      weight_bytes: the bytes of its weights (trainable and not) as stored: at the
        policy's ``param_dtype``, or in the dtype a weight fixes (a quantized layer's
        int8, packed int4 or float8 values and float32 scales); 0 for a shared call.
      xla_flops: XLA's count for the layer's ``apply`` lowered alone at the table's
        dims; None when not comparable (see ``note``) or not asked for.
      note: why the rule and XLA differ, or why XLA's number is not shown.
      within: for a layer of a scanned run of blocks, the scan's path: the row counts
        one block (the scan's row counts them all), and the totals leave it out.
    """

    layer: str
    op: str
    params: int
    state: int
    flops_formula: Dim | None
    training_flops_formula: Dim | None
    activation_bytes_formula: Dim
    flops: int | None
    training_flops: int | None
    activation_bytes: int
    weight_bytes: int = 0
    xla_flops: int | None = None
    note: str = ""
    within: str | None = None


@dataclasses.dataclass(frozen=True)
class CostTable:
    """The cost of every layer of a compiled model; prints as a table.

    Attributes:
      graph: the compiled graph's name.
      policy: the policy's repr, or ``None``.
      dims: the symbolic dims' values the numbers are evaluated at.
      inference_mode: whether the forward pass is the inference one.
      rows: one ``LayerCost`` per layer, nested blocks' layers included.
      xla_total: XLA's count for the whole ``apply`` (unoptimized lowering), or None.
      xla_total_note: why ``xla_total`` is not comparable with the rules' total, if so.

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> table = mg.compile(mlp(8, (4,), 2)).cost_table(batch=3, xla=False)
      >>> [row.layer for row in table], table.params
      (['dense', 'relu', 'logits'], 46)
      >>> table["relu"].flops_formula, table["relu"].flops
      (4*batch, 12)
    """

    graph: str
    policy: str | None
    dims: Mapping[str, int]
    inference_mode: bool
    rows: tuple[LayerCost, ...]
    xla_total: int | None = None
    xla_total_note: str = ""

    def __iter__(self) -> Iterator[LayerCost]:
        return iter(self.rows)

    @property
    def _counted(self) -> tuple[LayerCost, ...]:
        return tuple(r for r in self.rows if r.within is None)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, layer: str) -> LayerCost:
        for row in self.rows:
            if row.layer == layer:
                return row
        names = [row.layer for row in self.rows]
        close = difflib.get_close_matches(str(layer), names, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise GraphError(f"the cost table has no layer {layer!r}{hint}; its layers: {', '.join(names)}")

    def __contains__(self, layer: object) -> bool:
        return any(row.layer == layer for row in self.rows)

    @property
    def params(self) -> int:
        return sum(r.params for r in self._counted)

    @property
    def weight_bytes(self) -> int:
        """The bytes of every weight as stored (``LayerCost.weight_bytes``)."""
        return sum(r.weight_bytes for r in self._counted)

    @property
    def flops_formula(self) -> Dim:
        """The forward FLOPs of the layers that have a rule, as a formula."""
        return _sum(r.flops_formula for r in self._counted if r.flops_formula is not None)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self._counted if r.flops is not None)

    @property
    def training_flops_formula(self) -> Dim:
        return _sum(r.training_flops_formula for r in self._counted
                    if r.training_flops_formula is not None)

    @property
    def training_flops(self) -> int:
        return sum(r.training_flops for r in self._counted if r.training_flops is not None)

    @property
    def activation_bytes_formula(self) -> Dim:
        return _sum(r.activation_bytes_formula for r in self._counted)

    @property
    def activation_bytes(self) -> int:
        return sum(r.activation_bytes for r in self._counted)

    @property
    def xla_flops(self) -> int | None:
        """The sum of XLA's per-layer counts over the layers where it is comparable."""
        counts = [r.xla_flops for r in self._counted if r.xla_flops is not None]
        return sum(counts) if counts else None

    def __str__(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        mode = "inference" if self.inference_mode else "training"
        header = ("layer", "op", "params", "weights", "forward FLOPs", f"= at {at}",
                  "fwd+bwd FLOPs", "activations", "XLA forward", "note")
        rows = [(r.layer, r.op, f"{r.params:,}", _bytes(r.weight_bytes),
                 _formula(r.flops_formula), _count(r.flops),
                 _count(r.training_flops), _bytes(r.activation_bytes), _count(r.xla_flops),
                 r.note if r.within is None else "; ".join(filter(None, ("one block", r.note))))
                for r in self.rows]
        total = ("total", "", f"{self.params:,}", _bytes(self.weight_bytes),
                 _formula(self.flops_formula),
                 _count(self.flops), _count(self.training_flops), _bytes(self.activation_bytes),
                 _count(self.xla_flops), "")
        widths = [max(len(row[i]) for row in [header, *rows, total]) for i in range(len(header))]

        def line(cells):
            return "  ".join(c.rjust(w) if 2 <= i <= 8 else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        rule = "-" * len(line(header))
        lines = [f'cost of "{self.graph}" at {at}, {mode} forward, policy {self.policy}',
                 rule, line(header), rule, *(line(r) for r in rows), rule, line(total)]
        if self.xla_total is not None:
            lines.append(f"XLA's count of the whole apply: {self.xla_total:,}"
                         + (f" ({self.xla_total_note})" if self.xla_total_note else ""))
        lines.append("FLOPs as XLA counts them: a multiply-add 2, a convert 1, exp/tanh/rsqrt 0.")
        lines.append("fwd+bwd: backward = forward for the inputs' gradient (none into the "
                     "data) + forward for the weights'.")
        return "\n".join(lines)


def _sum(values) -> Dim:
    total: Dim = 0
    for v in values:
        total = total + v
    return total


#: Formulas longer than this print as a pointer to the row's formula attribute (strided
#: "SAME" windows over symbolic sizes give pages of floordivs).
FORMULA_WIDTH = 48


def _formula(value) -> str:
    if value is None:
        return "?"
    text = str(value).replace(" ", "")
    return text if len(text) <= FORMULA_WIDTH else "(long: see flops_formula)"


def _count(value) -> str:
    return "-" if value is None else f"{value:,}"


def _bytes(count: int) -> str:
    value: float = count
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return ""


def evaluate(value: Dim, dims: Mapping[str, int]) -> int:
    """A formula's value at ``dims`` (name -> int, every dim of the formula named), in
    64-bit integers."""
    (result,) = bind_dims((value,), dims)
    return int(result)


def _evaluate_optional(value: Dim | None, dims: Mapping[str, int]) -> int | None:
    return None if value is None else evaluate(value, dims)


def step_formulas(step, param_dtype: Any, inference_mode: bool = False) -> tuple[Dim | None, Dim]:
    """A step's forward FLOPs (None when its op has no rule; a scan's: its blocks') and
    the bytes of its outputs, as formulas of the symbolic dims: a cost table row's, and
    the explorer's numbers."""
    forward = step.op.flops(step.input_specs, step.output_specs, param_dtype=param_dtype,
                            inference_mode=inference_mode)
    return forward, _sum(size(o) * o.dtype.itemsize for o in step.output_specs)


# --- the layer calls ----------------------------------------------------------------


def _gradient_flows(program, into_inputs: bool = False) -> dict[str, bool]:
    """Step path -> whether a gradient flows back into its inputs (some of them depend
    on trainable weights); the graph's inputs get none (a scan's body's inputs: the
    previous blocks' outputs, ``into_inputs``)."""
    flows: dict = {(name, 0): into_inputs for name in program.inputs}
    into = {}
    for step in program.steps:
        into[step.path] = any(flows[ref] for ref in step.inputs)
        for ref in step.outputs:
            flows[ref] = into[step.path] or bool(step.param_specs)
    return into


# --- XLA's count --------------------------------------------------------------------


def _xla_flops(step, params, state, dims: Mapping[str, int], inference_mode: bool) -> int | None:
    """XLA's flops for the layer's apply lowered alone, unoptimized, at ``dims``."""
    op = step.op.bind(step.dims).bind(dims)
    inputs = tuple(s.bind(dims) for s in step.input_specs)
    rng = jax.eval_shape(jax.random.key, 0) if op.uses_rng() and not inference_mode else None

    def apply(params, state, inputs, rng):
        return op.apply(params, state, inputs, rng=rng, inference_mode=inference_mode)

    analysis = jax.jit(apply).lower(params, state, inputs, rng).cost_analysis()
    return _flops_of(analysis)


def _flops_of(analysis) -> int | None:
    """The flops of a ``cost_analysis()`` result; None when XLA gave none at all (an
    empty dict is a program without operations: 0)."""
    if isinstance(analysis, (list, tuple)):  # older JAX gave one dict per device
        analysis = analysis[0] if analysis else None
    if analysis is None:
        return None
    return int(round(float(analysis.get("flops", 0.0))))


def _xla_total(model, example, dims, inference_mode) -> int | None:
    return _flops_of(lower(model, example, dims, inference_mode).cost_analysis())


def _row(step, input_gradients: bool, params, state, policy, bindings, inference_mode: bool,
         xla: bool) -> LayerCost:
    op = step.op
    shared = not step.owns_weights and bool(step.param_specs or step.state_specs)
    trainable = 0 if shared else sum(p.size for _, p in flatten_specs(step.param_specs))
    nontrainable = 0 if shared else sum(p.size for _, p in flatten_specs(step.state_specs))
    stored = 0 if shared else sum(p.stored_bytes(policy.param_dtype)
                                  for specs in (step.param_specs, step.state_specs)
                                  for _, p in flatten_specs(specs))
    forward, activations = step_formulas(step, policy.param_dtype, inference_mode)
    training = None if forward is None else forward + op.backward_flops(
        step.input_specs, step.output_specs, forward, input_gradients=input_gradients)
    row = LayerCost(step.path, op.op_name, evaluate(trainable, bindings),  # caches for any
                    evaluate(nontrainable, bindings), forward, training,  # batch: at the batch
                    activations, _evaluate_optional(forward, bindings),
                    _evaluate_optional(training, bindings), evaluate(activations, bindings),
                    weight_bytes=evaluate(stored, bindings))
    if xla:
        caveat = op.xla_cost_caveat(inference_mode)
        if caveat:
            row = dataclasses.replace(row, note=f"XLA n/a: {caveat}")
        else:
            counted_by_xla = _xla_flops(step, params, state, bindings, inference_mode)
            row = dataclasses.replace(row, xla_flops=counted_by_xla,
                                      note=_note(row.flops, counted_by_xla))
    if shared:
        row = dataclasses.replace(row, note="; ".join(
            filter(None, (f"shares the weights of {step.weights_path}", row.note))))
    return row


def _subtree(tree, step) -> Any:
    try:
        return get_in(tree, step.weights)
    except (KeyError, TypeError):
        return {}


def _note(row_flops: int | None, xla: int | None) -> str:
    if row_flops is None:
        return "no FLOP rule for this op: XLA's count shown" if xla is not None else "no FLOP rule"
    if xla is None:
        return "XLA gave no cost analysis"
    if abs(row_flops - xla) > TOLERANCE * max(abs(xla), 1):
        share = f", {(xla - row_flops) / row_flops:+.0%}" if row_flops and xla else ""
        return f"XLA counts {xla:,} (rule {row_flops:,}{share})"
    return ""


# --- the table ----------------------------------------------------------------------


def cost_table(model, *example: Any, inference_mode: bool = False, xla: bool = True,
               **dims: int) -> CostTable:
    """The cost table of a compiled model at the given dims (or example arrays' shapes).

    Args:
      model: an ``mg.CompiledModel``.
      *example: example arrays, one per graph input (only their shapes are used).
      inference_mode: count the inference forward pass (BatchNorm with running
        statistics, Dropout the identity) instead of the training one.
      xla: also lower each layer alone and show XLA's count next to the rule's.
      **dims: values of the symbolic dims (``batch=8``).

    Example:
      >>> import mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> table = mg.compile(mlp(784, (256,), 10)).cost_table(batch=8)
      >>> table["dense"].flops_formula, table["dense"].flops, table["dense"].xla_flops
      (401664*batch, 3213312, 3213312)
      >>> table.flops_formula
      407050*batch
    """
    bindings = dim_values(model, example, dims)
    policy = model.policy or Policy()
    params, state = jax.eval_shape(model.init_fn, jax.random.key(0))
    symbolic = [("/".join(str(k.key) for k in path), x) for path, x in jax.tree_util.tree_leaves_with_path(state)
                if any(is_symbolic(d) for d in x.shape)]
    if xla and symbolic:
        name, leaf = symbolic[0]
        raise ShapeError(f"model {model.graph.name!r} holds state of a symbolic shape ({name}: "
                         f"{shape_str(leaf.shape)}, a decoding graph's caches for any batch): XLA's "
                         f"column needs the model compiled for a batch (dec.model(2)); or pass xla=False")
    flows = _gradient_flows(model.program)
    rows = []
    for step in model.program.steps:
        rows.append(_row(step, flows[step.path], _subtree(params, step), _subtree(state, step),
                         policy, bindings, inference_mode, xla))
        if step.body is None:
            continue
        # One block of the run: its layers' rows, with one block's weights.
        one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                           (_subtree(params, step), _subtree(state, step)))
        inner_flows = _gradient_flows(step.body, into_inputs=bool(step.param_specs))
        for inner in step.body.steps:
            row = _row(inner, inner_flows[inner.path], _subtree(one[0], inner),
                       _subtree(one[1], inner), policy, bindings, inference_mode, xla)
            rows.append(dataclasses.replace(row, within=step.path))
    total, total_note = None, ""
    if xla:
        total = _xla_total(model, example, bindings, inference_mode)
        caveats = sorted({r.layer for r in rows if r.within is None and r.note.startswith("XLA n/a")})
        if caveats:
            total_note = f"not comparable: it includes {', '.join(caveats)}"
    return CostTable(model.graph.name, None if model.policy is None else repr(model.policy),
                     bindings, inference_mode, tuple(rows), total, total_note)
