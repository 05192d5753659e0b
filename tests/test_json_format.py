"""The JSON form of graphs (mlaxgraph/io/json_format.py, docs/file_format.md): round
trips of every example graph and of compiled graphs with Cast nodes, the schema's
fields, deterministic text, and functions by registered name only."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import examples, ops
from mlaxgraph.io import functions
from mlaxgraph.io.json_format import FORMAT, VERSION, RecordedSource, graph_from_json, graph_to_json
from mlaxgraph.ir import Block
from mlaxgraph.ops import attention, embedding, initializers, recurrent

EXAMPLES = {
    "mlp": examples.mlp,
    "mlp_dropout": lambda: examples.mlp(dropout=0.2),
    "residual_cnn": examples.residual_cnn,
    "transformer_block": examples.transformer_block,
    "transformer_causal_dropout": lambda: examples.transformer_block(causal=True, dropout=0.1),
    "lstm_classifier": examples.lstm_classifier,
}


def op_names(graph):
    return {node.op.op_name for _, node in graph.walk()}


@pytest.mark.parametrize("build", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_example_graphs_round_trip(build):
    graph = build()
    text = graph.to_json()
    loaded = mg.Graph.from_json(text)
    assert loaded == graph and hash(loaded) == hash(graph)
    assert str(loaded) == str(graph)  # the printed IR, nested blocks included
    assert loaded.to_json() == text  # writing it again gives the same bytes
    for (_, a), (_, b) in zip(graph.walk(), loaded.walk(), strict=True):
        assert (a.source.file, a.source.line, a.source.function) == \
            (b.source.file, b.source.line, b.source.function)


@pytest.mark.parametrize("build", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_compiled_graphs_with_casts_round_trip(build):
    compiled = mg.compile(build(), mg.Policy(compute_dtype="bfloat16")).graph
    assert "cast" in op_names(compiled)
    loaded = graph_from_json(graph_to_json(compiled))
    assert loaded == compiled
    casts = [n for _, n in loaded.walk() if n.op.op_name == "cast"]
    assert casts and all(c.op.inserted for c in casts if c.op.dtype == np.dtype("bfloat16"))


def test_residual_block_is_a_nested_graph_in_the_file():
    data = json.loads(examples.residual_cnn().to_json())
    (block,) = [n for n in data["graph"]["nodes"] if n["op"] == "block"]
    inner = block["attrs"]["graph"]["$graph"]
    assert inner["name"] == "res1" and inner["inputs"] == ["x"]
    assert [n["op"] for n in inner["nodes"]][:3] == ["input", "conv", "batch_norm"]
    loaded = mg.Graph.from_json(json.dumps(data))
    assert isinstance(loaded.node("res1").op, Block)
    assert loaded.node("res1").op.graph == examples.residual_block(16, "res1")


def test_schema_fields():
    x = mg.Input(("batch", 8, 8, 3), name="image")
    h = ops.Conv(4, (3, 3), padding=((1, 1), (0, 2)), name="conv")(x)
    h = ops.cast(ops.Flatten()(h), "bfloat16")
    graph = mg.Graph(x, h, name="schema")
    data = json.loads(graph.to_json())
    assert sorted(data) == ["format", "graph", "version"]
    assert (data["format"], data["version"]) == (FORMAT, VERSION) == ("mlaxgraph.graph", 1)
    assert sorted(data["graph"]) == ["inputs", "name", "nodes", "outputs"]
    assert data["graph"]["outputs"] == [["cast", 0]]
    image, conv, flatten, cast = data["graph"]["nodes"]
    assert sorted(conv) == ["attrs", "inputs", "layer", "name", "op", "outputs", "source"]
    assert image["attrs"]["shape"] == [{"$dim": "batch"}, 8, 8, 3]
    assert image["outputs"] == [{"shape": ["batch", 8, 8, 3], "dtype": "float32"}]
    assert conv["inputs"] == [["image", 0]]
    assert conv["attrs"]["kernel_size"] == [3, 3]            # tuples are arrays
    assert conv["attrs"]["padding"] == [[1, 1], [0, 2]]      # nested tuples too
    assert conv["attrs"]["kernel_init"] is None
    assert flatten["outputs"] == [{"shape": ["batch", 256], "dtype": "float32"}]
    assert cast["attrs"] == {"dtype": {"$dtype": "bfloat16"}, "inserted": False}
    assert cast["outputs"][0]["dtype"] == "bfloat16"
    assert conv["source"]["file"] == __file__ and isinstance(conv["source"]["line"], int)
    assert mg.Graph.from_json(json.dumps(data)) == graph


def test_symbolic_dim_expressions_round_trip():
    x = mg.Input(("batch", 6), name="x")
    doubled = ops.concat([x, x], axis=0)  # (2*batch, 6)
    y = ops.Linear(3)(ops.Reshape((2, 3))(doubled))
    graph = mg.Graph(x, y, name="dims")
    text = graph.to_json()
    assert '"2*batch"' in text
    loaded = mg.Graph.from_json(text)
    assert loaded == graph
    assert str(loaded.output_specs[0]) == "f32[2*batch,2,3]"


def test_output_is_deterministic():
    # Two builds of the same code (same source lines) give the same bytes.
    first, second = [examples.transformer_block(causal=True) for _ in range(2)]
    assert first is not second and first.to_json() == second.to_json()
    assert first.to_json(indent=2) == second.to_json(indent=2)
    # Equal graphs built at different lines differ only in their sources; without
    # sources the text is a function of the graph's value alone.
    other = examples.transformer_block(causal=True)
    assert other == first
    assert graph_to_json(other, sources=False) == graph_to_json(first, sources=False)
    text = first.to_json()
    assert text.isascii() and "\n" not in text
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert json.loads(first.to_json(indent=1)) == json.loads(text)


def test_without_sources():
    graph = examples.mlp()
    data = json.loads(graph_to_json(graph, sources=False))
    assert all(node["source"] is None for node in data["graph"]["nodes"])
    loaded = graph_from_json(json.dumps(data))
    assert loaded == graph and all(node.source is None for node in loaded)


def test_loaded_sources_are_shown_but_never_read(tmp_path):
    secret = tmp_path / "secret.py"
    secret.write_text("TOP SECRET LINE\n")
    graph = examples.mlp()
    data = json.loads(graph.to_json())
    for node in data["graph"]["nodes"]:
        node["source"] = {"file": str(secret), "line": 1, "function": "f"}
    # The Linear claims an output shape its op does not produce: the error names the
    # recorded file:line but does not quote that file's contents.
    data["graph"]["nodes"][1]["outputs"][0]["shape"] = ["batch", 7]
    with pytest.raises(mg.SerializationError) as info:
        graph_from_json(json.dumps(data))
    message = str(info.value)
    assert f"{secret}:1" in message and "TOP SECRET" not in message
    assert isinstance(info.value.__cause__, mg.ShapeError)
    data["graph"]["nodes"][1]["outputs"][0]["shape"] = ["batch", 128]
    loaded = graph_from_json(json.dumps(data))
    assert isinstance(loaded.node("dense").source, RecordedSource)
    assert loaded.node("dense").source.code() == ""


def test_weight_sharing_round_trips_with_one_op_object():
    x = mg.Input(("batch", 4), name="x")
    shared = ops.Linear(4, name="shared")
    block = examples.mlp(4, (3,), 4)
    y = block(shared(shared(x)))
    y = block(y)  # the same block twice: shared weights
    graph = mg.Graph(x, y, name="sharing")
    loaded = mg.Graph.from_json(graph.to_json())
    assert loaded == graph
    assert loaded.node("shared@1").op is loaded.node("shared").op
    assert loaded.node("mlp@1").shares_weights
    assert loaded.node("mlp@1").op is loaded.node("mlp").op


def test_loaded_graph_computes_the_same():
    graph = examples.mlp(6, (5,), 3)
    loaded = mg.Graph.from_json(graph.to_json())
    model, model2 = mg.compile(graph), mg.compile(loaded)
    # Weights of the shapes init makes, without running the initializers (fast).
    rng = np.random.default_rng(0)
    params, state = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype),
                                 jax.eval_shape(model2.init_fn, jax.random.key(0)))
    x = jnp.arange(12.0, dtype=jnp.float32).reshape(2, 6)
    out, _ = model.apply_fn(params, state, x)
    out2, _ = model2.apply_fn(params, state, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out2))


def test_non_finite_and_list_attribute_values():
    x = mg.Input(("batch", 4), name="x")
    graph = mg.Graph(x, ops.LayerNorm(epsilon=float("inf"), name="ln")(x), name="odd")
    data = json.loads(graph.to_json())
    assert data["graph"]["nodes"][1]["attrs"]["epsilon"] == {"$float": "inf"}
    assert mg.Graph.from_json(graph.to_json()) == graph
    reader = __import__("mlaxgraph.io.json_reader", fromlist=["Reader"]).Reader()
    assert reader.value({"$list": [1, [2, 3]]}, "v", 0, 0) == [1, (2, 3)]
    assert np.isnan(reader.value({"$float": "nan"}, "v", 0, 0))


# --- functions ------------------------------------------------------------------------


def my_unregistered_activation(x):
    return jnp.tanh(x) * 2


def test_unregistered_function_cannot_be_written():
    x = mg.Input(("batch", 4), name="x")
    graph = mg.Graph(x, ops.F(my_unregistered_activation)(x), name="uses_f")
    with pytest.raises(mg.SerializationError) as info:
        graph.to_json()
    message = str(info.value)
    assert "my_unregistered_activation" in message and "not registered" in message
    assert "mg.register_function(" in message and "'my_unregistered_activation'" in message


def test_unregistered_initializer_cannot_be_written():
    def my_init(key, shape, dtype):
        return jnp.zeros(shape, dtype)

    x = mg.Input(("batch", 4), name="x")
    graph = mg.Graph(x, ops.Linear(2, kernel_init=my_init, name="fc")(x), name="uses_init")
    with pytest.raises(mg.SerializationError, match=r"layer 'fc' .*kernel_init.*my_init.*register_function"):
        graph.to_json()
    with pytest.raises(mg.SerializationError, match="not registered"):
        mg.save("never_written.mlg", graph, {}, {})


def scaled_softsign(x):
    return x / (1 + jnp.abs(x)) * 3


def noisy(x, rng=None):
    return x if rng is None else x + jax.random.normal(rng, x.shape, x.dtype)


def half_init(key, shape, dtype):
    return jnp.full(shape, 0.5, dtype)


mg.register_function("tests.json_format.scaled_softsign", scaled_softsign)
mg.register_function("tests.json_format.noisy", noisy)
mg.register_function("tests.json_format.half_init")(half_init)


def test_registered_functions_round_trip():
    x = mg.Input(("batch", 4), name="x")
    h = ops.F(scaled_softsign)(x)
    h = ops.F(noisy, needs_rng=True)(h)
    y = ops.Linear(3, kernel_init=half_init, name="fc")(h)
    graph = mg.Graph(x, y, name="functions")
    data = json.loads(graph.to_json())
    attrs = [n["attrs"] for n in data["graph"]["nodes"]]
    assert attrs[1] == {"fn": {"$function": "tests.json_format.scaled_softsign"}, "needs_rng": False}
    assert attrs[3]["kernel_init"] == {"$function": "tests.json_format.half_init"}
    loaded = mg.Graph.from_json(graph.to_json())
    assert loaded == graph
    assert loaded.node("scaled_softsign").op.fn is scaled_softsign
    model = mg.compile(loaded)
    params, state = model.init_fn(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(params["fc"]["kernel"]), np.full((4, 3), 0.5, np.float32))
    out, _ = model.apply_fn(params, state, jnp.ones((2, 4)), inference_mode=True)
    np.testing.assert_allclose(np.asarray(out), np.full((2, 3), 4 * 0.5 * 1.5), rtol=1e-6)


def test_function_registry_rules():
    assert functions.function_name(scaled_softsign) == "tests.json_format.scaled_softsign"
    assert functions.lookup_function("tests.json_format.noisy") is noisy
    assert functions.function_name(my_unregistered_activation) is None
    # Registering again under the same name is a no-op; a taken name is an error.
    assert mg.register_function("tests.json_format.noisy", noisy) is noisy
    with pytest.raises(mg.SerializationError, match="already registered"):
        mg.register_function("tests.json_format.noisy", scaled_softsign)
    # A redefinition (same module and name: a notebook cell run again) takes it over.
    namespace = {"__name__": __name__}
    exec("def noisy(x, rng=None):\n    return x\n", namespace)
    assert mg.register_function("tests.json_format.noisy_again", noisy) is noisy
    mg.register_function("tests.json_format.noisy_again", namespace["noisy"])
    assert functions.lookup_function("tests.json_format.noisy_again") is namespace["noisy"]
    for bad in ("", "has space", "x" * 300, "semi;colon", 3, "__import__('os')"):
        with pytest.raises(mg.SerializationError, match="function name"):
            mg.register_function(bad, noisy)
    with pytest.raises(mg.SerializationError, match="not registered"):
        functions.lookup_function("os.system")
    with pytest.raises(mg.SerializationError, match="callable"):
        mg.register_function("tests.json_format.not_callable", 42)


def test_mlaxgraph_initializers_are_registered():
    expected = {
        initializers.zeros: "mlaxgraph.initializers.zeros",
        initializers.ones: "mlaxgraph.initializers.ones",
        initializers.lecun_normal: "mlaxgraph.initializers.lecun_normal",
        initializers.lecun_normal_conv_channels_last: "mlaxgraph.initializers.lecun_normal_conv_channels_last",
        initializers.lecun_normal_conv_channels_first: "mlaxgraph.initializers.lecun_normal_conv_channels_first",
        recurrent.orthogonal: "mlaxgraph.recurrent.orthogonal",
        recurrent.lstm_bias: "mlaxgraph.recurrent.lstm_bias",
        attention._head_kernel: "mlaxgraph.attention.head_kernel",
        attention._out_kernel: "mlaxgraph.attention.out_kernel",
        embedding.normal: "mlaxgraph.embedding.normal",
    }
    for fn, name in expected.items():
        assert functions.function_name(fn) == name
        assert functions.lookup_function(name) is fn
    x = mg.Input(("batch", 5, 3), name="x")
    y = ops.LSTM(4, kernel_init=initializers.zeros, recurrent_init=recurrent.orthogonal,
                 bias_init=recurrent.lstm_bias, name="lstm")(x)
    graph = mg.Graph(x, y, name="inits")
    assert mg.Graph.from_json(graph.to_json()) == graph


def test_bad_indent_and_non_graph():
    with pytest.raises(mg.SerializationError):
        graph_to_json(examples.mlp(), indent=-1)
    with pytest.raises(mg.SerializationError):
        graph_to_json("not a graph")
