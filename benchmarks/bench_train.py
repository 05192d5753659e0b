"""Training side by side: mlaxgraph against hand-written JAX, Flax (linen and NNX),
Haiku and Equinox, on the same five models with the same optimizer.

Models (``models_spec``): an MLP, the digits CNN, a ResNet-style CNN, a Transformer
encoder block and an LSTM classifier, plus a tiny MLP for the per-call overhead. Each
system's version is in ``models_<system>.py``; every system's trainable parameter count
is checked against the hand-written one's before anything is timed. Every system uses
``optax.adam(1e-3)``, the mean softmax cross-entropy over integer labels, and donates
its training state to the jitted step.

Figures, all in one process, systems interleaved (a random order in every round) and
each reported as a ratio to hand-written JAX measured in the same rounds:

  steady step   median over rounds of the per-step wall time of a chunk of steps run as
                a training loop runs them (the next step dispatched without waiting; the
                chunk waits for its last loss), after warm-up;
  per call      the tiny MLP, waiting for every step's loss: the latency of one step,
                where Python dispatch dominates;
  first call    fresh model, optimizer and jitted step objects every trial; the time of
                the first step: trace + lower + XLA compile + run (median of trials, the
                first of them the steady phase's first step; every system ran once on the
                tiny MLP before anything was timed, so per-process initialisation is not
                charged to whichever goes first);
  memory        XLA's ``memory_analysis()`` of the compiled step: ``argument + output +
                temp - alias`` bytes, i.e. the peak the step's buffers need when the
                donated state is reused in place (``temp`` alone is shown too);
  HLO           operation counts of the optimized HLO (dots, convolutions, fusions,
                converts, all instructions).

Also: ``train_steps`` (``k`` steps on ``lax.scan`` in one dispatch) against ``k``
single-step dispatches on the tiny MLP, and a check that both give the same params; the
Trainer's extras over a bare step added one at a time (attribution); hand-written
variants that measure a design choice of mlaxgraph's ops against the alternatives
(``models_hand.VARIANTS``: BatchNorm's variance in two passes or in Flax's unshifted
one pass, its normalization centered; HWIO conv kernels; the LSTM's input projection of
all steps before the scan); and "best by hand" (``models_hand.BEST``), the fastest
formulation known of each model whatever its numerics. Goals against the peers: the
train step at most the fastest peer's ratio + 0.02, the peak memory at most the
smallest peer's x 1.05.

Run alone: ``.venv/bin/python benchmarks/bench_train.py [--quick] [--models mlp,cnn]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import random
import sys
import time

import _common  # noqa: F401  (sys.path and JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median, quantiles

import jax
import jax.numpy as jnp
import numpy as np

import hlo_stats
import models_hand
import models_mg
import models_spec as S

SYSTEMS = ("mlaxgraph", "hand", "best", "linen", "nnx", "haiku", "equinox", "keras")
LABELS = {"mlaxgraph": "mlaxgraph", "hand": "hand-written JAX", "best": "best by hand",
          "linen": "Flax linen",
          "nnx": "Flax NNX", "haiku": "Haiku", "equinox": "Equinox", "keras": "Keras 3"}
PEERS = {"linen": ("models_flax", "make_linen", "flax"), "nnx": ("models_flax", "make_nnx", "flax"),
         "haiku": ("models_haiku", "make", "haiku"), "equinox": ("models_equinox", "make", "equinox"),
         "keras": ("models_keras", "make", "keras")}
GOALS = {"step": 1.02, "call": 1.05, "first": 1.10, "fused": 0.25}
#: The goals against the peers: mlaxgraph's train-step ratio at most the fastest peer's +
#: PEER_STEP_MARGIN (met when its 95% CI reaches the goal); its peak memory at most the
#: smallest peer's times PEER_MEMORY_FACTOR.
PEER_STEP_MARGIN, PEER_MEMORY_FACTOR = 0.02, 1.05
PEER_SYSTEMS = ("linen", "nnx", "haiku", "equinox", "keras")
FUSED_K = 32


HOW = {
    "mlaxgraph": ("`models_mg.py`", "graphs of `mlaxgraph.ops` (MLP, Transformer block and LSTM from "
                  "`mlaxgraph.examples`); `trainer = mg.train.Trainer(mg.compile(graph), adam, "
                  "loss=\"softmax_cross_entropy\")`, `ts, metrics = trainer.train_step(ts, x, y)` "
                  "(jitted, donates `ts`)"),
    "hand": ("`models_hand.py`", "a params dict (mlaxgraph's layout) and pure forward functions "
             "(`x @ W + b`, `lax.conv_general_dilated`, max pooling over strided slices, `lax.scan`) that "
             "compute as mlaxgraph does; `jax.jit(step, donate_argnums=0)` over "
             "`(params, state, opt_state)`"),
    "best": ("`models_hand.py` (`BEST`)", "the hand-written step with the fastest formulation "
             "known, whatever its numerics, where it differs from mlaxgraph's (ResNet: Flax's "
             "unshifted one-pass variance `mean(x²) − mean²`, the affine normalization and "
             "HWIO conv kernels; digits CNN: HWIO kernels); the other models' hand-written step "
             "is already the fastest known, and the tables say \"as hand-written\""),
    "linen": ("`models_flax.py`", "`nn.Module`s with `@nn.compact` and built-in layers; "
              "`flax.training.train_state.TrainState` (+ `batch_stats`), "
              "`jax.jit(step, donate_argnums=0)`"),
    "nnx": ("`models_flax.py`", "`nnx.Module`s with built-in layers; `nnx.Optimizer(model, adam, "
            "wrt=nnx.Param)`; `@nnx.jit(donate_argnums=(0, 1))` step that updates model and "
            "optimizer in place"),
    "haiku": ("`models_haiku.py`", "functions of `hk` modules under `hk.transform_with_state`; "
              "`jax.jit(step, donate_argnums=0)` over `(params, state, opt_state)`"),
    "equinox": ("`models_equinox.py`", "`eqx.Module`s acting on one example, `jax.vmap`-ed (with "
                "`axis_name` for BatchNorm) and `eqx.nn.State`; `eqx.filter_jit(donate=\"all-except-first\")` "
                "and `eqx.filter_value_and_grad`"),
    "keras": ("`models_keras.py`", "Keras 3 functional models of built-in layers on the JAX backend; "
              "the custom JAX loop Keras documents: `model.stateless_call` inside a jitted "
              "`jax.value_and_grad`, the same optax Adam, the state donated (Keras's own "
              "`train_on_batch` and `fit` are timed beside it on the MLP)"),
}
DIFFERENCES = (
    "Where the systems' versions of a model differ (each uses its library's own layers): conv "
    "kernels are OHWI in mlaxgraph and hand-written JAX, HWIO in Flax and Haiku, OIHW in "
    "Equinox (whose images are channel-first: the batch is transposed once, outside the "
    "timed step); every system projects the LSTM's input inside the scan, one step at a "
    "time, but Flax's `OptimizedLSTMCell` and Equinox's `LSTMCell` split the input kernel per "
    "gate or keep separate biases; Haiku's BatchNorm "
    "keeps zero-debiased moving averages (more state, a little more arithmetic); Haiku's and "
    "Equinox's attention project with `(d, heads * head_dim)` matrices. Parameter counts are "
    "equal everywhere.")


HLO_PARITY_NOTE = ("The exact version of this comparison is a test, `tests/test_hlo_parity.py`: for the MLP and the digits CNN, a step over `model.apply_fn` has exactly the hand-written step's dots, convolutions, fusions and converts; so does `mg.train.Trainer` (the loss only, its default) against the hand-written step that also counts steps, and `Trainer(..., metrics=(\"accuracy\",))` against the hand-written step that counts steps and computes the accuracy.")


def makers() -> tuple[dict, dict]:
    """``{system: make}`` for the systems whose library imports, and ``{system: why
    not}`` for the others."""
    found = {"mlaxgraph": models_mg.make, "hand": models_hand.make, "best": _hand_variant("best")}
    missing = {}
    for system, (module, fn, lib) in PEERS.items():
        try:
            found[system] = getattr(importlib.import_module(module), fn)
        except Exception as e:  # ImportError, or a library that fails with this JAX
            missing[system] = f"{lib}: {type(e).__name__}: {e}"
    return {s: found[s] for s in SYSTEMS if s in found}, missing


def versions() -> dict[str, str]:
    out = {}
    for dist in ("jax", "jaxlib", "optax", "flax", "dm-haiku", "equinox", "keras"):
        try:
            from importlib.metadata import version

            out[dist] = version(dist)
        except Exception:
            out[dist] = "not installed"
    return out


def _data(name: str, k: int | None = None):
    x, y = S.batch(S.SPECS[name], k=k)
    return jnp.asarray(x), jnp.asarray(y)


def _block(loss):
    return jax.block_until_ready(loss)


class _GcOff:
    def __enter__(self):
        self.was = gc.isenabled()
        gc.collect()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


# --- steady-state step time --------------------------------------------------------------

def steady(name: str, make: dict, rounds: int, chunk_seconds: float, seed: int,
           block_each: bool = False, extra: dict | None = None) -> dict:
    """Per-step times of every system, ``rounds`` interleaved rounds."""
    x, y = _data(name)
    makers_all = dict(make, **(extra or {}))
    runs, first, info = {}, {}, {}
    # The first call of every system (fresh objects; random order), then its memory and
    # HLO counts (from the jit caches: no second compile).
    order = list(makers_all)
    random.Random(seed + 1).shuffle(order)
    for s in order:
        runs[s] = makers_all[s](name, x, y, jax.random.key(0))
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        _block(runs[s].step())
        first[s] = (time.perf_counter() - t0, time.process_time() - c0)
        info[s] = _info(runs[s])
    runs = {s: runs[s] for s in makers_all}
    counts = {s: r.param_count for s, r in runs.items()}
    est = {}
    for s, r in runs.items():
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(5):
                loss = r.step()
                if block_each:
                    _block(loss)
            _block(loss)
            best = min(best, (time.perf_counter() - t0) / 5)
        est[s] = best
    n = max(3, min(2000, int(chunk_seconds / max(est["hand"], 1e-6))))
    for r in runs.values():  # a second warm-up, a chunk each
        for _ in range(n):
            loss = r.step()
        _block(loss)

    times = {s: [] for s in runs}
    cpu_times = {s: [] for s in runs}
    order = list(runs)
    rng = random.Random(seed)
    perf, cpu = time.perf_counter, time.process_time
    with _GcOff():
        for _ in range(rounds):
            rng.shuffle(order)
            for s in order:
                step = runs[s].step
                c0 = cpu()
                t0 = perf()
                if block_each:
                    for _ in range(n):
                        _block(step())
                else:
                    for _ in range(n):
                        loss = step()
                    _block(loss)
                times[s].append((perf() - t0) / n)
                cpu_times[s].append((cpu() - c0) / n)
    losses = {s: float(np.asarray(runs[s].step())) for s in runs}
    return {"model": name, "steps_per_chunk": n, "rounds": rounds, "times": times,
            "cpu_times": cpu_times, "first": first, "info": info,
            "param_counts": counts, "final_loss": losses, "block_each": block_each,
            "notes": {s: r.notes for s, r in runs.items() if r.notes}}


def ratios(times: dict, base: str = "hand") -> dict:
    """Per-round ratios to the base system: median, 95% CI of the median, IQR."""
    out = {}
    for s, ts in times.items():
        r = [a / b for a, b in zip(ts, times[base])]
        q1, q3 = quantiles(r)
        lo, hi = bootstrap_median_ci(r)
        out[s] = {"median": median(r), "ci": (lo, hi), "iqr": (q1, q3), "time": median(ts)}
    return out


# --- first call, memory, HLO -------------------------------------------------------------

def _info(run) -> dict:
    """Memory and HLO counts of a run's compiled step (after its first call: cached)."""
    compiled = run.lower().compile()
    mem = compiled.memory_analysis()
    return {"temp": mem.temp_size_in_bytes, "argument": mem.argument_size_in_bytes,
            "output": mem.output_size_in_bytes, "alias": mem.alias_size_in_bytes,
            "peak": (mem.argument_size_in_bytes + mem.output_size_in_bytes
                     + mem.temp_size_in_bytes - mem.alias_size_in_bytes),
            "hlo": hlo_stats.summary(compiled.as_text())}


def first_calls(name: str, make: dict, trials: int, seed: int, steady_res: dict | None = None) -> dict:
    """First-call times with fresh objects every trial (the steady phase's first calls
    count as one trial)."""
    x, y = _data(name)
    times = {s: [] for s in make}
    cpu_times = {s: [] for s in make}
    info = {}
    if steady_res is not None:
        for s in make:
            wall, cpu = steady_res["first"][s]
            times[s].append(wall)
            cpu_times[s].append(cpu)
            info[s] = steady_res["info"][s]
    rng = random.Random(seed)
    order = list(make)
    while min(len(v) for v in times.values()) < trials:
        rng.shuffle(order)
        for s in order:
            run = make[s](name, x, y, jax.random.key(len(times[s]) + 1))
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            _block(run.step())
            times[s].append(time.perf_counter() - t0)
            cpu_times[s].append(time.process_time() - c0)
            if s not in info:
                info[s] = _info(run)
            del run
    return {"model": name, "times": times, "cpu_times": cpu_times, "info": info}


def warm_process(make: dict) -> None:
    """One discarded first step of every system on the tiny MLP: what each library
    initialises once per process (lazy imports, first-use caches) is paid here, not by
    whichever system happens to go first in the timed phases."""
    x, y = _data("tiny_mlp")
    for mk in make.values():
        _block(mk("tiny_mlp", x, y, jax.random.key(0)).step())


# --- fused multi-step ------------------------------------------------------------------

def fused(rounds: int, seed: int) -> dict:
    """Per-step time of ``k`` steps in one ``train_steps`` dispatch vs ``k`` single
    ``train_step`` dispatches (the chunk waits once, at its end), tiny MLP."""
    name, k = "tiny_mlp", FUSED_K
    x, y = _data(name)
    xs, ys = _data(name, k=k)
    runs = {"mlaxgraph": models_mg.make(name, x, y, jax.random.key(0), xs=xs, ys=ys),
            "hand": models_hand.make(name, x, y, jax.random.key(0), xs=xs, ys=ys)}

    # Same results: k single steps over the k batches vs one fused call.
    same = _same_results(name, xs, ys)

    def single(run):
        def go():
            for _ in range(k):
                loss = run.step()
            _block(loss)
        return go

    def multi(run):
        def go():
            _block(run.steps())
        return go

    variants = {}
    for s, r in runs.items():
        variants[f"{s}:single"] = single(r)
        variants[f"{s}:fused"] = multi(r)
    for go in variants.values():
        go(), go(), go()
    times = {v: [] for v in variants}
    order = list(variants)
    rng = random.Random(seed)
    with _GcOff():
        for _ in range(rounds):
            rng.shuffle(order)
            for v in order:
                t0 = time.perf_counter()
                variants[v]()
                times[v].append((time.perf_counter() - t0) / k)
    out = {"k": k, "times": times, "same_results": same, "rounds": rounds}
    for s in runs:
        r = [f / g for f, g in zip(times[f"{s}:fused"], times[f"{s}:single"])]
        q1, q3 = quantiles(r)
        out[s] = {"ratio": median(r), "iqr": (q1, q3), "ci": bootstrap_median_ci(r),
                  "fused": median(times[f"{s}:fused"]), "single": median(times[f"{s}:single"])}
    return out


def _same_results(name: str, xs, ys) -> dict:
    """Params after ``k`` single steps over the batches vs one fused ``k``-step call."""
    import mlaxgraph as mg

    model = mg.compile(models_mg.GRAPHS[name]())
    from mlaxgraph import train

    trainer = train.Trainer(model, S.optimizer(), loss="softmax_cross_entropy")
    ts1, ts2 = trainer.init(jax.random.key(0)), trainer.init(jax.random.key(0))
    for i in range(xs.shape[0]):
        ts1, _ = trainer.train_step(ts1, xs[i], ys[i])
    ts2, _ = trainer.train_steps(ts2, xs, ys)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(ts1.params), jax.tree.leaves(ts2.params)))
    return {"checked": True, "max_abs_diff": diff, "steps": (int(ts1.step), int(ts2.step))}


# --- where mlaxgraph's time goes ---------------------------------------------------------

ATTRIBUTION = {
    "hand": "hand-written step (the baseline)",
    "hand+count": "+ an int32 step counter in the state (as `TrainState.step`)",
    "hand+count+key": "+ a PRNG key's raw `uint32` data passed in and out (as "
                      "`TrainState.rng`): the Trainer's program and pytree, as a tuple",
    "hand+count+key+accuracy": "+ the accuracy metric (as `metrics=(\"accuracy\",)`)",
    "mlaxgraph:trainer": "`mg.train.Trainer` (default: the loss only)",
    "mlaxgraph:trainer_accuracy": "`mg.train.Trainer(..., metrics=(\"accuracy\",))`",
    "mlaxgraph:apply_step": "a step over `model.apply_fn` (no `mg.train`)",
}


def _attribution_makers() -> dict:
    opts = {"hand": {}, "hand+count": {"count_steps": True},
            "hand+count+key": {"count_steps": True, "carry_key": True},
            "hand+count+key+accuracy": {"count_steps": True, "carry_key": True, "accuracy": True}}
    out = {k: (lambda o: lambda *a, **kw: models_hand.make(*a, **o, **kw))(o) for k, o in opts.items()}
    for v in ("trainer", "trainer_accuracy", "apply_step"):
        out[f"mlaxgraph:{v}"] = (lambda v: lambda *a, **kw: models_mg.make(*a, variant=v, **kw))(v)
    return out


def key_dispatch_cost(rounds: int = 30, calls: int = 200) -> dict:
    """Per-call time of a jitted function taking and returning (donated) a typed PRNG
    key and a scalar, against the same with the key's raw ``uint32`` data."""
    import timeit

    typed = jax.jit(lambda k, a: (k, a + 1), donate_argnums=(0, 1))
    raw = jax.jit(lambda k, a: (k, a + 1), donate_argnums=(0, 1))
    ct = [jax.random.key(0), jnp.zeros(())]
    cr = [jax.random.key_data(jax.random.key(0)), jnp.zeros(())]

    def call_typed():
        ct[0], ct[1] = typed(ct[0], ct[1])

    def call_raw():
        cr[0], cr[1] = raw(cr[0], cr[1])

    for _ in range(500):
        call_typed(), call_raw()
    t, r = [], []
    with _GcOff():
        for _ in range(rounds):
            t.append(min(timeit.repeat(call_typed, number=calls, repeat=3)) / calls)
            r.append(min(timeit.repeat(call_raw, number=calls, repeat=3)) / calls)
    return {"typed": median(t), "raw": median(r), "diff": median([a - b for a, b in zip(t, r)])}


def attribution(rounds: int, trials: int, seed: int, name: str = "tiny_mlp") -> dict:
    """The Trainer's extras added one at a time to the hand-written step: per-call time
    (waiting for every step), the AOT split of the first call, and HLO counts."""
    make = _attribution_makers()
    res = steady(name, {"hand": make["hand"]}, rounds, 0.02, seed, block_each=True,
                 extra={k: v for k, v in make.items() if k != "hand"})
    x, y = _data(name)
    split = {k: {"trace": [], "lower": [], "compile": []} for k in make}
    hlo = {}
    rng = random.Random(seed)
    order = list(make)
    for trial in range(trials):       # the steady rounds above compiled every variant once
        rng.shuffle(order)
        for k in order:
            run = make[k](name, x, y, jax.random.key(trial))
            jitted, args = run.aot
            t0 = time.perf_counter()
            traced = jitted.trace(*args())
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            compiled = lowered.compile()
            t3 = time.perf_counter()
            for key, t in (("trace", t1 - t0), ("lower", t2 - t1), ("compile", t3 - t2)):
                split[k][key].append(t)
            if k not in hlo:
                hlo[k] = hlo_stats.opcode_counts(compiled.as_text())
    res["split"] = {k: {p: median(v) for p, v in d.items()} for k, d in split.items()}
    res["key_cost"] = key_dispatch_cost()
    res["hlo"] = hlo
    return res


# --- the whole benchmark ------------------------------------------------------------------

def _hand_variant(variant):
    return lambda *a, **kw: models_hand.make(*a, variant=variant, **kw)


def _for(make: dict, name: str) -> dict:
    """The systems timed on model ``name``: "best by hand" only where it differs from the
    hand-written step."""
    return {s: m for s, m in make.items() if s != "best" or name in models_hand.BEST}


def run(quick: bool = False, models=None, seed: int = 0, mg_variants=()) -> dict:
    make, missing = makers()
    models = tuple(models or S.MODELS)
    rounds = 5 if quick else 25
    chunk = 0.05 if quick else 0.1
    trials = 2 if quick else 5
    res = {"systems": list(make), "missing": missing, "versions": versions(), "steady": {},
           "first": {}, "config": {"rounds": rounds, "chunk_seconds": chunk, "trials": trials,
                                   "quick": quick}}
    print("   warm-up: every system once", file=sys.stderr, flush=True)
    warm_process(make)
    for i, name in enumerate(models):
        print(f"   steady steps: {name}", file=sys.stderr, flush=True)
        extra = {f"hand:{v}": _hand_variant(v) for v, m in models_hand.VARIANTS.items() if m == name}
        if mg_variants:
            extra.update({f"mlaxgraph:{v}": functools.partial(models_mg.make, variant=v)
                          for v in mg_variants})
        res["steady"][name] = steady(name, _for(make, name), rounds, chunk, seed + i, extra=extra)
    if "keras" in make and "mlp" in models:
        print("   keras fit and train_on_batch: mlp", file=sys.stderr, flush=True)
        import models_keras

        x, y = S.batch(S.SPECS["mlp"])
        res["keras_own"] = models_keras.fit_and_train_on_batch("mlp", x, y)
    print("   per-call overhead: tiny_mlp", file=sys.stderr, flush=True)
    res["call"] = steady("tiny_mlp", _for(make, "tiny_mlp"), 20 if quick else 50, 0.01 if quick else 0.02, seed + 10,
                         block_each=True)
    print("   attribution: tiny_mlp", file=sys.stderr, flush=True)
    res["attribution"] = attribution(20 if quick else 50, 1 if quick else 2, seed + 40)
    print("   fused multi-step", file=sys.stderr, flush=True)
    res["fused"] = fused(10 if quick else 40, seed + 20)
    for i, name in enumerate(models + ("tiny_mlp",)):
        print(f"   first calls: {name}", file=sys.stderr, flush=True)
        st = res["call"] if name == "tiny_mlp" else res["steady"][name]
        # The tiny MLP compiles in under a second: more trials resolve its 10% goal.
        n = trials if name != "tiny_mlp" else 3 * trials
        res["first"][name] = first_calls(name, _for(make, name), n, seed + 30 + i, st)
    return res


# --- report ------------------------------------------------------------------------------

SAME = "as hand-written"


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _cell(t: float, r: float | None) -> str:
    return fmt_time(t) if r is None else f"{fmt_time(t)} ({r:.2f})"


def summary(res: dict) -> dict:
    """Ratios, goal checks and the worst case of each goal."""
    out = {"steady": {}, "first": {}, "memory": {}}
    out["steady_cpu"], out["first_cpu"] = {}, {}
    for name, st in res["steady"].items():
        out["steady"][name] = ratios(st["times"])
        out["steady_cpu"][name] = ratios(st["cpu_times"])
    out["call"] = ratios(res["call"]["times"])
    out["call_cpu"] = ratios(res["call"]["cpu_times"])
    for name, fc in res["first"].items():
        meds = {s: median(v) for s, v in fc["times"].items()}
        out["first"][name] = {s: (meds[s], meds[s] / meds["hand"]) for s in meds}
        meds = {s: median(v) for s, v in fc["cpu_times"].items()}
        out["first_cpu"][name] = {s: (meds[s], meds[s] / meds["hand"]) for s in meds}
        info = fc["info"]
        out["memory"][name] = {s: (info[s]["peak"], info[s]["peak"] / info["hand"]["peak"])
                               for s in info}
    goals = []
    worst = max(out["steady"].items(), key=lambda kv: kv[1]["mlaxgraph"]["median"])
    goals.append(("step", f"train step: mlaxgraph / hand-written <= {GOALS['step']} for every model",
                  worst[1]["mlaxgraph"]["median"], worst[0]))
    goals.append(("call", f"tiny-model per call (train step, tiny MLP): mlaxgraph / hand-written <= {GOALS['call']}",
                  out["call"]["mlaxgraph"]["median"], "tiny_mlp"))
    worst = max(((n, v["mlaxgraph"][1]) for n, v in out["first"].items()), key=lambda kv: kv[1])
    cpu_worst = max(((n, v["mlaxgraph"][1]) for n, v in out["first_cpu"].items()), key=lambda kv: kv[1])
    goals.append(("first", f"first call (trace + compile): mlaxgraph / hand-written <= {GOALS['first']} for every model",
                  worst[1], f"{worst[0]}; in CPU time the worst is {cpu_worst[1]:.3f}, {cpu_worst[0]}"))
    goals.append(("fused", f"fused k={FUSED_K} steps: per-step time / single-step dispatch <= {GOALS['fused']} (tiny MLP)",
                  res["fused"]["mlaxgraph"]["ratio"], "tiny_mlp"))
    out["goals"] = [{"key": k, "goal": text, "value": v, "where": where, "met": v <= GOALS[k]}
                    for k, text, v, where in goals]
    out["peers"] = peer_goals(res, out)
    for key, text in (("peer_step", f"train step, every model: mlaxgraph / hand-written <= the "
                                    f"fastest peer's + {PEER_STEP_MARGIN} (95% CI reaching the goal "
                                    f"counts as met)"),
                      ("peer_memory", f"peak memory of the train step, every model: mlaxgraph <= "
                                      f"the smallest peer's x {PEER_MEMORY_FACTOR}")):
        rows = out["peers"][key]
        worst = max(rows, key=lambda n: rows[n]["excess"])
        out["goals"].append({"key": key, "goal": text, "value": rows[worst]["value"], "where": worst,
                             "met": all(r["met"] for r in rows.values()),
                             "measured": "; ".join(f"{n} {r['text']}" for n, r in rows.items()),
                             "by": rows[worst]["excess"]})
    return out


def peer_goals(res: dict, s: dict) -> dict:
    """Per model: mlaxgraph's step ratio against the fastest peer's + the margin, and its
    peak memory against the smallest peer's times the factor."""
    step, memory = {}, {}
    for name, r in s["steady"].items():
        peers = [p for p in PEER_SYSTEMS if p in r]
        if not peers:
            continue
        fast = min(peers, key=lambda p: r[p]["median"])
        goal = r[fast]["median"] + PEER_STEP_MARGIN
        m = r["mlaxgraph"]
        step[name] = {"value": m["median"], "goal": goal, "peer": fast, "met": m["ci"][0] <= goal,
                      "excess": m["median"] - goal,
                      "text": f"{m['median']:.2f} (95% CI {m['ci'][0]:.2f} – {m['ci'][1]:.2f}) vs "
                              f"{LABELS[fast]} {r[fast]['median']:.2f} + {PEER_STEP_MARGIN}"}
        info = res["steady"][name]["info"]
        small = min(peers, key=lambda p: info[p]["peak"])
        mine, theirs = info["mlaxgraph"]["peak"], info[small]["peak"]
        memory[name] = {"value": mine / theirs, "peer": small, "met": mine <= PEER_MEMORY_FACTOR * theirs,
                        "excess": mine / theirs - PEER_MEMORY_FACTOR,
                        "text": f"x{mine / theirs:.2f} of {LABELS[small]} ({_mb(mine)} vs {_mb(theirs)})"}
    return {"peer_step": step, "peer_memory": memory}


def hlo_diff_text(res: dict, name: str, a: str = "mlaxgraph", b: str = "hand") -> str:
    info = res["first"][name]["info"]
    ha, hb = info[a]["hlo"], info[b]["hlo"]
    parts = [f"{k} {ha[k]} vs {hb[k]}" for k in (*hlo_stats.KEYS, "instructions") if ha[k] != hb[k]]
    return ", ".join(parts) if parts else "identical counts"


def markdown(res: dict) -> str:
    s = summary(res)
    systems = res["systems"]
    cols = ["hand"] + [x for x in systems if x != "hand"]
    c = res["config"]
    out = []
    v = res["versions"]
    out.append("Versions: " + ", ".join(f"{k} {v[k]}" for k in v) + ". Every system trains with "
               "`optax.adam(1e-3)` on the mean softmax cross-entropy of integer labels and donates "
               "its training state to the jitted step. Parameter counts are checked equal across "
               "systems before timing.")
    out += ["", md_table(["system", "code", "how it trains"],
                         [[LABELS[x], HOW[x][0], HOW[x][1]] for x in cols]), "", DIFFERENCES]
    if res["missing"]:
        out.append("")
        out.append("Left out (the library does not import with this JAX): " +
                   "; ".join(f"{LABELS[k]}: `{m}`" for k, m in res["missing"].items()) + ".")
    out.append("")

    # Steady step.
    rows = []
    for name, st in res["steady"].items():
        counts = set(st["param_counts"].values())
        pc = f"{next(iter(counts)):,}" if len(counts) == 1 else "MISMATCH " + str(st["param_counts"])
        r = s["steady"][name]
        rows.append([S.SPECS[name].title, f"{S.SPECS[name].batch}", pc]
                    + [_cell(r[x]["time"], None if x == "hand" else r[x]["median"]) if x in r else SAME
                       for x in cols])
    out += [f"### Steady train step\n\nMedian per-step wall time over {c['rounds']} interleaved "
            f"rounds (a chunk of steps per system per round, dispatched as a training loop does and "
            f"waiting once at the end of the chunk), after warm-up. In parentheses: the median of "
            f"the per-round ratios to hand-written JAX (1.00 = as fast; lower is faster).", "",
            md_table(["model", "batch", "params"] + [LABELS[x] for x in cols], rows), ""]
    rows = []
    for name in res["steady"]:
        m = s["steady"][name]["mlaxgraph"]
        mc = s["steady_cpu"][name]["mlaxgraph"]
        times = res["steady"][name]["times"]
        if "best" in times:
            rb = ratios(times, "best")["mlaxgraph"]
            rbc = ratios(res["steady"][name]["cpu_times"], "best")["mlaxgraph"]
            best = f"{rb['median']:.3f} ({rb['ci'][0]:.3f} – {rb['ci'][1]:.3f}); CPU {rbc['median']:.3f}"
        else:
            best = SAME
        rows.append([name, f"{m['median']:.3f}", f"{m['ci'][0]:.3f} – {m['ci'][1]:.3f}",
                     f"{m['iqr'][0]:.3f} – {m['iqr'][1]:.3f}", f"{mc['median']:.3f}", best,
                     str(res["steady"][name]["steps_per_chunk"])])
    out += ["mlaxgraph / hand-written, per model (wall time; and process CPU time, less sensitive to "
            "the other processes on the machine); and mlaxgraph / best by hand (per-round ratios, "
            "95% CI of the median):", "",
            md_table(["model", "median ratio", "95% CI of the median", "IQR of rounds",
                      "CPU-time ratio (median)", "mlaxgraph / best by hand", "steps per chunk"], rows), ""]
    if "keras_own" in res and "mlp" in res["steady"]:
        hand = s["steady"]["mlp"]["hand"]["time"]
        own = res["keras_own"]
        out += ["Keras's own training on the MLP (Adam, `jit_compile=True`), per step, against the "
                "hand-written step of the table above (its median; the Keras runs come after the "
                "interleaved rounds, so their ratios are less exact):", "",
                md_table(["Keras 3", "per step", "ratio to hand-written"],
                         [[f"`{k}`", fmt_time(v), f"{v / hand:.2f}"] for k, v in own.items()]), ""]

    # Design variants.
    VARIANT_TEXT = {
        "hand:bn_two_pass": "BatchNorm's batch variance in two passes, `mean((x − mean)²)`, "
                            "instead of one pass shifted by the batch's first value `k` of each channel "
                            "(`mean((x − k)²) − mean(x − k)²`; mlaxgraph's `ops.BatchNorm`, and "
                            "the hand-written model)",
        "hand:bn_centered": "BatchNorm normalizing as `(x − mean) · m + bias` (Flax's, Haiku's), "
                            "instead of `x · m + (bias − mean · m)` (mlaxgraph's, Keras's), "
                            "`m = rsqrt(var + ε) · scale`",
        "hand:bn_two_pass_centered": "both of the above: mlaxgraph's BatchNorm before this "
                                     "formulation",
        "hand:bn_one_pass": "BatchNorm's variance in one unshifted pass, `mean(x²) − mean²` "
                            "(Flax linen's default `use_fast_variance`, Haiku's): loses "
                            "precision as `(mean / std)²` (docs/performance.md)",
        "hand:bn_shift_mean": "BatchNorm's one-pass variance shifted by the mean of the first "
                              "example's values of each channel (a reduction more; mlaxgraph's "
                              "shift before) instead of the batch's first value",
        "hand:conv_hwio": "conv kernels HWIO (Flax's, Haiku's, Keras's layout) instead of OHWI "
                          "(mlaxgraph's parameter layout, which XLA transposes in the step)",
        "hand:pool_reduce_window": "max pooling with `lax.reduce_window` (every peer's; its "
                                   "gradient is XLA's `select-and-scatter`) instead of a select "
                                   "over the window's strided slices (mlaxgraph's `ops.MaxPool`, "
                                   "same values and gradients to the bit)",
        "hand:lstm_projected_before": "LSTM input projection of all steps in one matmul before "
                                      "the scan, instead of one `x_t @ W` per step inside it "
                                      "(mlaxgraph's `ops.LSTM`, and the hand-written model)",
        "hand:attention_scores_scaled": "attention's scores scaled by `1/sqrt(head_dim)` after "
                                        "the dot, instead of q before it (mlaxgraph's "
                                        "`ops.MultiHeadAttention` and its cached attention)",
    }
    rows = []
    for name, st in res["steady"].items():
        r = s["steady"][name]
        for k in st["times"]:
            if k in VARIANT_TEXT:
                mem, base = st["info"][k]["peak"], st["info"]["hand"]["peak"]
                rows.append([name, VARIANT_TEXT[k], fmt_time(r[k]["time"]),
                             f"{r[k]['median']:.3f} ({r[k]['ci'][0]:.3f} – {r[k]['ci'][1]:.3f})",
                             f"{_mb(mem)} ({mem / base:.2f})"])
    if rows:
        out += ["### Design choices of mlaxgraph's ops, against the alternatives\n\nThe "
                "hand-written model with one formulation changed to one mlaxgraph does not use, "
                "timed in the same interleaved rounds as the table above; ratio to the hand-written "
                "model, which computes as mlaxgraph does (95% CI of the median; above 1: the "
                "alternative is slower); peak memory of the compiled step (ratio).", "",
                md_table(["model", "hand-written variant", "per step", "ratio to hand-written",
                          "peak memory"], rows), ""]

    # Per call.
    call = res["call"]
    rows = []
    r = s["call"]
    names = ["hand"] + [x for x in call["times"] if x != "hand"]
    for x in names:
        label = LABELS.get(x, x)
        note = call["notes"].get(x, "")
        rc = s["call_cpu"][x]
        rows.append([label + (f" — {note}" if note else ""), fmt_time(r[x]["time"]),
                     "1" if x == "hand" else f"{r[x]['median']:.3f}",
                     "–" if x == "hand" else f"{r[x]['ci'][0]:.3f} – {r[x]['ci'][1]:.3f}",
                     "1" if x == "hand" else f"{rc['median']:.3f}"])
    out += [f"### Per-call overhead: one train step of the tiny MLP\n\n"
            f"{S.SPECS['tiny_mlp'].title}, Adam; every step waits for its loss, so the time is "
            f"the latency of one step, mostly Python dispatch. {call['rounds']} interleaved rounds "
            f"of {call['steps_per_chunk']} steps per system.", "",
            md_table(["system", "per step (median)", "ratio to hand-written", "95% CI of the ratio",
                      "CPU-time ratio"], rows), ""]

    # Attribution.
    att = res["attribution"]
    ra = ratios(att["times"])
    hb = att["hlo"]["hand"]
    rows = []
    for k in att["times"]:
        h = att["hlo"][k]
        extra = hlo_stats.diff(h, hb)
        extra_text = ", ".join(f"{op} {a - b:+d}" for op, (a, b) in extra.items()
                               if op in ("fusion", "convert", "dot", "convolution", "reduce", "compare",
                                         "select", "add", "parameter", "tuple")) or "none"
        sp = att["split"][k]
        rows.append([ATTRIBUTION.get(k, k), fmt_time(ra[k]["time"]),
                     "1" if k == "hand" else f"{ra[k]['median']:.3f} ({ra[k]['ci'][0]:.3f} – {ra[k]['ci'][1]:.3f})",
                     fmt_time(sp["trace"]), fmt_time(sp["lower"]), fmt_time(sp["compile"]), extra_text])
    out += [f"### Where the time goes: the Trainer's extras, one at a time (tiny MLP)\n\n"
            f"Per-call time as above ({att['rounds']} interleaved rounds, waiting for every step; "
            f"ratio to the bare hand-written step with the 95% CI of the median), the first call "
            f"split by JAX's AOT API (`.trace`, `.lower`, `.compile`; median of "
            f"{c['trials'] if not c['quick'] else 1} fresh trials), and the opcodes of the optimized "
            f"HLO that differ from the bare hand-written step.", "",
            md_table(["variant", "per step", "ratio to hand-written", "trace", "lower", "XLA compile",
                      "HLO ops vs hand-written"], rows), ""]
    kc = att["key_cost"]
    out += [f"Why `TrainState.rng` holds the key's raw data: a jitted function that takes and "
            f"returns a typed PRNG key (`jax.random.key`) and a scalar costs "
            f"{fmt_time(kc['typed'])} per call, against {fmt_time(kc['raw'])} with the key's raw "
            f"`uint32` data instead (+{fmt_time(kc['diff'])}; best of 3 x 200 calls, median of 30 "
            f"rounds): JAX rebuilds a typed key returned by a jitted function in Python, while "
            f"plain arrays stay in the C++ dispatch path. The step wraps the data into a key "
            f"(`jax.random.wrap_key_data`) only when a layer draws random numbers.", ""]

    # Fused.
    f = res["fused"]
    rows = []
    for x in ("mlaxgraph", "hand"):
        m = f[x]
        label = "mlaxgraph `trainer.train_steps`" if x == "mlaxgraph" else "hand-written `lax.scan` of the step"
        rows.append([label, fmt_time(m["single"]), fmt_time(m["fused"]), f"{m['ratio']:.3f}",
                     f"{m['ci'][0]:.3f} – {m['ci'][1]:.3f}"])
    same = f["same_results"]
    check = (f"Same results: params after {FUSED_K} `train_step` calls and after one "
             f"`train_steps` call over the same {FUSED_K} batches differ by at most "
             f"{same['max_abs_diff']:.1e} (steps {same['steps'][0]} and {same['steps'][1]})."
             if same.get("checked") else "Same-results check skipped (no `mg.train`).")
    out += [f"### Fused multi-step: {FUSED_K} steps per dispatch\n\nTiny MLP; per-step time of "
            f"{FUSED_K} single-step dispatches (waiting once at the end) against one call running "
            f"{FUSED_K} steps on `lax.scan` over stacked batches. {f['rounds']} interleaved rounds. "
            + check, "",
            md_table(["", "single-step dispatch, per step", f"fused k={FUSED_K}, per step",
                      "ratio (goal <= 0.25)", "95% CI"], rows), ""]

    # First call.
    rows = []
    for name, fc in s["first"].items():
        rows.append([S.SPECS[name].title] + [_cell(fc[x][0], None if x == "hand" else fc[x][1])
                                             if x in fc else SAME for x in cols])
    rows_cpu = []
    for name, fc in s["first_cpu"].items():
        rows_cpu.append([S.SPECS[name].title] + [_cell(fc[x][0], None if x == "hand" else fc[x][1])
                                                 if x in fc else SAME for x in cols])
    out += [f"### First call: trace + lower + compile + run\n\nFresh model, optimizer and jitted "
            f"step objects every trial; median of {c['trials']} trials ({3 * c['trials']} for the tiny "
            f"MLP; random system order per "
            f"trial; the first is the first step of the steady-state runs above). Every system "
            f"ran once on the tiny MLP before anything was timed, so what a library initialises "
            f"once per process is not charged to whichever system goes first. In parentheses: ratio of the medians to "
            f"hand-written JAX.", "", md_table(["model"] + [LABELS[x] for x in cols], rows), "",
            "The same first calls in process CPU time (XLA's compile threads included; less "
            "sensitive to the other processes on a shared machine):", "",
            md_table(["model"] + [LABELS[x] for x in cols], rows_cpu), ""]

    # Memory.
    rows = []
    for name, mem in s["memory"].items():
        info = res["first"][name]["info"]
        rows.append([S.SPECS[name].title] + [
            f"{_mb(mem[x][0])} ({mem[x][1]:.2f}); temp {_mb(info[x]['temp'])}" if x in mem else SAME
            for x in cols])
    out += ["### Peak memory of the compiled train step\n\nFrom XLA's `compiled.memory_analysis()` "
            "of each system's jitted step: argument + output + temp − alias bytes (the buffers the "
            "step needs at once when the donated training state is reused in place); the ratio to "
            "hand-written JAX in parentheses, XLA's temp allocation after it. This is exact and "
            "per system; a process-wide measure (`resource.getrusage` max RSS) cannot separate "
            "systems that share one process.", "",
            md_table(["model"] + [LABELS[x] for x in cols], rows), ""]

    # HLO.
    rows = []
    for name, fc in res["first"].items():
        info = fc["info"]
        rows.append([name] + ["{}/{}/{}/{}".format(info[x]["hlo"]["dot"] + info[x]["hlo"]["convolution"],
                                                     info[x]["hlo"]["fusion"], info[x]["hlo"]["convert"],
                                                     info[x]["hlo"]["instructions"])
                              if x in info else SAME for x in cols])
    out += ["### Optimized HLO of the train step\n\ndots + convolutions / fusions / converts / all "
            "instructions (every computation of the module, fused ones included).", "",
            md_table(["model"] + [LABELS[x] for x in cols], rows), ""]
    out.append("mlaxgraph vs hand-written, where the counts differ: " + "; ".join(
        f"{name}: {hlo_diff_text(res, name)}" for name in res["first"]) + ".")
    out += ["", HLO_PARITY_NOTE, "", why_peers(res)]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", type=lambda v: tuple(v.split(",")))
    p.add_argument("--mg-variants", type=lambda v: tuple(v.split(",")), default=(),
                   help="mlaxgraph's variants (models_mg.VARIANTS) in every model's rounds, "
                        "e.g. trainer_xla_defaults")
    args = p.parse_args(argv)
    res = run(args.quick, args.models, mg_variants=args.mg_variants)
    print(markdown(res))
    for g in summary(res)["goals"]:
        print(f"{g['goal']}: {g['value']:.3f} ({g['where']}) {'met' if g['met'] else 'MISSED'}")



def analysis(res: dict) -> str:
    """For every missed goal: by how much, why (from the measurements above), and what
    would close it."""
    s = summary(res)
    att = res.get("attribution")
    out = []
    t = {k: median(v) for k, v in att["times"].items()} if att else {}

    def us(x):
        return f"{x * 1e6:.1f} µs"

    def paired(a, b):
        """Median over rounds of the per-round difference of two variants' times."""
        return median([x - y for x, y in zip(att["times"][a], att["times"][b])])

    parts = {}
    if att and "mlaxgraph:trainer" in t:
        parts = {"step counter": paired("hand+count", "hand"),
                 "raw key data in and out": paired("hand+count+key", "hand+count"),
                 "the rest (TrainState dataclass, metrics dict, Trainer code)":
                     paired("mlaxgraph:trainer", "hand+count+key")}
    extra_total = paired("mlaxgraph:trainer", "hand") if parts else None
    for g in s["goals"]:
        if g["key"].startswith("peer_"):
            out += peer_analysis(res, s, g)
            continue
        head = f"- **{g['goal']}**: {g['value']:.3f} ({g['where']})"
        if g["met"]:
            out.append(head + " — met.")
            continue
        by = 100 * (g["value"] / GOALS[g["key"]] - 1)
        out.append(head + f" — missed by {by:.1f}% of the goal.")
        if g["key"] == "step":
            for name, r in s["steady"].items():
                m = r["mlaxgraph"]
                if m["median"] <= GOALS["step"]:
                    continue
                hand_t = r["hand"]["time"]
                line = (f"  - {name}: median ratio {m['median']:.3f}, 95% CI {m['ci'][0]:.3f} – "
                        f"{m['ci'][1]:.3f}, hand-written step {fmt_time(hand_t)}. Compiled programs: "
                        f"{hlo_diff_text(res, name) if name in res['first'] else 'see the HLO table'}.")
                if extra_total is not None:
                    line += (f" The Trainer's fixed extra per step, measured on the tiny MLP (paired "
                             f"median), is {us(extra_total)}, i.e. {100 * extra_total / hand_t:.1f}% "
                             f"of this model's step"
                             + (" (below the resolution of the measurement)" if extra_total <= 0 else ""))
                    line += (": it explains the gap." if extra_total / hand_t >= m["median"] - 1 - 0.005
                             else "; the rest of the gap is not in the program or the dispatch "
                                  "(which are the hand-written ones plus those extras) but in the "
                                  "timing: " + ("the CI includes the goal, so it is machine noise."
                                                if m["ci"][0] <= GOALS["step"] else
                                                "a shared machine under load; rerun on a quiet one."))
                out.append(line)
        elif g["key"] == "call" and parts:
            ratio = lambda k: median([a / b for a, b in zip(att["times"][k], att["times"]["hand"])])  # noqa: E731
            out.append("  - Why (the attribution table, per step, median of the per-round "
                       "differences; a negative figure is below the resolution of the "
                       "measurement): " + "; ".join(f"{k} {us(v)}" for k, v in parts.items())
                       + f"; total {us(extra_total)} on a {us(t['hand'])} step. The Trainer "
                       f"measures {s['call'].get('mlaxgraph', {}).get('median', float('nan')):.3f}x "
                       f"in the per-call table and {ratio('mlaxgraph:trainer'):.3f}x in the "
                       f"attribution rounds; a step over `model.apply_fn` without `mg.train` "
                       f"{ratio('mlaxgraph:apply_step'):.3f}x: the graph, the interpreter and "
                       f"`apply` add nothing per call; what there is is in `mg.train`'s step "
                       f"(two more scalars in its state).")
            out.append("  - What would close it: the Trainer's state already carries only the step "
                       "counter and the key's raw data beyond the hand-written step's; leaving the "
                       "key out of the step's inputs and outputs when no layer draws random numbers "
                       "would save one buffer each way, and a quiet machine would tell a few "
                       "microseconds from noise.")
        elif g["key"] == "first":
            sp = att["split"] if att else {}
            for name, r in s["first"].items():
                ratio = r["mlaxgraph"][1]
                if ratio <= GOALS["first"]:
                    continue
                out.append(f"  - {name}: {fmt_time(r['mlaxgraph'][0])} vs {fmt_time(r['hand'][0])} "
                           f"(x{ratio:.2f}); optimized HLO: {hlo_diff_text(res, name)}.")
            if sp:
                row = lambda k: ", ".join(f"{p} {fmt_time(sp[k][p])}" for p in ("trace", "lower", "compile"))  # noqa: E731
                out.append(f"  - Split on the tiny MLP: hand-written {row('hand')}; hand-written with "
                           f"the Trainer's extras {row('hand+count+key')}; Trainer "
                           f"{row('mlaxgraph:trainer')}; step over `model.apply_fn` "
                           f"{row('mlaxgraph:apply_step')}. XLA's compile dominates the first call; "
                           f"the step counter is one more fusion to compile; tracing adds "
                           f"mlaxgraph's interpreter (per layer: a named scope, the params cast, "
                           f"the output check).")
            out.append("  - What would close it: the compiled program is the hand-written one plus "
                       "the step counter (`tests/test_hlo_parity.py`), which leaves the "
                       "interpreter's trace time, a few ms per model; the first-call times of a "
                       "few seconds vary by tens of percent between trials on a loaded machine, so "
                       "a quiet machine and more trials are needed to resolve 10%.")
        elif g["key"] == "fused":
            fm, fh = res["fused"]["mlaxgraph"], res["fused"]["hand"]
            out.append(
                f"  - Why: a fused step still runs the step's own kernels; what it saves is the "
                f"dispatch. mlaxgraph: {us(fm['fused'])} per fused step against {us(fm['single'])} "
                f"per dispatched step, so {us(fm['single'] - fm['fused'])} of a dispatched step is "
                f"dispatch; hand-written `lax.scan`: {us(fh['fused'])} against {us(fh['single'])} "
                f"(ratio {fh['ratio']:.3f}). The ratio is about compute / (compute + dispatch): it "
                f"is at most {GOALS['fused']} only where dispatching a step costs at least "
                f"{(1 - GOALS['fused']) / GOALS['fused']:.0f}x the step's compute, which depends on "
                f"the machine's Python speed and load, not on the library: mlaxgraph's fused steps "
                f"run as fast as the hand-written scan. A larger k does not help (the compute per "
                f"step is the floor).")
            out.append("  - What would close it: a step with fewer, larger kernels (the tiny "
                       "MLP's step is dozens of small fusions: forward, backward and Adam for "
                       "each parameter), which lowers the floor for hand-written JAX and mlaxgraph alike.")
    return "\n".join(out)


def _variant(res: dict, name: str, key: str) -> str:
    """``ratio (CI); memory x`` of a hand-written variant in model ``name``'s rounds."""
    st = res["steady"].get(name, {})
    if key not in st.get("times", {}):
        return "not measured"
    r = ratios(st["times"])[key]
    mem = st["info"][key]["peak"] / st["info"]["hand"]["peak"]
    return f"{r['median']:.3f} (95% CI {r['ci'][0]:.3f} – {r['ci'][1]:.3f}), x{mem:.2f} memory"


#: What would close a miss against the peers, per model: the formulations mlaxgraph does
#: not use, each measured as a hand-written variant in the same rounds.
CLOSE = {
    "resnet": [("hand:bn_one_pass", "Flax's unshifted one-pass variance `mean(x²) − mean²`: one "
                "full-size `x − k` pass fewer, but its float32 error grows as `(mean / std)²` "
                "(`tests/test_batch_norm_formulation.py`: over 1000x the bound at mean / std = "
                "1e4); not adopted"),
               ("best", "that and HWIO conv kernels (the best by hand)")],
    "cnn": [("hand:conv_hwio", "HWIO conv kernels: the one transpose of the kernel XLA adds to "
             "mlaxgraph's OHWI layout; the layout is that of saved files and checkpoints, so it "
             "stays")],
}


def peer_analysis(res: dict, s: dict, g: dict) -> list[str]:
    """The goal against the peers: per model, met or by how much, and what would close it."""
    rows = s["peers"][g["key"]]
    out = [f"- **{g['goal']}**: " + ("met." if g["met"] else f"missed (worst: {g['where']}).")]
    for name, r in rows.items():
        line = f"  - {name}: {r['text']}: " + ("met" if r["met"] else "**missed**")
        if not r["met"] and g["key"] == "peer_step":
            fixes = [f"{text}: {_variant(res, name, k)}" for k, text in CLOSE.get(name, [])]
            line += ("; what would close it: " + "; ".join(fixes) if fixes else
                     "; the hand-written step computes as mlaxgraph does and the peers' programs "
                     "are not faster (HLO table): the gap is in the timing")
        if not r["met"] and g["key"] == "peer_memory":
            line += "; what would close it: see \"Why the peers are faster\""
        out.append(line + ".")
    return out


def _hlo(res: dict, name: str, system: str) -> str:
    info = res["steady"].get(name, {}).get("info", {}).get(system)
    if info is None:
        return "n/a"
    return f"{info['hlo']['fusion']} fusions, {_mb(info['peak'])}"


def why_peers(res: dict) -> str:
    """Why the peers are (or were) faster, from their source and their optimized HLO, with
    this run's counts."""
    out = ["### Why the peers are faster\n\nFrom the peers' source (the installed versions) and "
           "the optimized HLO of their steps (`benchmarks/hlo_stats.py`; fusions and peak memory "
           "below are this run's; \"before\" is the hand-written `bn_two_pass_centered`, "
           "mlaxgraph's BatchNorm before this formulation):", ""]
    if "resnet" in res["steady"]:
        h = lambda k: _hlo(res, "resnet", k)  # noqa: E731
        out += [
            f"- **ResNet, Flax linen** ({h('linen')}; before {h('hand:bn_two_pass_centered')}): "
            f"`nn.BatchNorm` computes the variance in one pass by default (`use_fast_variance=True`: "
            f"`mean(x²) − mean²`, clamped at 0). In the HLO, each BatchNorm's two reductions "
            f"(YNNPACK `ynn_fusion`s on CPU) both read the convolution's output; the two-pass form "
            f"reduces, then writes the full-size `x − mean` (a `broadcast_subtract_fusion`), then "
            f"reduces that: one full-size pass more, in a chain. Linen normalizes as "
            f"`(x − mean) · m + bias` and keeps `x − mean` for the backward pass, so its memory is "
            f"the two-pass form's.",
            f"- **ResNet, Haiku** ({h('haiku')}): also one pass (`mean_of_squares − mean²`, no "
            f"clamp), but `hk.BatchNorm` keeps zero-debiased moving averages "
            f"(`ExponentialMovingAverage`: a counter, a hidden average, converts): more fusions "
            f"and 12 converts more, which is why it is slower than linen.",
            f"- **ResNet, Keras 3** ({h('keras')}): the variance in two passes (`jnp.var`), but "
            f"`keras.ops.batch_normalization` normalizes as `x · m + (offset − mean · m)`: affine "
            f"in `x`, so the backward pass needs `x` (kept anyway) and no full-size `x − mean`. "
            f"That is its lower peak memory: one full-size tensor fewer per BatchNorm "
            f"(the before form keeps both).",
            f"- **What mlaxgraph took** (hand-written as mlaxgraph now computes: {h('hand')}; "
            f"mlaxgraph: {h('mlaxgraph')}): Keras's affine normalization (the memory) and a "
            f"one-pass variance shifted by `k`, the batch's first value of each channel (a "
            f"slice, no reduction; `mean((x − k)²) − mean(x − k)²`, the mean as "
            f"`k + mean(x − k)`), whose float32 error depends on `|k − mean| / std` (at most "
            f"`sqrt(N − 1)` for N values a channel), not on the mean. "
            f"On XLA's CPU reductions the shift is one full-size elementwise pass (`x − k`) that "
            f"the unshifted form does not need; Flax's unshifted form is the best by hand "
            f"({h('best')}, with HWIO kernels) and is not taken: its error grows as "
            f"`(mean / std)²`.",
        ]
    if "cnn" in res["steady"]:
        h = lambda k: _hlo(res, "cnn", k)  # noqa: E731
        out += [
            f"- **Digits CNN: mlaxgraph is the fastest, and why** (hand-written {h('hand')}; "
            f"Haiku {h('haiku')}; Keras {h('keras')}): every peer pools with "
            f"`lax.reduce_window`, whose gradient XLA computes as a `select-and-scatter`: on "
            f"CPU a loop of its own over every window, most of the peers' step (a 2x2 pool's "
            f"gradient over 128 x 8 x 8 x 32 values: 1.4 ms, against 0.15 ms as selects). "
            f"mlaxgraph's `ops.MaxPool` (and the hand-written step, which computes as it does) "
            f"takes the window's maximum as a select over its four strided slices, keeping "
            f"the first maximum, so its gradient is the same to the bit (tested) and is four "
            f"selects and pads that XLA fuses. XLA's temporaries shrink with it (the peak "
            f"memory table: mlaxgraph's step needs about a quarter of the peers'). The other "
            f"difference is one instruction, a "
            f"`transpose_copy_fusion` turning the OHWI kernel (mlaxgraph's layout) into the "
            f"HWIO one XLA's CPU convolution takes (288 values: within the rounds' spread).",
        ]
    if "mlp" in res["steady"] and "equinox" in res["steady"]["mlp"]["info"]:
        i = res["steady"]["mlp"]["info"]
        out.append(
            f"- **MLP, Equinox's peak memory** ({_mb(i['equinox']['peak'])}, temp "
            f"{_mb(i['equinox']['temp'])}; hand-written and mlaxgraph {_mb(i['hand']['peak'])}, temp "
            f"{_mb(i['hand']['temp'])}): the optimized HLO has the same dots and fusions (its "
            f"kernels are `(out, in)`, so the weight gradient's dot is written in that order); "
            "the difference is one 256x256 float32 buffer (256 KiB) in XLA's buffer assignment, not in what is computed: every system copies the donated hidden kernel `W2` at the start of the step (copy insertion, since the backward pass reads `W2` after its in-place update could have written it), and XLA's CPU scheduler keeps that copy live until `W2`'s Adam update, which it places after the first layer's kernel gradient (784x256, 784 KiB) in the `x @ W` programs and before it in Equinox's, so the two share no offset in Equinox's temp (buffer assignment of `XLA_FLAGS=--xla_dump_to`). What decides the order is the dot's form, not the library: with `(in, out)` kernels, the Dense written `x @ W` (mlaxgraph, hand-written, Flax, Haiku, Keras) or `vmap` of `v @ W` has 1,197,124 bytes of temp, `(W.T @ x.T).T` or `dot_general(W, x).T` (the product computed as `(out, batch)` then transposed, as Equinox's `vmap` of `W @ v` lowers) 938,052, Equinox's exactly. Not adopted: the parameters after one Adam step differ by 2e-10 (summation order) and the transposed form takes 1.010x the step time (95% CI 1.002 – 1.029; `benchmarks/bench_dense_form.py --rounds 25`), and would change every Dense of every model (3-d inputs: a transpose of the activations; its compile time and the other models' steps not measured) for 256 KiB on this one; the memory goal's miss (x1.06 against x1.05) is this schedule. What would close it: the transposed form for 2-d inputs only, measured on every model's step and first call.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
