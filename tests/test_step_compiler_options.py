"""Trainer(compiler_options=...): the XLA options of the train step, chosen from the
model's layers by default (region-based copy analysis without convolutions), given
by name, checked against this jaxlib; the same results as XLA's defaults. The copies the
options drop, and the bit-for-bit equality, are those of XLA's default CPU emitter
(``xla_default``)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph.compiler.xla_options import STEP_COMPILER_OPTIONS, step_compiler_options
from mlaxgraph.examples import mlp, residual_cnn
from mlaxgraph.train import Trainer

pytestmark = pytest.mark.xla_default

REGION = "xla_cpu_copy_insertion_use_region_analysis"


def _gpt2():
    config = {"n_positions": 16, "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50}
    return mg.compile(mg.models.gpt2(config), scan_blocks=True)


def _steps(trainer, x, y, n=3):
    ts = trainer.init(jax.random.key(0))
    losses = []
    for _ in range(n):
        ts, metrics = trainer.train_step(ts, x, y)
        losses.append(float(metrics["loss"]))
    return ts, losses


def _entry_copies(compiled) -> int:
    text = compiled.as_text()
    entry = text[text.index("ENTRY"):]
    return sum(" copy(" in line for line in entry.splitlines())


def test_the_default_follows_the_layers():
    assert Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1)).compiler_options == STEP_COMPILER_OPTIONS
    assert Trainer(_gpt2(), optax.sgd(0.1)).compiler_options == STEP_COMPILER_OPTIONS
    # a convolution anywhere keeps XLA's defaults
    cnn = mg.compile(residual_cnn(8, channels=4, classes=3))
    assert Trainer(cnn, optax.sgd(0.1)).compiler_options == {}
    assert step_compiler_options(cnn.program) == {}
    chosen = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1), compiler_options={})
    assert chosen.compiler_options == {}


def test_every_convolution_op_is_known():
    """The rule reads CONVOLUTION_OPS by name: every registered op that convolves is in it
    (ONNX's and ATen's families included), and nothing else."""
    import mlaxgraph.aten  # noqa: F401  (registers the families' ops)
    import mlaxgraph.onnx  # noqa: F401
    from mlaxgraph.core.registry import _REGISTRY
    from mlaxgraph.ops.spatial import CONVOLUTION_OPS

    assert CONVOLUTION_OPS == {name for name in _REGISTRY if "conv" in name.lower()}


def test_an_imported_convolution_keeps_the_defaults():
    """An ONNX Conv whose kernel is an input stays the family's own op (``onnx.Conv``),
    not ``ops.Conv``: the rule reads it too."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3]),
         helper.make_node("ReduceMean", ["y"], ["z"], name="mean", keepdims=0)],
        "convolving", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8]),
                       helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    imported, _, _ = mg.from_onnx(model.SerializeToString())
    compiled = mg.compile(imported)
    assert "onnx.Conv" in {step.op.op_name for step in compiled.program.all_steps()}
    assert step_compiler_options(compiled.program) == {}


@pytest.mark.parametrize("trainable", [None, "**/*.lora_*"])
def test_the_options_change_no_result(trainable):
    """The copies XLA leaves out change where values live, not what is computed: the
    weights, optimizer state and losses equal XLA's defaults' bit for bit."""
    model = _gpt2()
    if trainable:
        model = mg.compile(mg.lora(model.source_graph, "h.*/attn/qkv", rank=2), scan_blocks=True)
    ids = jax.random.randint(jax.random.key(1), (2, 16), 0, 50)
    runs = [_steps(Trainer(model, optax.adamw(1e-2), trainable=trainable, compiler_options=o),
                   ids, ids) for o in (None, {})]
    (ts_a, losses_a), (ts_b, losses_b) = runs
    assert losses_a == losses_b and losses_a[-1] != losses_a[0]  # the steps trained
    for a, b in zip(jax.tree.leaves((ts_a.params, ts_a.opt_state)),
                    jax.tree.leaves((ts_b.params, ts_b.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_donated_weights_are_not_copied():
    """XLA's default analysis copies a donated weight the backward pass reads before its
    in-place update (every hidden kernel of an MLP); the region analysis proves the
    reads come first and drops the copies, and the step needs fewer bytes."""
    x, y = jnp.ones((32, 16)), jnp.zeros((32,), jnp.int32)
    model = mg.compile(mlp(16, (64, 64), 4))
    compiled = {}
    for label, options in (("default", None), ("xla", {})):
        trainer = Trainer(model, optax.adam(1e-3), compiler_options=options)
        compiled[label] = trainer.train_step.lower(trainer.init(jax.random.key(0)), x, y).compile()
    assert _entry_copies(compiled["xla"]) > 0
    assert _entry_copies(compiled["default"]) == 0
    temp = {k: c.memory_analysis().temp_size_in_bytes for k, c in compiled.items()}
    assert temp["default"] < temp["xla"]


def test_the_step_composes_inside_other_traces():
    """jax takes compiler options on top-level jits only: inside make_jaxpr or an outer
    jit the step runs without them, with the same results."""
    trainer = Trainer(mg.compile(mlp(4, (8,), 3)), optax.sgd(0.1))
    x, y = jnp.ones((8, 4)), jnp.zeros((8,), jnp.int32)
    ts = trainer.init(jax.random.key(0))
    jaxpr = jax.make_jaxpr(trainer.train_step)(ts, x, y)
    assert "pjit" in str(jaxpr) or "jit" in str(jaxpr)
    _, outer = jax.jit(lambda ts: trainer.train_step(ts, x, y))(trainer.init(jax.random.key(0)))
    _, top = trainer.train_step(trainer.init(jax.random.key(0)), x, y)
    assert float(outer["loss"]) == float(top["loss"])


@pytest.mark.parametrize("trainable", [None, "logits/*"])
def test_the_compiled_step_is_called_as_the_step(trainable):
    """jax's ahead-of-time idiom: ``train_step.lower(ts, x, y).compile()`` is called with
    ``(ts, x, y)`` and gives the step's results, frozen weights (a step whose frozen part
    is passed apart) or not; its analyses are jax's."""
    model = mg.compile(mlp(4, (8,), 3))
    x, y = jnp.arange(32.0).reshape(8, 4) / 32, jnp.arange(8) % 3
    trainer = Trainer(model, optax.sgd(0.1), trainable=trainable)
    compiled = trainer.train_step.lower(trainer.init(jax.random.key(0)), x, y).compile()
    assert compiled.memory_analysis().temp_size_in_bytes >= 0 and "HloModule" in compiled.as_text()
    ts_aot, m_aot = compiled(trainer.init(jax.random.key(0)), x, y)
    traced = trainer.train_step.trace(trainer.init(jax.random.key(0)), x, y)
    assert "dot_general" in str(traced.jaxpr)
    _, m_traced = traced.lower().compile()(trainer.init(jax.random.key(0)), x, y)
    ts_jit, m_jit = trainer.train_step(trainer.init(jax.random.key(0)), x, y)
    assert float(m_aot["loss"]) == float(m_jit["loss"]) == float(m_traced["loss"])
    for a, b in zip(jax.tree.leaves(ts_aot.params), jax.tree.leaves(ts_jit.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    frozen_kernel = ts_aot.params["dense"]["kernel"]
    changed = not np.array_equal(frozen_kernel, trainer.init(jax.random.key(0)).params["dense"]["kernel"])
    assert changed == (trainable is None)


def test_bad_options_are_config_errors():
    model = mg.compile(mlp(4, (8,), 3))
    with pytest.raises(mg.ConfigError, match=f"did you mean '{REGION}'"):
        Trainer(model, optax.sgd(0.1), compiler_options={REGION + "s": True})
    with pytest.raises(mg.ConfigError, match="xla_backend_optimization_level.*not a valid int32"):
        Trainer(model, optax.sgd(0.1), compiler_options={"xla_backend_optimization_level": "fast"})
    with pytest.raises(mg.ConfigError, match="values are booleans, numbers or strings, got list"):
        Trainer(model, optax.sgd(0.1), compiler_options={REGION: [True]})
    with pytest.raises(mg.ConfigError, match="a mapping of XLA option names"):
        Trainer(model, optax.sgd(0.1), compiler_options=[(REGION, True)])
