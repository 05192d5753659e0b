"""What the multi-device sharding tests run, shared by the worker scripts (8 virtual
devices, two processes) and by the tests that compute the one-device references in the
main pytest process: the example graphs, their data, and a plain jitted optax train
step written here (not the library's Trainer). Importing this module starts nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlaxgraph.examples import mlp, residual_cnn, transformer_block

#: Mesh shapes over the axes ("data", "model") of 8 devices.
MESHES = {"data_parallel": (8, 1), "tensor_parallel": (1, 8), "both": (2, 4)}
RULES = {"batch": "data", "mlp": "model", "heads": "model"}
BATCH = 16
STEPS = 3
LEARNING_RATE = 0.05


def graph(name: str):
    """The example graphs, with sizes that 8-way tensor parallelism divides: the MLP's
    and the CNN's 16 classes (the defaults' 10 would not split over 8 devices, which is
    a ShardingError, checked separately) and 8 attention heads."""
    if name == "mlp":
        return mlp(64, (128, 64), 16)
    if name == "cnn":
        return residual_cnn(8, 16, 16)
    if name == "transformer":
        return transformer_block(length=16, width=64, heads=8, mlp=128)
    raise KeyError(name)


MODELS = ("mlp", "cnn", "transformer")


def data(name: str, batch: int = BATCH, seed: int = 0):
    """(inputs, targets): class labels for the classifiers, a regression target for the
    Transformer block."""
    rng = np.random.default_rng(seed)
    if name == "mlp":
        x = rng.normal(size=(batch, 64)).astype(np.float32)
        return x, rng.integers(0, 16, size=batch).astype(np.int32)
    if name == "cnn":
        x = rng.normal(size=(batch, 8, 8, 1)).astype(np.float32)
        return x, rng.integers(0, 16, size=batch).astype(np.int32)
    x = rng.normal(size=(batch, 16, 64)).astype(np.float32)
    return x, rng.normal(size=(batch, 16, 64)).astype(np.float32)


def loss_name(name: str) -> str:
    return "mean_squared_error" if name == "transformer" else "softmax_cross_entropy"


def loss_value(name: str, outputs, targets):
    if name == "transformer":
        return jnp.mean(jnp.square(outputs - targets))
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(outputs, targets))


def train_step(model, name: str, optimizer):
    """A plain jitted step: value_and_grad of the loss over ``model.apply_fn``, then the
    optax update (under standard promotion: optax mixes Python floats and int32)."""

    def objective(params, state, x, y, rng):
        outputs, new_state = model.apply_fn(params, state, x, rng=rng)
        return loss_value(name, outputs, y), new_state

    @jax.jit
    def step(params, state, opt_state, x, y, rng):
        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(
            params, state, x, y, rng)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, loss

    return step


def run(model, name: str, x=None, y=None, record: dict | None = None) -> dict[str, np.ndarray]:
    """Init, one forward pass in training mode (dropout and batch statistics on), then
    STEPS plain SGD steps: every number, flattened to ``{path: array}``. ``record``, when
    given, receives the arrays themselves (``init``: params and state as init made them,
    ``outputs``) and the train step's optimized HLO (``step_hlo``)."""
    if x is None:
        x, y = data(name)
    params, state = model.init(jax.random.key(0))
    results = flatten("init", params)
    outputs, new_state = model.apply(params, state, x, rng=jax.random.key(1))
    if record is not None:
        record.update(init={"params": params, "state": state}, outputs=outputs)
    results["outputs"] = np.asarray(outputs)
    results.update(flatten("apply_state", new_state))
    optimizer = optax.sgd(LEARNING_RATE)
    step = train_step(model, name, optimizer)
    opt_state = optimizer.init(params)
    if record is not None:
        record["step_hlo"] = step.lower(params, state, opt_state, x, y,
                                        jax.random.key(10)).compile().as_text()
    losses = []
    for i in range(STEPS):
        params, state, opt_state, loss = step(params, state, opt_state, x, y, jax.random.key(10 + i))
        losses.append(float(loss))
    results["losses"] = np.asarray(losses)
    results.update(flatten("params", params))
    results.update(flatten("state", state))
    return results


def run_taps(model, name: str) -> dict[str, np.ndarray]:
    """Every layer's output captured in inference, with its first layer's output halved
    by an intervention: ``{"taps/<path>": array}`` and ``taps/outputs``."""
    x, _ = data(name)
    params, state = model.init(jax.random.key(0))
    first = model.program.steps[0].path
    outputs, _, captured = model.apply(params, state, x, inference_mode=True, capture=["**"],
                                       intervene={first: lambda v: v * 0.5})
    results = {f"taps/{path}": np.asarray(value) for path, value in captured.items()
               if not isinstance(value, tuple)}
    results["taps/outputs"] = np.asarray(outputs)
    return results


def run_trainer(model, name: str, x=None, y=None, record: dict | None = None) -> dict[str, np.ndarray]:
    """STEPS steps of ``mg.train.Trainer`` with SGD and momentum: losses, final params
    and state. ``record`` receives the sharding of each initial param (the step
    donates them).

    Not Adam: Adam divides each gradient by its own magnitude, so a gradient that is
    zero in exact arithmetic but float32 noise (a convolution's bias before BatchNorm)
    becomes a full +-learning-rate step whose sign depends on the order of additions,
    which any change of summation order flips, on one device as on eight."""
    import mlaxgraph as mg

    if x is None:
        x, y = data(name)
    trainer = mg.train.Trainer(model, optax.sgd(LEARNING_RATE, momentum=0.9),
                               loss=loss_name(name))
    ts = trainer.init(jax.random.key(0))
    if record is not None:
        record["init_shardings"] = jax.tree.map(lambda a: a.sharding, ts.params)
    losses = []
    for _ in range(STEPS):
        ts, metrics = trainer.train_step(ts, x, y)
        losses.append(float(metrics["loss"]))
    results = {"losses": np.asarray(losses)}
    results.update(flatten("params", ts.params))
    results.update(flatten("state", ts.state))
    return results


def flatten(prefix: str, tree) -> dict[str, np.ndarray]:
    """``{"prefix/layer/weight": host array}``: gathered from every device."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out[prefix + "/" + "/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(leaf)
    return out


# --- the zoo's Transformers under the Megatron layout (mg.models.sharding_rules) -------

#: GPT-2 and a small Llama whose heads 8-way tensor parallelism divides; the Llama's 2
#: key/value heads are fewer than the model axis (4 or 8 devices): replicated.
ZOO = {
    "gpt2": dict(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=8,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2),
}
ZOO_MESHES = ("both", "tensor_parallel")
ZOO_BATCH, ZOO_SEQ = 8, 16
#: mg.decoder on the 2x4 mesh: a prompt of 10 tokens, 3 greedy steps, 32 cache slots.
DECODE_PROMPT, DECODE_STEPS, DECODE_LENGTH = 10, 3, 32


def zoo_graph(name: str):
    import mlaxgraph as mg

    return getattr(mg.models, name)(ZOO[name])


def zoo_data(seed: int = 0) -> np.ndarray:
    """Token ids; the targets are the next tokens (ids[:, 1:])."""
    return np.random.default_rng(seed).integers(0, 128, size=(ZOO_BATCH, ZOO_SEQ + 1)).astype(np.int32)


def zoo_loss_and_grads(model):
    """The jitted next-token loss and its gradients over ``model.apply_fn``."""
    def objective(params, state, ids):
        logits, _ = model.apply_fn(params, state, ids[:, :-1], inference_mode=True)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]))

    return jax.jit(jax.value_and_grad(objective))
