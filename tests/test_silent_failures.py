"""Mistakes that used to pass without a word: an Input whose first dim fixes the batch
size, embedding ids out of range and NaN or inf activations (found with
``mg.compile(..., checks=True)``), and a model output that does not fit the loss's
targets in the Trainer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mlaxgraph as mg
from mlaxgraph import ops

THIS_FILE = __file__.rsplit("/", 1)[-1]

# --- a fixed first dim --------------------------------------------------------------------


def test_a_fixed_first_dim_is_named_with_its_symbolic_form():
    x = mg.Input((28, 28, 1))          # line 23: Keras's habit, the batch dim left out
    model = mg.compile(mg.Graph(x, ops.Linear(10)(ops.Flatten()(x))))
    params, state = model.init(jax.random.key(0))
    out, _ = model.apply(params, state, jnp.ones((28, 28, 1)))   # the shape it was given
    assert out.shape == (28, 10)
    with pytest.raises(mg.ShapeError) as info:
        model.apply(params, state, jnp.ones((32, 28, 28, 1)))
    message = str(info.value)
    assert "The graph's first dim is fixed" in message
    assert 'mg.Input(("batch", 28, 28, 1))' in message
    assert "float32[32, 28, 28, 1]" in message and f"{THIS_FILE}:23" in message
    with pytest.raises(mg.ShapeError, match=r'first dim is fixed.*mg.Input\(\("batch", 28, 1\)\)'):
        model.apply(params, state, jnp.ones((16, 28, 1)))


def test_other_shape_errors_get_no_batch_hint():
    x = mg.Input(("batch", 4))
    model = mg.compile(mg.Graph(x, ops.Linear(2)(x)))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError) as info:
        model.apply(params, state, jnp.ones((3, 5)))
    assert "first dim is fixed" not in str(info.value)


def test_an_image_with_its_channels_on_the_other_side_is_named_with_the_transpose():
    nhwc = mg.Input(("batch", 8, 6, 3), name="image")
    model = mg.compile(mg.Graph(nhwc, ops.Conv(4, (3, 3), name="conv")(nhwc)))
    params, state = model.init(jax.random.key(0))
    nchw = np.ones((2, 3, 8, 6), np.float32)
    with pytest.raises(mg.ShapeError, match=r"channels first: the graph takes them last; "
                                            r"jnp.transpose\(x, \(0, 2, 3, 1\)\)"):
        model.apply(params, state, nchw)
    out, _ = model.apply(params, state, np.transpose(nchw, (0, 2, 3, 1)))  # the hint, followed
    assert out.shape == (2, 6, 4, 4)
    first = mg.Input(("batch", 3, 8), name="signal")   # NCW, given NWC
    model = mg.compile(mg.Graph(first, ops.Conv(4, (3,), data_format="NCW", name="conv")(first)))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError, match=r"channels on the other side \(first against "
                                            r"last\): jnp.transpose\(x, \(0, 2, 1\)\)"):
        model.apply(params, state, np.ones((2, 8, 3), np.float32))
    with pytest.raises(mg.ShapeError, match=r"channels last: the graph takes them first; "
                                            r"jnp.transpose\(x, \(0, 3, 1, 2\)\)"):
        volume = mg.Input(("batch", 2, 5, 7), name="v")
        m3 = mg.compile(mg.Graph(volume, ops.Conv(4, (3, 3), data_format="NCHW")(volume)))
        m3.apply(*m3.init(jax.random.key(0)), np.ones((1, 5, 7, 2), np.float32))
    with pytest.raises(mg.ShapeError) as info:   # another shape altogether: no such hint
        model.apply(params, state, np.ones((2, 5, 8), np.float32))
    assert "jnp.transpose(x" not in str(info.value)


def test_a_list_given_to_apply_is_named_with_the_conversion():
    x = mg.Input(("batch", 3), name="x")
    model = mg.compile(mg.Graph(x, ops.Linear(2)(x)))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError, match=r"layer 'x' \(op input\): apply takes arrays \(JAX's "
                                            r"or NumPy's\), got a list: pass jnp.asarray\(x\)"):
        model.apply(params, state, [[1.0, 2.0, 3.0]])
    out, _ = model.apply(params, state, jnp.asarray([[1.0, 2.0, 3.0]]))  # the hint, followed
    assert out.shape == (1, 2)


def test_keyword_arguments_a_function_does_not_take_name_the_one_meant():
    x = mg.Input(("batch", 3), name="x")
    graph = mg.Graph(x, ops.Linear(2, name="fc")(x))
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    cases = [
        (lambda: model.apply(params, state, jnp.ones((2, 3)), inference_mod=True),
         r"apply got unexpected keyword argument 'inference_mod' \(did you mean inference_mode\?\); "
         r"it takes apply\(params, state, \*inputs, rng=None"),
        (lambda: model.apply(params, state, jnp.ones((2, 3)), training=False),
         r"'training' \(Keras's training=True is inference_mode=False\)"),
        (lambda: model.init(jax.random.key(0), resue=(params, state)),
         r"init got unexpected keyword argument 'resue' \(did you mean reuse\?\)"),
        (lambda: mg.quantize(graph, "int8", target="fc"),
         r"quantize got unexpected keyword argument 'target' \(did you mean targets\?\)"),
        (lambda: mg.quantize(graph, "int8", method="gptq"),
         r"'method' \(method is mg\.quantize_weights's\)"),
        (lambda: mg.quantize_weights(mg.quantize(graph, "int8"), params, state, group_size=32),
         r"quantize_weights got unexpected keyword argument 'group_size' \(group_size is "
         r"mg\.quantize's\)"),
        # the peers' spellings: PEFT's LoraConfig, Keras's compile and fit, generate's
        (lambda: mg.lora(graph, "fc", rank=2, lora_alpha=4),
         r"lora got unexpected keyword argument 'lora_alpha' \(PEFT's lora_alpha is alpha=\)"),
        (lambda: mg.lora(graph, "fc", rank=2, target_modules=["fc"]),
         r"'target_modules' \(PEFT's target_modules are lora's second argument, targets\)"),
        (lambda: mg.lora(graph, "fc", rank=2, dropuot=0.1),
         r"'dropuot' \(did you mean dropout\?\); it takes lora\(graph, targets, \*, rank"),
        (lambda: mg.train.Trainer(model, optax.sgd(0.1), learning_rate=0.1),
         r"Trainer got unexpected keyword argument 'learning_rate' \(the learning rate is the "
         r"optimizer's: optax.adam\(learning_rate\)\)"),
        (lambda: mg.train.Trainer(model, optax.sgd(0.1), epochs=3),
         r"'epochs' \(epochs is fit's: trainer.fit\(ts, \(inputs, targets\), epochs=...\)\)"),
        (lambda: mg.train.Trainer(model, optax.sgd(0.1), metric=("accuracy",)),
         r"'metric' \(did you mean metrics\?\)"),
        (lambda: trainer.fit(ts, data, epochs=1, batch_size=2, validation_data=data),
         r"fit got unexpected keyword argument 'validation_data' \(Keras's validation_data is "
         r"validation=\)"),
        (lambda: trainer.fit(ts, data, epochs=1, batch_size=2, verbose=0),
         r"'verbose' \(Keras's verbose is progress=\)"),
        (lambda: graph.summary(expand=True),
         r"summary got unexpected keyword argument 'expand' \(did you mean expand_nested\?\)"),
        (lambda: model.summary(expand=True), r"summary got unexpected keyword argument 'expand'"),
        (lambda: model.export(inference=True),
         r"export got unexpected keyword argument 'inference' \(did you mean inference_mode\?\)"),
        (lambda: mg.compile(graph, polcy="bfloat16"),
         r"compile got unexpected keyword argument 'polcy' \(did you mean policy\?\)"),
        (lambda: mg.compile(graph, dtype="bfloat16"),
         r"'dtype' \(the dtypes are the policy's: policy='bfloat16' or mg.Policy"),
        (lambda: mg.compile(graph, policy="bfloat"),
         r"unknown policy 'bfloat' \(did you mean 'bfloat16'\?\)"),
        (lambda: graph.to_onnx(None, params, state, opset_version=17),
         r"to_onnx got unexpected keyword argument 'opset_version' \(torch.onnx.export's "
         r"opset_version is opset=\)"),
        (lambda: model.to_onnx(None, params, state, dynamic_axes={"x": {0: "batch"}}),
         r"'dynamic_axes' \(the graph's symbolic dims are written as dim_param: they are "
         r"dynamic already\)"),
    ]
    trainer = mg.train.Trainer(model, optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    data = (np.ones((4, 3), np.float32), np.zeros(4, np.int32))
    for call, message in cases:
        with pytest.raises(mg.MlaxGraphError, match=message):
            call()
    lm = mg.models.gpt2({"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32})
    with pytest.raises(mg.ConfigError, match=r"decoder got unexpected keyword argument "
                                             r"'max_new_tokens' \(max_new_tokens is "
                                             r"mg.generate's, which takes a decoder\)"):
        mg.decoder(lm, max_length=16, max_new_tokens=4)
    with pytest.raises(mg.ConfigError, match=r"'dtype' \(did you mean cache_dtype\?\)"):
        mg.decoder(lm, max_length=16, dtype=jnp.bfloat16)
    assert int(ts.step) == 0  # nothing ran


def test_the_readers_name_the_peers_keywords_before_reading_anything():
    """The functions that bring a model or its weights in take the peers' spellings
    (onnxruntime's, torch's, transformers' and PEFT's) as a ConfigError naming the
    argument meant, before any file is opened (the sources here do not exist)."""
    lm = mg.models.gpt2({"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32})
    cases = [
        (lambda: mg.from_onnx("missing.onnx", providers=["CPUExecutionProvider"]),
         r"from_onnx got unexpected keyword argument 'providers' \(onnxruntime's providers "
         r"are not needed; the graph runs on JAX's devices"),
        (lambda: mg.from_onnx("missing.onnx", input_shapes={"x": (1, 3)}),
         r"'input_shapes' \(input_shapes is shapes=: \{input name: shape\}\)"),
        (lambda: mg.from_onnx("missing.onnx", dim={"batch": 2}),
         r"'dim' \(did you mean dims\?\); it takes from_onnx\(source, dims=None"),
        (lambda: mg.from_torch("missing", kwargs={"x": 1}),
         r"from_torch got unexpected keyword argument 'kwargs' \(keyword inputs are not taken"),
        (lambda: mg.from_torch("missing", dynamic_axes={"x": {0: "batch"}}),
         r"'dynamic_axes' \(torch.onnx.export's dynamic_axes are dynamic_shapes="),
        (lambda: mg.models.load_state_dict(lm, "missing", torch_dtype="bfloat16"),
         r"load_state_dict got unexpected keyword argument 'torch_dtype' \(transformers' "
         r"torch_dtype is dtype=\)"),
        (lambda: mg.models.load_state_dict(lm, "missing", stric=False),
         r"'stric' \(did you mean strict\?\); it takes load_state_dict\(graph, state_dict"),
        (lambda: mg.models.load_state_dict(lm, "missing", map_location="cpu"),
         r"'map_location' \(torch.load's map_location is not needed: the arrays are read as "
         r"NumPy on the host"),
        (lambda: mg.models.to_state_dict(lm, {}, adapters_only=True),
         r"to_state_dict got unexpected keyword argument 'adapters_only' \(did you mean "
         r"adapter_only\?\)"),
        (lambda: mg.models.lora_from_peft(lm, "missing", is_trainable=True),
         r"lora_from_peft got unexpected keyword argument 'is_trainable' \(adapters are "
         r"weights like the others: mg.train.Trainer\(..., trainable='\*/lora_\*'\)"),
        (lambda: mg.models.lora_from_peft(lm, "missing", adapter_name="default"),
         r"'adapter_name' \(PEFT's adapter_name is not needed: one adapter a graph"),
        (lambda: mg.models.lora_from_peft(lm, config={"r": 2}),
         r"lora_from_peft got unexpected keyword argument 'config' \(a config is given as folder"),
        (lambda: mg.models.lora_from_peft(lm),
         r"lora_from_peft needs the adapter's folder \(or its config as a dict\)"),
        (lambda: mg.models.save_adapter(lm, {}, "missing", modules_to_safe=[]),
         r"save_adapter got unexpected keyword argument 'modules_to_safe' \(did you mean "
         r"modules_to_save\?\)"),
        (lambda: mg.models.save_adapter(lm, {}, "missing", task_type="CAUSAL"),
         r"save_adapter: task_type must be one of PEFT's SEQ_CLS, .* got 'CAUSAL' \(did you mean "
         r"'CAUSAL_LM'\?\)"),
        (lambda: mg.decoder(lm, max_new_tokens=32),
         r"decoder got unexpected keyword argument 'max_new_tokens' \(max_new_tokens is mg.generate's"),
        (lambda: mg.decoder(lm),
         r"decoder needs max_length=, the cache's slots"),
    ]
    for call, message in cases:
        with pytest.raises(mg.ConfigError, match=message):
            call()


@pytest.mark.parametrize("function, written", [
    ("compile", "mlaxgraph.compiler.compile._COMPILE_SIGNATURE"),
    ("lora", "mlaxgraph.adapters.lora_arguments.LORA_SIGNATURE"),
    ("train.Trainer", "mlaxgraph.train.arguments.TRAINER_SIGNATURE"),
    ("train.fit", "mlaxgraph.train.fit._FIT_SIGNATURE"),
    ("from_onnx", "mlaxgraph.onnx.arguments.FROM_ONNX_SIGNATURE"),
    ("from_torch", "mlaxgraph.aten.api.FROM_TORCH_SIGNATURE"),
    ("models.load_state_dict", "mlaxgraph.models.arguments.LOAD_STATE_DICT_SIGNATURE"),
    ("models.to_state_dict", "mlaxgraph.models.arguments.TO_STATE_DICT_SIGNATURE"),
    ("models.lora_from_peft", "mlaxgraph.models.arguments.LORA_FROM_PEFT_SIGNATURE"),
    ("models.save_adapter", "mlaxgraph.models.arguments.SAVE_ADAPTER_SIGNATURE"),
])
def test_the_signatures_the_messages_write_out_are_the_functions(function, written):
    """An unknown keyword's message lists what the function takes, written out once: it
    names the function's own parameters, no more and no fewer."""
    import importlib
    import inspect
    import re

    target = mg
    for part in function.split("."):
        target = getattr(target, part)
    module, _, name = written.rpartition(".")
    text = getattr(importlib.import_module(module), name)
    real = [p.name for p in inspect.signature(target).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in ("self", "trainer")]
    assert re.findall(r"[(,]\s*\**(\w+)", text) == real


def test_params_and_state_swapped_are_named():
    x = mg.Input(("batch", 3), name="x")
    model = mg.compile(mg.Graph(x, ops.BatchNorm(name="bn")(ops.Linear(2, name="fc")(x))))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(mg.GraphError, match=r"layer 'fc' \(op linear\): params has no entry 'fc'.*"
                                            r"state has it: params and state are swapped"):
        model.apply(state, params, jnp.ones((2, 3)))
    with pytest.raises(mg.GraphError, match=r"params has no entry 'fc'; pass the params made by "
                                            r"this model's init\n"):  # nowhere else: no swap named
        model.apply({}, state, jnp.ones((2, 3)))


def test_one_hot_targets_for_class_ids_are_named():
    x = mg.Input(("batch", 4), name="x")
    trainer = mg.train.Trainer(mg.compile(mg.Graph(x, ops.Linear(3, name="logits")(x))),
                               optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError, match=r"shaped like the output, as one-hot or soft targets "
                                            r"are: give class ids \(targets.argmax\(-1\)\), or "
                                            r"the loss that takes them: "
                                            r"loss=optax.softmax_cross_entropy"):
        trainer.eval_step(ts, jnp.ones((5, 4)), jnp.eye(3)[jnp.arange(5) % 3])
    soft = mg.train.Trainer(trainer.model, optax.sgd(0.1), loss=optax.softmax_cross_entropy)
    metrics = soft.eval_step(soft.init(jax.random.key(0)), jnp.ones((5, 4)),
                             jnp.eye(3)[jnp.arange(5) % 3])
    assert np.isfinite(float(metrics["loss"]))


# --- checks=True --------------------------------------------------------------------------


def embedding_model(checks):
    ids = mg.Input(("batch", 5), "int32", name="ids")
    h = ops.Embedding(10, 4, name="embed")(ids)
    return mg.compile(mg.Graph(ids, ops.Linear(3, name="head")(h)), checks=checks)


def test_out_of_range_ids_are_reported_by_layer():
    model = embedding_model(checks=True)
    params, state = model.init(jax.random.key(0))
    ids = np.array([[0, 1, 2, 3, 9], [4, 5, 6, 7, 8]], np.int32)
    out, _ = model.apply(params, state, ids)
    table = np.asarray(params["embed"]["embedding"], np.float64)
    expected = table[ids] @ np.asarray(params["head"]["kernel"]) + np.asarray(params["head"]["bias"])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    for bad in (10, -1):
        ids[1, 2] = bad
        with pytest.raises(mg.CheckError, match=r"layer 'embed' \(op embedding\): an id is out of "
                                                r"range: ids must be in \[0, 10\)"):
            model.apply(params, state, ids)
    # Unchecked, the same ids give NaN rows (the documented behaviour) and no error.
    unchecked = embedding_model(checks=False)
    out, _ = unchecked.apply(params, state, ids)
    assert np.isnan(np.asarray(out)[1, 2]).all() and np.isfinite(np.asarray(out)[0]).all()


def test_nan_and_inf_are_reported_by_the_first_layer_that_makes_them():
    x = mg.Input(("batch", 3), name="x")
    inner_x = mg.Input(("batch", 3), name="x")
    block = mg.Graph(inner_x, ops.F(jnp.log, name="log")(inner_x), name="stats")
    y = ops.Linear(2, name="fc")(block(ops.relu(x)))
    model = mg.compile(mg.Graph(x, y), checks=True)
    params, state = model.init(jax.random.key(0))
    out, _ = model.apply(params, state, jnp.full((2, 3), 2.0))
    np.testing.assert_allclose(out, np.full((2, 3), np.log(2.0)) @ np.asarray(params["fc"]["kernel"])
                               + np.asarray(params["fc"]["bias"]), rtol=1e-5)
    with pytest.raises(mg.CheckError, match=r"^layer 'stats/log' \(op function\): output 0 has inf$"):
        model.apply(params, state, jnp.full((2, 3), -1.0))    # relu -> 0 -> log: -inf
    # A NaN in the input: the first layer that reads it is named.
    with pytest.raises(mg.CheckError, match=r"^layer 'relu' \(op relu\): output 0 has NaN$"):
        model.apply(params, state, jnp.array([[np.nan, 1.0, 1.0], [1.0, 1.0, 1.0]], jnp.float32))


def test_without_checks_nothing_is_traced_for_them():
    checked, unchecked = embedding_model(checks=True), embedding_model(checks=False)
    assert checked.checks and not unchecked.checks
    default = embedding_model(checks=False)
    text = str(unchecked.jaxpr(batch=2))
    assert text == str(default.jaxpr(batch=2))
    assert "check" not in text and "is_finite" not in text and "isnan" not in text
    # The checked apply's functions are others; the unchecked apply_fn traces the same.
    assert str(jax.make_jaxpr(checked.apply_fn)(*checked.init(jax.random.key(0)),
                                                jnp.zeros((2, 5), jnp.int32))) == text


# --- the Trainer checks outputs against targets -------------------------------------------


def test_trainer_names_an_output_that_does_not_fit_the_targets():
    x = mg.Input(("batch", 8, 8, 3), name="image")
    y = ops.Linear(10, name="logits")(ops.Conv(4, (3, 3), padding="SAME", name="conv")(x))
    trainer = mg.train.Trainer(mg.compile(mg.Graph(x, y)), optax.sgd(0.1))
    ts = trainer.init(jax.random.key(0))
    images, labels = jnp.ones((4, 8, 8, 3)), jnp.zeros((4,), jnp.int32)
    with pytest.raises(mg.ShapeError) as info:
        trainer.train_step(ts, images, labels)
    message = str(info.value)
    assert "output 'logits' (float32[4, 8, 8, 10]) and targets int32[4]" in message
    assert "[4, 8, 8]" in message and "Flatten" in message
    with pytest.raises(mg.ShapeError, match="'logits'"):
        trainer.eval_step(ts, images, labels)
    with pytest.raises(mg.DTypeError, match="integer class ids"):
        trainer.eval_step(ts, images, jnp.zeros((4, 8, 8), jnp.float32))


def test_trainer_checks_the_regression_losses_and_several_outputs():
    x = mg.Input(("batch", 4), name="x")
    y = ops.Linear(2, name="out")(x)
    trainer = mg.train.Trainer(mg.compile(mg.Graph(x, y)), optax.sgd(0.1), loss="mean_squared_error")
    ts = trainer.init(jax.random.key(0))
    with pytest.raises(mg.ShapeError, match=r"output 'out' .* takes targets of the output's shape \[3, 2\]"):
        trainer.eval_step(ts, jnp.ones((3, 4)), jnp.ones((3,)))   # would broadcast silently
    metrics = trainer.eval_step(ts, jnp.ones((3, 4)), jnp.ones((3, 2)))
    out = np.ones((3, 4)) @ np.asarray(ts.params["out"]["kernel"]) + np.asarray(ts.params["out"]["bias"])
    np.testing.assert_allclose(metrics["loss"], np.mean((out - 1.0) ** 2), rtol=1e-5)
    two = mg.Graph(x, [ops.Linear(2, name="a")(x), ops.Linear(2, name="b")(x)])
    trainer = mg.train.Trainer(mg.compile(two), optax.sgd(0.1))
    with pytest.raises(mg.ShapeError, match="takes one model output, and the graph has 2"):
        trainer.eval_step(trainer.init(jax.random.key(0)), jnp.ones((3, 4)), jnp.zeros((3,), jnp.int32))


def test_base_params_given_to_an_adapted_model_name_init_with_reuse():
    """A LoRA-adapted model's apply given the base model's params (the adapters missing)
    names the init that makes the adapters and keeps the base weights."""
    x = mg.Input(("batch", 3), name="x")
    graph = mg.Graph(x, ops.Linear(2, name="fc")(ops.Linear(4, name="hidden")(x)))
    base = mg.compile(graph)
    params, state = base.init(jax.random.key(0))
    adapted = mg.compile(mg.lora(graph, "hidden", rank=2))
    with pytest.raises(mg.GraphError, match=r"layer 'hidden.lora_A' \(op linear\): params has no "
                                            r"entry 'hidden.lora_A'; .*an adapted graph's init "
                                            r"makes the adapters and keeps the base weights given: "
                                            r"params, state = model.init\(key, reuse=\(base_params, "
                                            r"base_state\)\)"):
        adapted.apply(params, state, jnp.ones((2, 3)))
    with pytest.raises(mg.GraphError) as plain:  # a base layer's weight missing: no such hint
        base.apply({"fc": params["fc"]}, state, jnp.ones((2, 3)))
    assert "init(key, reuse=" not in str(plain.value)
    new_params, new_state = adapted.init(jax.random.key(1), reuse=(params, state))  # the hint
    np.testing.assert_array_equal(adapted.apply(new_params, new_state, jnp.ones((2, 3)))[0],
                                  base.apply(params, state, jnp.ones((2, 3)))[0])
    # the other way: the adapted params given to the base model, which would ignore the
    # (trained) adapters and give the base model's outputs
    with pytest.raises(mg.GraphError, match=r"graph 'graph': params hold LoRA adapters' weights "
                                            r"\(hidden.lora_A, hidden.lora_B\) that it has no layer "
                                            r"for, so it would compute without them.*mg.merge_lora"):
        base.apply(new_params, new_state, jnp.ones((2, 3)))
    for call in (lambda: base.apply(new_params, new_state, jnp.ones((2, 3)), capture="hidden"),
                 lambda: mg.compile(graph, checks=True).apply(new_params, new_state, jnp.ones((2, 3)))):
        with pytest.raises(mg.GraphError, match=r"params hold LoRA adapters' weights"):
            call()   # with taps, and with run-time checks: the same refusal
    merged_graph, merged = mg.merge_lora(mg.lora(graph, "hidden", rank=2), new_params)
    assert mg.compile(merged_graph).apply(merged, new_state, jnp.ones((2, 3)))[0].shape == (2, 2)


def test_adapted_params_given_to_a_scanned_base_or_its_decoder_are_refused():
    """The refusal holds in every layout apply takes (a scanned run's weights stacked
    or per block) and for the decoder, and the adapted model takes both layouts."""
    g = mg.models.gpt2({"n_layer": 3, "n_embd": 16, "n_head": 2, "vocab_size": 40, "n_positions": 16})
    params, state = mg.compile(g).init(jax.random.key(0))
    adapted = mg.lora(g, ["h.*/attn/qkv", "h.*/mlp.c_fc"], rank=2)
    ap, ast = mg.compile(adapted).init(jax.random.key(1), reuse=(params, state))
    ids = jnp.ones((2, 5), jnp.int32)
    scanned = mg.compile(adapted, scan_blocks="always")
    stacked, stacked_state = scanned.stack_weights(ap, ast)
    want = mg.compile(adapted).apply(ap, ast, ids, inference_mode=True)[0]
    for p, s in ((ap, ast), (stacked, stacked_state)):   # per block, stacked: both taken
        np.testing.assert_allclose(scanned.apply(p, s, ids, inference_mode=True)[0], want,
                                   rtol=1e-5, atol=1e-6)
    base = mg.compile(g, scan_blocks="always")
    calls = {"stacked": lambda: base.apply(stacked, stacked_state, ids, inference_mode=True),
             "per block": lambda: base.apply(ap, ast, ids, inference_mode=True),
             "generate": lambda: mg.generate(g, ap, ast, ids, max_new_tokens=2),
             "prefill": lambda: mg.decoder(g, max_length=16).prefill(ap, ast, ids)}
    for where, call in calls.items():
        with pytest.raises(mg.GraphError, match=r"graph 'gpt2': params hold LoRA adapters' "
                                                r"weights \(h.0"):
            call()
    assert mg.generate(adapted, ap, ast, ids, max_new_tokens=2).shape == (2, 7)


def test_a_policy_given_by_name_is_policy_named():
    """``mg.compile(graph, policy="mixed_bfloat16")``, as Keras users name policies, is
    ``Policy.named``'s policy: the same casts and outputs."""
    x = mg.Input(("batch", 3), name="x")
    graph = mg.Graph(x, ops.Linear(2, name="fc")(x))
    by_name = mg.compile(graph, policy="mixed_bfloat16")
    explicit = mg.compile(graph, policy=mg.Policy.named("bfloat16"))
    assert by_name.policy == explicit.policy and by_name.policy.compute_dtype == jnp.bfloat16
    params, state = explicit.init(jax.random.key(0))
    a, _ = by_name.apply(params, state, jnp.ones((2, 3)))
    b, _ = explicit.apply(params, state, jnp.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
