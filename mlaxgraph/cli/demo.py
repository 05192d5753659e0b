"""The demo, the main job of ``make demo`` and ``mlaxgraph demo``: a residual CNN
trained on scikit-learn's bundled 8x8 digits (no download), then its rendered graph,
StableHLO, weights and a checkpoint written to an output folder."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import optax

from ..compiler.compile import compile
from ..compiler.policy import Policy
from ..examples import residual_cnn
from ..examples.data import load_digits
from ..io.model_file import save
from ..render.graphviz import GraphvizNotFoundError
from ..train import CheckpointManager, Trainer, evaluate

__all__ = ["DigitsResult", "train_digits", "run", "write_drawing"]


@dataclasses.dataclass
class DigitsResult:
    """What ``train_digits`` gives back."""

    trainer: Any
    train_state: Any
    history: dict
    test_accuracy: float
    seconds: float


def train_digits(policy=None, epochs: int = 10, batch_size: int = 32, seed: int = 0,
                 learning_rate: float = 3e-3, checkpoints=None,
                 progress: bool = True) -> DigitsResult:
    """Trains ``examples.residual_cnn`` on the digits with AdamW and a cosine schedule."""
    start = time.perf_counter()
    train, test = load_digits(seed)
    model = compile(residual_cnn(), policy)
    schedule = optax.cosine_decay_schedule(learning_rate, epochs * (len(train[1]) // batch_size))
    trainer = Trainer(model, optax.adamw(schedule, weight_decay=1e-4), metrics=("accuracy",))
    ts = trainer.init(jax.random.key(seed))
    if checkpoints is not None and checkpoints.latest_step() is not None:
        ts = checkpoints.restore(ts)
    # Resuming: up to epoch `epochs`, from the epoch the restored state reached.
    done = int(ts.step) // (len(train[1]) // batch_size)
    history: dict = {"epoch": []}
    if done < epochs:
        ts, history = trainer.fit(ts, train, epochs=epochs, batch_size=batch_size, initial_epoch=done,
                                  validation=test, seed=seed, checkpoints=checkpoints,
                                  progress=progress)
    accuracy = evaluate(trainer, ts, test, batch_size)["accuracy"]
    return DigitsResult(trainer, ts, history, accuracy, time.perf_counter() - start)


def write_drawing(graph, stem: str, what: str = "rendered graph") -> tuple[str, str]:
    """``graph`` drawn to ``stem.svg`` through Graphviz, or its DOT text to ``stem.dot``
    when Graphviz's ``dot`` is missing: (what was written, its path)."""
    try:
        graph.render(stem + ".svg")
        return what, stem + ".svg"
    except GraphvizNotFoundError:
        with open(stem + ".dot", "w") as f:
            f.write(graph.to_dot())
        return "graph as DOT (install Graphviz's dot to render it)", stem + ".dot"


def _write_outputs(result: DigitsResult, out: str) -> list[tuple[str, str]]:
    model = result.trainer.model
    written = [write_drawing(model.graph, os.path.join(out, "graph"), "rendered graph, as compiled")]
    hlo = os.path.join(out, "model.stablehlo.mlir")
    with open(hlo, "w") as f:
        f.write(model.hlo(batch=1, inference_mode=True))
    written.append(("StableHLO of apply (batch 1, inference)", hlo))
    weights = os.path.join(out, "digits_cnn.mlg")
    save(weights, model.source_graph, result.train_state.params, result.train_state.state)
    written.append(("graph and trained weights (mg.load)", weights))
    return written


def run(args) -> int:
    """``mlaxgraph demo``: args has ``policy``, ``epochs``, ``batch``, ``out``, ``seed``."""
    policy = Policy.named(args.policy) if args.policy != "float32" else None
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    print(residual_cnn().summary())
    print(f"\ntraining on scikit-learn's digits (1437 train / 360 test images), "
          f"policy {args.policy}, {args.epochs} epochs of batch {args.batch}")
    checkpoints = CheckpointManager(os.path.join(out, f"checkpoints-{args.policy}"), keep=3)
    if checkpoints.latest_step() is not None:
        print(f"resuming from the checkpoint of step {checkpoints.latest_step()} in "
              f"{checkpoints.directory} (delete it to start over)")
    result = train_digits(policy, epochs=args.epochs, batch_size=args.batch, seed=args.seed,
                          checkpoints=checkpoints)
    written = _write_outputs(result, out)
    written.append(("checkpoints (last 3 epochs)", checkpoints.directory))
    print(f"\ntest accuracy {result.test_accuracy:.2%} after {result.seconds:.1f} s "
          f"(train step traced {result.trainer.trace_counts['train_step']} time(s))")
    if policy is not None:
        print(f"\ncompiled under {policy}:")
        print(result.trainer.model.summary())
    print("\nwritten:")
    for what, path in written:
        print(f"  {what}: {path}")
    return 0
