"""apply's capture and intervene: captured values equal a run of the graph cut at that
layer, an identity intervention is bit for bit the plain output, zeroing an output
equals a graph computing zeros there; unscanned and scanned, with and without remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.ir.block import Block
from mlaxgraph.ir.node import Value

CONFIG = {"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16}
IDS = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 5) % 64
MODES = [(False, None), (False, "full"), ("always", None), ("always", "full")]


@pytest.fixture(scope="module")
def base():
    g = mg.models.gpt2(CONFIG)
    params, state = mg.compile(g).init(jax.random.key(0))
    return g, params, state


def model_and_weights(g, params, state, scan, remat):
    model = mg.compile(g, scan_blocks=scan, remat=remat)
    if scan:
        params, state = model.stack_weights(params, state)
    return model, params, state


def cut_at(g, block, layer):
    """``g`` ending at ``block/layer``'s output: the block's graph returns that layer's
    output and the top graph returns the block's (the rest is dead code)."""
    node = g.node(block)
    inner = node.op.graph.with_parts(outputs=(Value(layer),))
    nodes = tuple(n.replace(op=Block(inner, name=block)) if n.name == block else n for n in g.nodes)
    return g.with_parts(nodes=nodes, outputs=(Value(block),))


@pytest.mark.parametrize("scan,remat", MODES)
def test_capture_equals_the_graph_cut_there(base, scan, remat):
    g, params, state = base
    model, p, s = model_and_weights(g, params, state, scan, remat)
    out, _, captured = model.apply(p, s, IDS, inference_mode=True, capture=["h.*/attn", "h.2", "ln_f"])
    assert sorted(captured) == ["h.0/attn", "h.1/attn", "h.2", "h.2/attn", "h.3/attn", "ln_f"]
    plain, _ = model.apply(p, s, IDS, inference_mode=True)
    np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-5)
    for block in ("h.0", "h.3"):
        want, _ = mg.compile(cut_at(g, block, "attn")).apply(params, state, IDS, inference_mode=True)
        np.testing.assert_allclose(captured[f"{block}/attn"], want, rtol=1e-5, atol=1e-6)
    whole = g.with_parts(outputs=(Value("h.2"),))
    want, _ = mg.compile(whole).apply(params, state, IDS, inference_mode=True)
    np.testing.assert_allclose(captured["h.2"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan,remat", MODES)
def test_identity_intervention_is_bit_exact(base, scan, remat):
    g, params, state = base
    model, p, s = model_and_weights(g, params, state, scan, remat)
    plain, _ = model.apply(p, s, IDS, inference_mode=True)
    for taps in ({"h.*/attn": lambda v: v}, {"h.1/mlp.c_fc": lambda v, path: v}, {"h.2": lambda v: v}):
        out, _ = model.apply(p, s, IDS, inference_mode=True, intervene=taps)
        np.testing.assert_array_equal(out, plain)


@pytest.mark.parametrize("scan,remat", MODES)
def test_zeroing_an_attention_equals_a_graph_computing_zeros_there(base, scan, remat):
    g, params, state = base
    model, p, s = model_and_weights(g, params, state, scan, remat)
    out, _ = model.apply(p, s, IDS, inference_mode=True, intervene={"h.3/attn": jnp.zeros_like})
    zeroed = g.replace("h.3/attn", lambda layer, *xs: 0.0 * layer(*xs))
    want, _ = mg.compile(zeroed).apply(params, state, IDS, inference_mode=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    plain, _ = model.apply(p, s, IDS, inference_mode=True)
    assert not np.allclose(out, plain)
    # fn(value, path) sees each block's own path inside a scanned run.
    seen = {"h.1/attn": 0.5, "h.3/attn": 0.0}
    out2, _ = model.apply(p, s, IDS, inference_mode=True,
                          intervene={"h.*/attn": lambda v, path: v * seen.get(path, 1.0)})
    halved = g.replace("h.1/attn", lambda layer, *xs: 0.5 * layer(*xs)).replace(
        "h.3/attn", lambda layer, *xs: 0.0 * layer(*xs))
    want2, _ = mg.compile(halved).apply(params, state, IDS, inference_mode=True)
    np.testing.assert_allclose(out2, want2, rtol=1e-5, atol=1e-5)


def test_gradients_flow_through_interventions(base):
    g, params, state = base
    model = mg.compile(g, scan_blocks="always", remat="full")
    p, s = model.stack_weights(params, state)

    def loss(p, scale):
        out, _ = model.apply(p, s, IDS, inference_mode=True, intervene={"h.2/attn": lambda v: v * scale})
        return jnp.sum(out ** 2)

    grad = jax.grad(loss, argnums=1)(p, 1.0)
    eps = 1e-2  # central difference: O(eps**2) error; float32 roundoff shrinks as eps grows
    numeric = (loss(p, 1.0 + eps) - loss(p, 1.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=2e-2)


def test_taps_errors_are_mlaxgraph_errors(base):
    g, params, state = base
    model = mg.compile(g)
    with pytest.raises(mg.GraphError, match="unexpected keyword argument 'captur'.*capture=None"):
        model.apply(params, state, IDS, captur=["h.*"])
    with pytest.raises(mg.GraphError, match="'h.\\*/atn' names no layer or block.*near names"):
        model.apply(params, state, IDS, inference_mode=True, capture=["h.*/atn"])
    # a Hugging Face module whose layers are named after it (h.0's mlp.c_fc ...)
    with pytest.raises(mg.GraphError, match=r"'h\.\*/mlp' is a module, not a layer: its layers "
                                            r"are mlp\.c_fc, mlp\.act, .*select them with "
                                            r"'h\.\*/mlp\.\*'"):
        model.apply(params, state, IDS, inference_mode=True, capture=["h.*/mlp"])
    with pytest.raises(mg.GraphError, match="intervene takes a dict"):
        model.apply(params, state, IDS, inference_mode=True, intervene=lambda v: v)
    with pytest.raises(mg.ShapeError, match="intervene at 'h.1/attn'.*shape"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"h.1/attn": lambda v: v[:, :1]})
    with pytest.raises(mg.DTypeError, match="intervene at 'ln_f'.*dtype"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"ln_f": lambda v: v.astype(jnp.bfloat16)})


def test_capture_in_training_with_rng_and_a_small_graph():
    x = mg.Input(("batch", 4), name="x")
    h = ops.Dropout(0.5, name="drop")(ops.Linear(3, name="fc")(x))
    model = mg.compile(mg.Graph(x, ops.relu(h)))
    params, state = model.init(jax.random.key(0))
    data = jnp.arange(8.0).reshape(2, 4)
    out, _, captured = model.apply(params, state, data, rng=jax.random.key(1), capture=["fc", "drop"])
    fc = np.asarray(data) @ np.asarray(params["fc"]["kernel"]) + np.asarray(params["fc"]["bias"])
    # float32 sums of 4 products in another order: a few ulps of the largest term
    np.testing.assert_allclose(captured["fc"], fc, rtol=1e-6, atol=1e-6)
    kept = np.asarray(captured["drop"]) != 0
    np.testing.assert_allclose(np.asarray(captured["drop"])[kept], 2 * fc[kept], rtol=1e-6,
                               atol=2e-6)
    np.testing.assert_allclose(out, np.maximum(captured["drop"], 0))


def test_trainer_loss_reads_captures():
    import optax

    x = mg.Input(("batch", 4), name="x")
    h = ops.relu(ops.Linear(5, name="fc1")(x))
    model = mg.compile(mg.Graph(x, ops.Linear(3, name="fc2")(h)))

    def loss(outputs, targets, captured):
        return jnp.mean((outputs - targets) ** 2, axis=-1) + 0.1 * jnp.mean(captured["fc1"] ** 2, axis=-1)

    trainer = mg.train.Trainer(model, optax.sgd(0.5), loss=loss, capture=["fc1"])
    ts = trainer.init(jax.random.key(0))
    p0 = jax.tree.map(np.asarray, ts.params)
    data = jax.random.normal(jax.random.key(1), (6, 4))
    targets = jax.random.normal(jax.random.key(2), (6, 3))
    ts, metrics = trainer.train_step(ts, data, targets)

    def hand(p):  # the same objective written with jnp alone
        a = data @ p["fc1"]["kernel"] + p["fc1"]["bias"]
        y = jnp.maximum(a, 0) @ p["fc2"]["kernel"] + p["fc2"]["bias"]
        return jnp.mean(jnp.mean((y - targets) ** 2, axis=-1) + 0.1 * jnp.mean(a ** 2, axis=-1))

    value, grads = jax.value_and_grad(hand)(p0)
    np.testing.assert_allclose(metrics["loss"], value, rtol=1e-5)
    want = jax.tree.map(lambda w, g: w - 0.5 * g, p0, grads)
    for got, expected in zip(jax.tree.leaves(ts.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(mg.GraphError, match="the loss reads the captured outputs"):
        mg.train.Trainer(model, optax.sgd(0.5), loss="mean_squared_error", capture=["fc1"])
    # a selection of nothing (graph.select gives []) captures nothing: still three values,
    # and the loss still gets its third argument (apply gave two, the loss was called with two)
    params, state = model.init(jax.random.key(0))
    out, _, captured = model.apply(params, state, data, capture=model.graph.select(op="conv"))
    assert captured == {}
    np.testing.assert_array_equal(out, model.apply(params, state, data)[0])
    out, _, captured = model.apply(params, state, data, capture=[], intervene={"fc1": lambda v: v})
    assert captured == {}
    empty = mg.train.Trainer(model, optax.sgd(0.5), loss=lambda o, t, c: jnp.mean((o - t) ** 2, -1) + len(c),
                             capture=[])
    _, metrics = empty.train_step(empty.init(jax.random.key(0)), data, targets)
    assert np.isfinite(metrics["loss"])


def test_taps_on_a_mesh_give_the_numbers_without_one(base):
    g, params, state = base
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    plain = mg.compile(g, scan_blocks="always")
    sharded = mg.compile(g, mesh=mesh, rules={"batch": "data", "mlp": "model"}, scan_blocks="always")
    p, s = plain.stack_weights(params, state)
    want, _, want_captured = plain.apply(p, s, IDS, inference_mode=True, capture=["h.*/attn"])
    sp, ss = sharded.init(jax.random.key(0), reuse=(p, s))
    got, _, captured = sharded.apply(sp, ss, IDS, inference_mode=True, capture=["h.*/attn"],
                                     intervene={"h.*/mlp.c_fc": lambda v: v})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for path, value in want_captured.items():
        np.testing.assert_allclose(captured[path], value, rtol=1e-6, atol=1e-6)


def test_an_attention_with_an_adapter_on_its_output_taps_as_one_output(base):
    g, params, state = base
    lora = mg.compile(mg.lora(g, "h.*/attn/out", rank=2))
    p, s = lora.init(jax.random.key(1), reuse=(params, state))
    rng = np.random.default_rng(0)  # a nonzero adapter: B starts at zero
    p["h.0"]["attn.out.lora_B"]["kernel"] = jnp.asarray(rng.normal(size=(2, 32)), jnp.float32)
    _, _, got = lora.apply(p, s, IDS, inference_mode=True, capture=["h.0/attn", "h.0/add", "drop"])
    # the block adds the attention's output (through an inference-mode dropout) to its input
    np.testing.assert_allclose(got["h.0/attn"], np.asarray(got["h.0/add"]) - np.asarray(got["drop"]),
                               rtol=1e-5, atol=1e-5)
    calls = []
    lora.apply(p, s, IDS, inference_mode=True,
               intervene={"h.0/attn": lambda v: calls.append(v.shape) or jnp.zeros_like(v)})
    assert calls == [(2, 8, 32)]
    _, _, ablated = lora.apply(p, s, IDS, inference_mode=True, capture=["h.0/add", "drop"],
                               intervene={"h.0/attn": jnp.zeros_like})
    np.testing.assert_array_equal(ablated["h.0/add"], ablated["drop"])  # the adapter's part too


def test_wrong_signatures_of_interventions_and_losses_are_named_errors(base):
    import optax

    g, params, state = base
    model = mg.compile(g)
    with pytest.raises(mg.GraphError, match=r"intervene at 'h.0/attn': the function is called as "
                       r"fn\(value\) or fn\(value, path\).*missing a required argument: 'q'"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"h.0/attn": lambda v, p, q: v})

    def two(logits, targets):
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(-1)

    with pytest.raises(mg.GraphError, match=r"loss\(outputs, targets, captured\).*two\(logits, "
                       r"targets\): too many positional arguments"):
        mg.train.Trainer(model, optax.adam(1e-3), loss=two, capture="h.0/attn")
    with pytest.raises(mg.GraphError, match=r"loss\(outputs, targets\).*needs Trainer\(capture=...\)"):
        mg.train.Trainer(model, optax.adam(1e-3), loss=lambda o, t, c: two(o, t))


def test_a_numpy_function_as_an_intervention_is_a_named_error(base):
    g, params, state = base
    model = mg.compile(g)
    with pytest.raises(mg.GraphError, match=r"intervene at 'h.0/attn'.*\(negative\).*use jax.numpy "
                       r"\(jnp.negative for np.negative\)"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"h.0/attn": np.negative})
    with pytest.raises(mg.GraphError, match=r"intervene at 'h.1/attn'.*\(<lambda>\).*use jax.numpy"):
        model.apply(params, state, IDS, inference_mode=True,
                    intervene={"h.1/attn": lambda v: np.tanh(np.asarray(v))})


def test_tapped_apply_fn_of_no_taps_captures_nothing(base):
    from mlaxgraph.compiler.taps import Taps
    g, params, state = base
    model = mg.compile(g)
    fn = model.tapped_apply_fn(Taps.of([], None))  # an empty selection: None
    out, _, captured = fn(params, state, IDS, inference_mode=True)
    assert captured == {}
    np.testing.assert_array_equal(out, model.apply(params, state, IDS, inference_mode=True)[0])
    with pytest.raises(mg.GraphError, match="takes the Taps of Taps.of"):
        model.tapped_apply_fn({"capture": ["h.0"]})


def test_an_intervention_that_fails_is_named_and_a_numpy_mask_it_reads_works(base):
    g, params, state = base
    model = mg.compile(g)
    with pytest.raises(mg.GraphError, match=r"intervene at 'h.0/attn': the function \(<lambda>\) "
                                            r"failed on the output float32\[.*AttributeError"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"h.0/attn": lambda v: v.foo})
    with pytest.raises(mg.GraphError, match=r"\(multiply\) failed .* missing 1 required positional"):
        model.apply(params, state, IDS, inference_mode=True, intervene={"h.0/attn": jnp.multiply})
    captured = model.apply(params, state, IDS, inference_mode=True, capture="h.0/attn")[2]["h.0/attn"]
    mask = np.arange(captured.shape[-1]) % 2 == 0  # a NumPy bool mask the function reads
    out, _ = model.apply(params, state, IDS, inference_mode=True,
                         intervene={"h.0/attn": lambda v: v.at[..., mask].set(0.0)})
    want, _ = model.apply(params, state, IDS, inference_mode=True,
                          intervene={"h.0/attn": lambda v: v * jnp.asarray(~mask, v.dtype)})
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


STACK_X = np.asarray(jax.random.normal(jax.random.key(1), (2, 8)))


@pytest.fixture(scope="module")
def stack():
    """Three equal blocks ``b0``-``b2``, each ``tanh(fc(h)) + h``, then ``head``."""
    x = mg.Input(("batch", 8), name="x")
    inner = mg.Input(("batch", 8), name="h")
    block = mg.Graph(inner, ops.tanh(ops.Linear(8, name="fc")(inner)) + inner, name="block")
    h = x
    for i in range(3):
        h = block.as_block(f"b{i}")(h)
    g = mg.Graph(x, ops.Linear(2, name="head")(h), name="stack")
    params, state = mg.compile(g).init(jax.random.key(0))
    return g, params, state


def test_an_interventions_failing_lookup_by_path_is_named_at_the_path(stack):
    g, params, state = stack
    model = mg.compile(g, scan_blocks="always")
    stacked, stacked_state = model.stack_weights(params, state)
    scale = {"b0/fc": 2.0}  # b1/fc left out
    with pytest.raises(mg.GraphError, match=r"intervene at 'b1/fc': the function \(<lambda>\) "
                       r"failed on the output float32\[2, 8\].*KeyError: 'b1/fc'"):
        model.apply(stacked, stacked_state, STACK_X, intervene={"b*/fc": lambda v, path: v * scale[path]})
    # with every path there, the numbers: fc's output doubled in b0 alone
    scale["b1/fc"] = scale["b2/fc"] = 1.0
    out, _ = model.apply(stacked, stacked_state, STACK_X, intervene={"b*/fc": lambda v, path: v * scale[path]})
    h = STACK_X
    for i in range(3):
        p = params[f"b{i}"]["fc"]
        h = np.tanh((h @ np.asarray(p["kernel"]) + np.asarray(p["bias"])) * (2.0 if i == 0 else 1.0)) + h
    want = h @ np.asarray(params["head"]["kernel"]) + np.asarray(params["head"]["bias"])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_scans_name_and_an_input_are_errors_saying_what_to_tap(stack):
    g, params, state = stack
    model = mg.compile(g, scan_blocks="always")
    assert [n.name for n in model.graph.nodes] == ["x", "b0..b2", "head"]
    stacked, stacked_state = model.stack_weights(params, state)
    with pytest.raises(mg.GraphError, match=r"path 'b0..b2/fc' names no layer or block of graph "
                       r"'stack'; 'b0..b2' is the scan of blocks b0, b1, b2: name a block as in the "
                       r"graph built \(b0/fc\); near names: .*b0/fc"):
        model.apply(stacked, stacked_state, STACK_X, capture="b0..b2/fc")
    with pytest.raises(mg.GraphError, match=r"path 'x' names no layer.*'x' is an input, not tapped: "
                       r"its value is what feeds it"):
        model.apply(stacked, stacked_state, STACK_X, capture="x")
    with pytest.raises(mg.GraphError, match=r"'b1/h' is an input, not tapped"):
        mg.compile(g).apply(params, state, STACK_X, intervene={"b1/h": lambda v: v})
