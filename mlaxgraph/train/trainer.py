"""Trainer: a compiled model, a loss and an optax optimizer made into one jitted train
step (forward, backward, update, BatchNorm state, loss scaling and metrics in one XLA
computation), a fused multi-step variant on ``lax.scan``, and an eval step."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..compiler.indexed import PER_BLOCK_BACKENDS, unstack_frozen
from ..compiler.lowering import make_apply
from ..compiler.taps import Taps
from ..compiler.xla_options import TopLevelJit, checked_compiler_options, step_compiler_options
from ..core.errors import GraphError, ShapeError
from ..core.signatures import unknown_keywords
from .arguments import TRAINER_HINTS, TRAINER_SIGNATURE, check_loss_signature, initial_loss_scale
from .chunked_loss import ChunkedHead
from .fit import as_inputs, fit
from .frozen import FrozenStep, given_arrays
from .loss_scale import all_finite
from .objectives import (
    check_targets,
    float32_outputs,
    label_classes,
    objective_values,
    resolve_loss,
    resolve_metrics,
    weighted_mean,
)
from .selection import combine, subtree, trainable_paths
from .state import TrainState
from .step_calls import CheckedStep, check_optimizer_state, check_stacked

__all__ = ["Trainer"]

def _standard_promotion(fn: Callable) -> Callable:
    """optax's optimizers mix Python floats and int32 counters (``decay ** count``),
    which jax's strict dtype promotion rejects; they run under standard promotion
    whatever the caller's setting. The model itself keeps the caller's setting."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped

class Trainer:
    """Training for a compiled model.

    Args:
      model: an ``mg.CompiledModel``. Its policy sets the precision: weights stay in
        ``param_dtype`` (float32 master weights), layers compute in ``compute_dtype``.
      optimizer: an ``optax.GradientTransformation``.
      loss: a name in ``mg.train.LOSSES`` (``"softmax_cross_entropy"`` takes integer
        labels) or a function ``(outputs, targets) -> per-example losses``; the step
        minimises their mean, computed in float32.
      metrics: names in ``mg.train.METRICS`` (``("accuracy",)``) or a mapping name ->
        function ``(outputs, targets) -> per-example values``. None (the default)
        reports the loss only, as Keras does: every metric is computed in every train
        step, which costs time on small models. ``loss`` is always reported.
      loss_scale: ``"auto"`` (dynamic loss scaling when the policy computes in
        float16, none otherwise), ``"dynamic"``, None, or a ``DynamicLossScale``
        to start from.
      capture: paths or patterns of layers whose outputs the loss reads (auxiliary
        losses, probes): the loss is then a function ``(outputs, targets, captured)
        -> per-example losses`` (or one value), ``captured`` as ``model.apply``
        gives it (docs/surgery.md).
      intervene: path or pattern -> function replacing that output in every step,
        as ``model.apply``'s ``intervene``.
      trainable: which weights train, the others frozen: a glob over weight paths
        (``"*/lora_*"``; as ``graph.select``'s, ``*`` within a name, ``**`` across
        ``/``; a pattern naming a layer names its weights; it matches at any depth, as
        PEFT's ``target_modules`` do, unless it starts with ``/``; a LoRA adapter
        ``<target>.lora_A`` is also named as a part of its target, ``<target>/lora_A``,
        so ``"*/lora_*"`` names every adapter and ``"/*/lora_*"`` those of top-level
        layers), a list of such globs (the weights any of them names; each must name
        one), or a predicate on the path string
        (``"h.0/mlp.c_fc/kernel"``). Frozen weights get no gradient and no optimizer
        state: ``opt_state`` is the optimizer's state of the trainable weights alone.
        None (the default) trains every weight.
      compiler_options: XLA options for ``train_step`` and ``train_steps``
        (``jax.jit``'s ``compiler_options``; an option this jaxlib does not know is a
        ``ConfigError``). None (the default): XLA's region-based copy analysis for a
        model without convolutions, which drops the copies XLA makes of weights
        updated in place (docs/performance.md), XLA's defaults otherwise; ``{}``:
        XLA's defaults. ``trainer.compiler_options`` holds the options used.
      loss_chunk: positions per chunk: the loss ``"softmax_cross_entropy"`` computed
        with the output layer (a Linear or an Embedding's ``attend``, with its casts),
        ``loss_chunk`` positions at a time, so the logits and their gradient are never
        whole (a language model's largest arrays; docs/training.md). Metrics are then
        named ones, computed per chunk. None (the default): the whole output at once.

    The jitted functions (the train state is donated: its buffers are reused for the
    new state, so do not use a state after passing it in; with ``trainable``, the
    frozen weights and the model's state are not donated: the new train state holds
    the very frozen arrays given, so the base model's weights that ``init(key,
    reuse=...)`` shares stay usable):

    - ``train_step(ts, inputs, targets) -> (ts, metrics)``: one optimizer step.
    - ``train_steps(ts, inputs, targets) -> (ts, metrics)``: ``k`` steps in one
      dispatch, on ``lax.scan`` over inputs and targets stacked on a new leading axis
      of size ``k``; the same results as ``k`` calls of ``train_step``; metrics
      have a leading ``k`` axis.
    - ``eval_step(ts, inputs, targets, weights=None) -> metrics``: the loss and
      metrics in inference mode, averaged over the batch with optional per-example
      ``weights`` (0 for padding rows).

    ``inputs`` is an array, or a tuple of arrays for a graph with several inputs.
    ``trace_counts`` counts how often each step was traced: fixed batch shapes trace
    once.

    Example:
      >>> import jax, jax.numpy as jnp, optax, mlaxgraph as mg
      >>> from mlaxgraph.examples import mlp
      >>> trainer = mg.train.Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1),
      ...                            metrics=("accuracy",))
      >>> ts = trainer.init(jax.random.key(0))
      >>> x, y = jnp.ones((16, 4)), jnp.zeros((16,), jnp.int32)
      >>> for _ in range(3):
      ...     ts, metrics = trainer.train_step(ts, x, y)
      >>> int(ts.step), sorted(metrics), trainer.trace_counts["train_step"]
      (3, ['accuracy', 'loss'], 1)
    """

    def __init__(self, model, optimizer: optax.GradientTransformation,
                 loss: str | Callable = "softmax_cross_entropy",
                 metrics: Any = None, loss_scale: Any = "auto", *,
                 capture: Any = None, intervene: Any = None, trainable: Any = None,
                 compiler_options: Mapping[str, Any] | None = None, loss_chunk: int | None = None,
                 **unknown: Any):
        if unknown:
            raise GraphError(unknown_keywords("Trainer", unknown, TRAINER_SIGNATURE, TRAINER_HINTS))
        if not hasattr(model, "apply_fn") or not hasattr(model, "init_fn"):
            raise GraphError(f"Trainer takes a compiled model (mg.compile(graph)), got "
                             f"{type(model).__name__}")
        if isinstance(optimizer, optax.MultiSteps):  # optax's gradient accumulation
            optimizer = optimizer.gradient_transformation()
        if not isinstance(optimizer, optax.GradientTransformation):
            raise GraphError(f"Trainer takes an optax optimizer (e.g. optax.adam(1e-3)), got "
                             f"{type(optimizer).__name__}")
        self.model = model
        self.optimizer = optimizer
        self._taps = Taps.of(capture, intervene)
        self._captures = capture is not None  # capture=[]: the loss still gets {}
        if self._captures and not callable(loss):
            raise GraphError(f"Trainer(capture=...): the loss reads the captured outputs, so it "
                             f"is a function (outputs, targets, captured) -> losses, got {loss!r}")
        self._apply_fn = model.apply_fn if self._taps is None else model.tapped_apply_fn(self._taps)
        self.loss_fn = resolve_loss(loss)
        if callable(loss):
            check_loss_signature(loss, self._captures)
        self._loss_name = loss if isinstance(loss, str) else None
        self._output_name = ", ".join(v.node for v in model.graph.outputs)
        self.metric_fns = resolve_metrics(metrics)
        self._head = None
        if loss_chunk is not None:  # the program split at the output layer's input
            self._head = ChunkedHead.of(model.program, loss_chunk, loss, self.loss_fn,
                                        self.metric_fns, metrics,
                                        () if self._taps is None else self._taps.intervene)
            self._apply_fn = make_apply(self._head.body, model.sharding, taps=self._taps)
        self.loss_scale = initial_loss_scale(loss_scale, model.policy)
        # _stored: quantized weights, whose values init cannot draw
        self.trainable, self._all_paths, self._stored = trainable_paths(model, trainable)
        # a scanned run's frozen layers are kept per block (compiler.indexed), unsharded,
        # on the backends where that pays
        self._frozen = (frozenset() if self.trainable is None or getattr(model, "sharding", None)
                        or jax.default_backend() not in PER_BLOCK_BACKENDS
                        else self._all_paths - self.trainable)
        self._needs_rng = bool(model.program.random_paths())
        # None: the default PRNG; init_fn records the key's own, as jax.random.key_impl
        # gives it (a name or jax's PRNGSpec, a class jax does not export).
        self._key_impl: Any = None
        self._update = _standard_promotion(optimizer.update)
        self.trace_counts: collections.Counter = collections.Counter()
        self.compiler_options = (step_compiler_options(model.program) if compiler_options is None
                                 else checked_compiler_options(compiler_options, "Trainer"))
        self._init = jax.jit(self.init_fn)
        self._init_optimizer = jax.jit(self._optimizer_state)
        options = self.compiler_options
        step: Any  # TopLevelJit or FrozenStep (both have lower and trace)
        steps: Any
        if self.trainable is None:  # every weight is replaced: the whole state donated
            step = TopLevelJit(self.step_fn, options, "train_step", ("ts",), donate_argnums=0)
            steps = TopLevelJit(self.steps_fn, options, "train_steps", ("ts",), donate_argnums=0)
        else:  # the frozen weights and the model's state neither donated nor copied
            step = FrozenStep(self.step_fn, self.trainable, options, "train_step")
            steps = FrozenStep(self.steps_fn, self.trainable, options, "train_steps")
        classes = label_classes(self._loss_name, model.graph.output_specs)
        self.train_step = CheckedStep(step, "train_step", classes, self._output_name)
        self.train_steps = CheckedStep(steps, "train_steps", classes, self._output_name)
        self.eval_step = CheckedStep(TopLevelJit(self.eval_fn, None, "eval_step", ("ts",)),
                                     "eval_step", classes, self._output_name)

    def _train_part(self, params: Any) -> Any:
        """The weights that train (all of ``params`` without ``trainable``)."""
        return params if self.trainable is None else subtree(params, self.trainable)

    def _with_trained(self, params: Any, trained: Any) -> Any:
        return trained if self.trainable is None else combine(params, trained)

    # --- the pure functions (jitted above; usable inside a wider jitted region) -------

    def init(self, key: jax.Array, reuse: Any = None) -> TrainState:
        """A fresh TrainState: params and state from ``model.init(key, reuse=reuse)``,
        the optimizer's state of the weights that train, step 0, and the base key of the
        run's dropout masks.

        ``reuse=(params, state)`` (the base model's weights, as ``mg.load``,
        ``mg.models.load_state_dict`` or ``mg.quantize_weights`` give them) keeps every
        weight of the model it has (the very arrays; a frozen weight is neither copied
        nor donated by the steps) and draws the others (an adapter's) as the
        model's ``init`` draws them. A model holding quantized weights needs it: their
        values come from ``mg.quantize_weights``, and ``init`` would draw zeros.
        """
        self._typed_key(key)  # a key, checked before jit makes an int seed a tracer
        if reuse is None:
            if self._stored:
                raise GraphError(
                    f"Trainer.init(key): model {self.model.graph.name!r} holds quantized "
                    f"weights ({self._stored[0]}, {len(self._stored)} in all), which init "
                    f"draws as zeros, so training would start from an empty model; "
                    f"give the quantized weights: trainer.init(key, reuse=(qparams, qstate)) "
                    f"with mg.quantize_weights's result")
            return self._init(key)
        init_key, rng = jax.random.split(self._typed_key(key))
        params, state = self.model.init(init_key, reuse=reuse)
        ts = self._start(params, state, rng, self._init_optimizer)
        if self._frozen:  # layers kept per block: the arrays given one block at a time
            ts = ts.replace(params=given_arrays(ts.params, reuse[0]))
        return ts

    def init_fn(self, key: jax.Array) -> TrainState:
        """``init(key)`` as a pure function (jittable; no ``reuse``)."""
        init_key, rng = jax.random.split(self._typed_key(key))
        params, state = self.model.init_fn(init_key)
        return self._start(params, state, rng, self._optimizer_state)

    def _typed_key(self, key: jax.Array) -> jax.Array:
        typed = isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
        if not typed and not (isinstance(key, jax.Array) and key.dtype == np.uint32 and key.shape == (2,)):
            raise GraphError(f"Trainer.init takes one JAX random key, trainer.init(jax.random.key(0)), "
                             f"got {key!r}")
        if not typed:
            key = jax.random.wrap_key_data(key)        # a legacy uint32 key
        self._key_impl = jax.random.key_impl(key)
        return key

    def _optimizer_state(self, params: Any) -> Any:
        opt_state = _standard_promotion(self.optimizer.init)(self._train_part(params))
        plan = getattr(self.model, "sharding", None)
        if plan is not None:       # moments sharded like their weights, not replicated
            opt_state = plan.shard_optimizer_state(self.optimizer, opt_state,
                                                   self._train_part(plan.params))
        return opt_state

    def _start(self, params: Any, state: Any, rng: jax.Array,
               optimizer_state: Callable) -> TrainState:
        if self._frozen:
            params = unstack_frozen(self.model.program, params, self._frozen)
        return TrainState(jnp.zeros((), jnp.int32), params, state, optimizer_state(params),
                          jax.random.key_data(rng), self.loss_scale)

    def _forward(self, params, state, inputs, rng, inference_mode: bool):
        """``(outputs, new_state, captured)`` (``captured`` empty without taps)."""
        result = self._apply_fn(params, state, *as_inputs(inputs),
                                rng=rng if self._needs_rng else None,
                                inference_mode=inference_mode)
        return result if self._taps is not None else (*result, {})

    def _losses(self, outputs, targets, captured, params, state, inference_mode) -> Any:
        """Per-example losses; with ``loss_chunk``, ``outputs`` is the output layer's
        input and the result a dict of the loss and the metrics, per position."""
        if self._head is not None:
            return self._head.values(params, state, outputs, targets, inference_mode)
        if self._loss_name is not None:  # shapes are static: checked once per trace
            check_targets(self._loss_name, outputs, jnp.asarray(targets), self._output_name)
        outputs = float32_outputs(outputs)
        if self._captures:
            reads_captures: Callable[..., Any] = self.loss_fn
            return objective_values(reads_captures(outputs, targets, captured), "the loss", loss=True)
        return objective_values(self.loss_fn(outputs, targets), "the loss", loss=True)

    def _metrics(self, outputs, targets, losses, weights=None) -> dict[str, jax.Array]:
        if not isinstance(losses, dict):
            outputs = float32_outputs(outputs)
        values = losses if isinstance(losses, dict) else {
            "loss": losses, **{name: objective_values(fn(outputs, targets), f"metric {name!r}", loss=False)
                               for name, fn in self.metric_fns.items()}}
        if weights is None:
            return {name: jnp.mean(v) for name, v in values.items()}
        return {name: weighted_mean(v, weights, name) for name, v in values.items()}

    def step_fn(self, ts: TrainState, inputs: Any, targets: Any):
        """One optimizer step, pure: ``(ts, inputs, targets) -> (ts, metrics)``."""
        self.trace_counts["train_step"] += 1
        self._check_state("train_step", ts)
        return self._step(ts, inputs, targets)

    def _check_state(self, name: str, ts: TrainState) -> None:
        check_optimizer_state(name, _standard_promotion(self.optimizer.init),
                              self._train_part(ts.params), ts.opt_state)

    def _step_key(self, ts: TrainState) -> jax.Array | None:
        """Step ``n``'s key: ``fold_in(base key, n)``; None when no layer draws."""
        if not self._needs_rng:
            return None
        base = jax.random.wrap_key_data(ts.rng, impl=self._key_impl)
        return jax.random.fold_in(base, ts.step)

    def _step(self, ts: TrainState, inputs: Any, targets: Any):
        rng = self._step_key(ts)
        scale = ts.loss_scale

        trained = self._train_part(ts.params)

        def objective(trained):
            params = self._with_trained(ts.params, trained)
            outputs, new_state, captured = self._forward(params, ts.state, inputs, rng, False)
            losses = self._losses(outputs, targets, captured, params, ts.state, False)
            loss = jnp.mean(losses["loss"] if isinstance(losses, dict) else losses)
            scaled = loss if scale is None else scale.scale_loss(loss)
            return scaled, (outputs, new_state, losses)

        # Only the trainable weights are differentiated: the frozen ones are constants.
        grads, (outputs, new_state, losses) = jax.grad(objective, has_aux=True)(trained)
        if scale is not None:
            grads = scale.unscale(grads)
        updates, opt_state = self._update(grads, ts.opt_state, trained)
        params = self._with_trained(ts.params, optax.apply_updates(trained, updates))
        if scale is not None:
            # A step with non-finite gradients changes nothing but the scale.
            finite = all_finite(grads)
            keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
            params, opt_state, new_state = (keep(params, ts.params), keep(opt_state, ts.opt_state),
                                            keep(new_state, ts.state))
            scale = scale.adjust(finite)
        metrics = self._metrics(outputs, targets, losses)
        if scale is not None:
            metrics["loss_scale"] = scale.scale
        return ts.replace(step=ts.step + 1, params=params, state=new_state,
                          opt_state=opt_state, loss_scale=scale), metrics

    def steps_fn(self, ts: TrainState, inputs: Any, targets: Any):
        """``k`` optimizer steps on ``lax.scan``; inputs and targets have a leading
        ``k`` axis. Pure: ``(ts, inputs, targets) -> (ts, stacked metrics)``."""
        self.trace_counts["train_steps"] += 1
        self._check_state("train_steps", ts)
        check_stacked(as_inputs(inputs), self.model.graph.input_specs)
        counts = {int(np.shape(a)[0]) if np.ndim(a) else 0 for a in jax.tree.leaves((inputs, targets))}
        if len(counts) > 1:
            raise ShapeError(f"train_steps: the leading axis counts the steps, and inputs and "
                             f"targets give {sorted(counts)} of them: stack as many batches of "
                             f"each")
        return jax.lax.scan(lambda carry, batch: self._step(carry, *batch), ts,
                            (inputs, targets))

    def eval_fn(self, ts: TrainState, inputs: Any, targets: Any, weights: Any = None):
        """Loss and metrics in inference mode, pure: ``(ts, inputs, targets, weights)
        -> metrics`` averaged with per-example ``weights`` (all 1 when None)."""
        self.trace_counts["eval_step"] += 1
        outputs, _, captured = self._forward(ts.params, ts.state, inputs, None, True)
        losses = self._losses(outputs, targets, captured, ts.params, ts.state, True)
        return self._metrics(outputs, targets, losses, weights)

    def predict(self, ts: TrainState, inputs: Any):
        """The model's outputs in inference mode (the jitted ``model.apply``)."""
        outputs, _ = self.model.apply(ts.params, ts.state, *as_inputs(inputs),
                                      inference_mode=True)
        return outputs

    def fit(self, ts: TrainState, train: tuple | None = None, *more: Any, **kwargs):
        """Trains over numpy arrays for some epochs; see ``mg.train.fit``."""
        return fit(self, ts, train, *more, **kwargs)

    def __repr__(self) -> str:
        return (f"<Trainer {self.model.graph.name!r} loss={getattr(self.loss_fn, '__name__', self.loss_fn)} "
                f"metrics={list(self.metric_fns)} loss_scale={'dynamic' if self.loss_scale else None}>")
