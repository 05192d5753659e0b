"""The benchmark models as mlaxgraph graphs (see ``models_spec`` for the numbers).

The MLP, the Transformer block and the LSTM classifier come from
``mlaxgraph.examples.models``; the digits CNN and the ResNet-style CNN are built here.
"""

from __future__ import annotations

import _common  # noqa: F401  (sys.path)

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.examples import models as examples

import models_spec as S


def mlp() -> mg.Graph:
    return examples.mlp(784, S.MLP_HIDDEN, 10)


def tiny_mlp() -> mg.Graph:
    f, h1, h2, c = S.TINY_MLP
    return examples.mlp(f, (h1, h2), c)


def cnn() -> mg.Graph:
    x = mg.Input(("batch", 8, 8, 1), name="image")
    h = ops.relu(ops.Conv(S.CNN_CHANNELS, (3, 3), padding="SAME", name="conv")(x))
    h = ops.Flatten()(ops.MaxPool((2, 2))(h))
    return mg.Graph(x, ops.Linear(10, name="logits")(h), name="cnn")


def _bn(name: str):
    return ops.BatchNorm(momentum=S.BN_MOMENTUM, epsilon=S.BN_EPSILON, name=name)


def basic_block(in_channels: int, channels: int, stride: int, name: str) -> mg.Graph:
    """conv3x3(stride)-BN-relu-conv3x3-BN, plus the input (through a 1x1 conv + BN when
    the shape changes), then relu."""
    x = mg.Input(("batch", "height", "width", in_channels), name="x")
    h = ops.Conv(channels, (3, 3), strides=stride, padding="SAME", use_bias=False, name="conv_a")(x)
    h = ops.relu(_bn("bn_a")(h))
    h = ops.Conv(channels, (3, 3), padding="SAME", use_bias=False, name="conv_b")(h)
    h = _bn("bn_b")(h)
    skip = x
    if stride != 1 or in_channels != channels:
        # "SAME" (no padding for a 1x1 window) so that the symbolic output shape has the
        # same form as conv_a's and the two add up.
        skip = ops.Conv(channels, (1, 1), strides=stride, padding="SAME", use_bias=False,
                        name="proj")(x)
        skip = _bn("proj_bn")(skip)
    return mg.Graph(x, ops.relu(ops.add(h, skip)), name=name)


def resnet() -> mg.Graph:
    x = mg.Input(("batch", 16, 16, 3), name="image")
    h = ops.Conv(S.RESNET_STEM, (3, 3), padding="SAME", use_bias=False, name="stem")(x)
    h = ops.relu(_bn("stem_bn")(h))
    channels = S.RESNET_STEM
    for i, (width, stride) in enumerate(S.RESNET_STAGES):
        h = basic_block(channels, width, stride, f"block{i + 1}")(h)
        channels = width
    h = ops.GlobalAvgPool()(h)
    return mg.Graph(x, ops.Linear(10, name="logits")(h), name="resnet")


def transformer() -> mg.Graph:
    t = S.TRANSFORMER
    x = mg.Input(("batch", t["length"], t["width"]), name="x")
    block = examples.transformer_block(t["length"], t["width"], t["heads"], t["mlp"])
    h = ops.GlobalAvgPool()(block(x))                   # mean over the sequence
    return mg.Graph(x, ops.Linear(10, name="logits")(h), name="transformer")


def lstm() -> mg.Graph:
    t = S.LSTM
    return examples.lstm_classifier(vocab=S.SPECS["lstm"].vocab, length=t["length"],
                                    width=t["width"], hidden=t["hidden"], classes=5)


GRAPHS = {"mlp": mlp, "cnn": cnn, "resnet": resnet, "transformer": transformer, "lstm": lstm,
          "tiny_mlp": tiny_mlp}


# --- the mlaxgraph train step -------------------------------------------------------------

def _loss(logits, labels):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_apply_step_fn(model, tx):
    """A train step written over ``model.apply_fn`` (what a user writes without
    ``mg.train``): ``step((params, state, opt_state), x, y) -> (new, loss)``."""
    import jax
    import optax

    def step(train_state, x, y):
        params, state, opt_state = train_state

        def objective(p):
            logits, new_state = model.apply_fn(p, state, x)
            return _loss(logits, y), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), new_state, opt_state), loss

    return step


VARIANTS = {
    "trainer": "`mg.train.Trainer(model, adam, loss=\"softmax_cross_entropy\")` (default metrics: "
               "the loss only)",
    "trainer_accuracy": "`mg.train.Trainer(..., metrics=(\"accuracy\",))`: the loss and the "
                        "accuracy",
    "apply_step": "`jax.jit` of a step written over `model.apply_fn` (no `mg.train`)",
    "trainer_xla_defaults": "`mg.train.Trainer(..., compiler_options={})`: XLA's default "
                            "options (no region-based copy analysis)",
    "trainer_backend_o1": "`mg.train.Trainer(..., compiler_options={\"xla_backend_optimization_level\": "
                          "1})`: XLA's backend (LLVM) optimization level 1 instead of its default",
}


def make(name: str, x, y, key, xs=None, ys=None, variant: str | None = None):
    """A ``Run`` of mlaxgraph's train step. ``variant`` (see ``VARIANTS``): the Trainer
    as a user makes it (the default), the Trainer also reporting the accuracy, or a
    step over ``model.apply_fn``."""
    import jax

    from _common import Run
    from models_hand import make_steps_fn, param_count

    model = mg.compile(GRAPHS[name]())
    tx = S.optimizer()
    if variant is None:
        variant = "trainer"
    system = "mlaxgraph" if variant in ("trainer", None) else f"mlaxgraph:{variant}"
    if variant.startswith("trainer"):
        import mlaxgraph.train

        kwargs = ({"metrics": ("accuracy",)} if variant == "trainer_accuracy" else
                  {"compiler_options": {}} if variant == "trainer_xla_defaults" else
                  {"compiler_options": {"xla_backend_optimization_level": 1}}
                  if variant == "trainer_backend_o1" else {})
        trainer = mlaxgraph.train.Trainer(model, tx, loss="softmax_cross_entropy", **kwargs)
        cell = [trainer.init(key)]

        def step():
            cell[0], metrics = trainer.train_step(cell[0], x, y)
            return metrics["loss"]

        run = Run(system, name, step, lambda: trainer.train_step.lower(cell[0], x, y),
                  param_count(cell[0].params), notes=VARIANTS[variant], state=lambda: cell[0])
        run.aot = (trainer.train_step, lambda: (cell[0], x, y))
        if xs is not None:
            def steps():
                cell[0], metrics = trainer.train_steps(cell[0], xs, ys)
                return metrics["loss"]

            run.steps = steps
        return run

    params, state = model.init(key)
    cell = [(params, state, tx.init(params))]
    step_fn = make_apply_step_fn(model, tx)
    jstep = jax.jit(step_fn, donate_argnums=0)

    def step():
        cell[0], loss = jstep(cell[0], x, y)
        return loss

    run = Run(system, name, step, lambda: jstep.lower(cell[0], x, y), param_count(params),
              notes=VARIANTS[variant], state=lambda: cell[0])
    run.aot = (jstep, lambda: (cell[0], x, y))
    if xs is not None:
        jsteps = jax.jit(make_steps_fn(step_fn), donate_argnums=0)

        def steps():
            cell[0], losses = jsteps(cell[0], xs, ys)
            return losses

        run.steps = steps
    return run
