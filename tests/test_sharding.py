"""Sharding on the test process's one device: logical axes (defaults, overrides,
propagation), rules and their errors, the plan on a 1x1 mesh, the summary column, the
rendering label, the collectives parser and sharded checkpoints. The multi-device
checks are in test_sharding_devices.py."""

from __future__ import annotations

import html

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import mlaxgraph as mg
from mlaxgraph import ops
from mlaxgraph.io import sharded_checkpoint
from mlaxgraph.core.axes import UNKNOWN, weight_axes
from mlaxgraph.compiler.flatten import flatten
from mlaxgraph.distributed.activations import propagate
from mlaxgraph.analysis.hlo.collectives import collectives
from mlaxgraph.examples import mlp, residual_cnn
from mlaxgraph.distributed import abstract_init, shard_batch
from mlaxgraph.core.specs import TensorSpec

from _helpers import next_line

RULES = {"batch": "data", "mlp": "model", "heads": "model"}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((1, 1), ("data", "model"))


def spec(*shape, dtype="float32"):
    return TensorSpec.of(shape, dtype)


# --- logical axes of weights ----------------------------------------------------------

LAYERS_WITH_WEIGHTS = [
    (ops.Linear(8), [spec("batch", 4)], {"kernel": ("embed", "mlp"), "bias": ("mlp",)}),
    (ops.Conv(8, (3, 3)), [spec("batch", 9, 9, 4)],
     {"kernel": ("mlp", None, None, "embed"), "bias": ("mlp",)}),
    (ops.Conv(8, (3,), data_format="NCW"), [spec("batch", 4, 9)],
     {"kernel": ("mlp", "embed", None), "bias": ("mlp",)}),
    (ops.BatchNorm(), [spec("batch", 4)], {"scale": ("embed",), "bias": ("embed",),
                                          "mean": ("embed",), "var": ("embed",)}),
    (ops.LayerNorm(), [spec("batch", 4)], {"scale": ("embed",), "bias": ("embed",)}),
    (ops.RMSNorm(), [spec("batch", 4)], {"scale": ("embed",)}),
    (ops.GroupNorm(2), [spec("batch", 4)], {"scale": ("embed",), "bias": ("embed",)}),
    (ops.Embedding(10, 4), [spec("batch", 3, dtype="int32")], {"embedding": ("vocab", "embed")}),
    (ops.MultiHeadAttention(2, 4), [spec("batch", 5, 8), spec("batch", 5, 8)],
     {f"{p}/{w}": axes for p in ("query", "key", "value")
      for w, axes in (("kernel", ("embed", "heads", "kv")), ("bias", ("heads", "kv")))}
     | {"out/kernel": ("heads", "kv", "embed"), "out/bias": ("embed",)}),
    (ops.QuantizedLinear(8, scheme="int8_weight_only"), [spec("batch", 4)],
     {"kernel": ("embed", "mlp"), "kernel_scale": ("mlp",), "bias": ("mlp",)}),
    (ops.QuantizedConv(8, (3, 3), scheme="int4_weight_only", group_size=2),
     [spec("batch", 9, 9, 4)], {"kernel": ("mlp", None, None, "embed"),
                                "kernel_scale": ("mlp", None, None, None), "bias": ("mlp",)}),
    (ops.QuantizedEmbedding(10, 4, scheme="int8"), [spec("batch", 3, dtype="int32")],
     {"embedding": ("vocab", "embed"), "embedding_scale": ("vocab",)}),
    (ops.QuantizedMultiHeadAttention(2, 4, scheme="int8_weight_only"),
     [spec("batch", 5, 8), spec("batch", 5, 8)],
     {f"{p}/{w}": axes for p in ("query", "key", "value")
      for w, axes in (("kernel", ("embed", None)), ("kernel_scale", (None,)),
                      ("bias", ("heads", "kv")))}
     | {"out/kernel": (None, "embed"), "out/kernel_scale": ("embed",), "out/bias": ("embed",)}),
    (ops.CachedAttention(2, 4, 8, max_length=16, batch=2),
     [spec(2, 5, 8), spec(2, 5, dtype="int32"), spec(dtype="int32"), spec(2, 16, dtype="bool")],
     {f"{p}/kernel": ("embed", "heads", "kv") for p in ("query", "key", "value")}
     | {f"{p}/bias": ("heads", "kv") for p in ("query", "key", "value")}
     | {"out/kernel": ("heads", "kv", "embed"), "out/bias": ("embed",),
        "key": ("batch", "cache_length", "heads", "kv"),
        "value": ("batch", "cache_length", "heads", "kv")}),
    (ops.QuantizedCachedAttention(2, 4, 8, max_length=16, batch=2, scheme="int8"),
     [spec(2, 5, 8), spec(2, 5, dtype="int32"), spec(dtype="int32"), spec(2, 16, dtype="bool")],
     {f"{p}/{w}": axes for p in ("query", "key", "value")
      for w, axes in (("kernel", ("embed", None)), ("kernel_scale", (None,)),
                      ("bias", ("heads", "kv")))}
     | {"out/kernel": (None, "embed"), "out/kernel_scale": ("embed",), "out/bias": ("embed",),
        "key": ("batch", "cache_length", "heads", "kv"),
        "value": ("batch", "cache_length", "heads", "kv")}),
    (ops.LSTM(4), [spec("batch", 5, 3)], {"input_kernel": ("embed", "mlp"),
                                         "recurrent_kernel": (None, "mlp"), "bias": ("mlp",)}),
    (ops.GRU(4), [spec("batch", 5, 3)], {"input_kernel": ("embed", "mlp"),
                                        "recurrent_kernel": (None, "mlp"), "bias": ("mlp",),
                                        "recurrent_bias": ("mlp",)}),
    (ops.ConvTranspose(8, 3, strides=2), [spec("batch", 9, 9, 4)],
     {"kernel": ("mlp", None, None, "embed"), "bias": ("mlp",)}),
]


@pytest.mark.parametrize("layer, inputs, expected", LAYERS_WITH_WEIGHTS,
                         ids=lambda v: getattr(v, "op_name", None) or "")
def test_every_layer_with_weights_has_documented_default_axes(layer, inputs, expected):
    params, state = weight_axes(layer, inputs)
    assert {k: axes for k, (_, axes) in {**params, **state}.items()} == expected
    assert "Logical axes" in type(layer).__doc__ or "logical axes" in type(layer).__doc__
    assert "param_axes" in [f for f in type(layer).__dataclass_fields__]


def test_every_registered_op_with_weights_is_covered():
    from mlaxgraph.core import registry

    covered = {type(layer).op_name for layer, _, _ in LAYERS_WITH_WEIGHTS}
    with_param_axes = {name for name, cls in registry.registered_ops().items()
                       if "param_axes" in getattr(cls, "__dataclass_fields__", {})}
    assert with_param_axes == covered


def test_kernel_axes_and_param_axes_override_the_defaults():
    layer = ops.Linear(8, kernel_axes=["mlp", "embed"], param_axes={"bias": [None]})
    assert layer.kernel_axes == ("mlp", "embed") and layer.param_axes == (("bias", (None,)),)
    params, _ = weight_axes(layer, [spec("batch", 4)])
    assert params == {"kernel": ((4, 8), ("mlp", "embed")), "bias": ((8,), (None,))}
    mha = ops.MultiHeadAttention(2, 4, param_axes={"query": {"kernel": ("embed", None, None)}})
    params, _ = weight_axes(mha, [spec("batch", 5, 8)] * 2)
    assert params["query/kernel"][1] == ("embed", None, None)
    assert params["key/kernel"][1] == ("embed", "heads", "kv")


def test_overrides_keep_layers_hashable_and_survive_json():
    x = mg.Input(("batch", 4), axes=("batch", "embed"))
    y = ops.Linear(8, kernel_axes=("embed", "mlp"), param_axes={"bias": ("mlp",)}, name="fc")(x)
    graph = mg.Graph(x, ops.constrain(y, ("batch", "mlp")))
    hash(graph)
    assert mg.Graph.from_json(graph.to_json()) == graph
    assert "kernel_axes=('embed', 'mlp')" in str(graph)


def test_bad_axes_values_raise_naming_the_layer_and_line():
    with pytest.raises(mg.ShardingError) as info:
        where = next_line()
        ops.Linear(8, kernel_axes="mlp", name="fc")
    assert "layer 'fc' (op linear): kernel_axes must be a tuple of axis names" in str(info.value)
    assert where in str(info.value)
    with pytest.raises(mg.ShardingError, match="param_axes must map weight paths"):
        ops.LayerNorm(param_axes=[("scale",)])
    with pytest.raises(mg.ShardingError, match="axis names"):
        ops.constrain(mg.Input(("batch", 4)), ("batch", 3))


def test_param_axes_naming_no_weight_raises_at_compile(mesh):
    x = mg.Input(("batch", 4))
    where = next_line()
    y = ops.LayerNorm(param_axes={"scael": ("embed",)}, name="norm")(x)
    with pytest.raises(mg.ShardingError) as info:
        mg.compile(mg.Graph(x, y), mesh=mesh, rules=RULES)
    message = str(info.value)
    assert message.startswith("layer 'norm' (op layer_norm): param_axes names 'scael'")
    assert "weights 'scale', 'bias'" in message and where in message


def test_axes_of_the_wrong_rank_raise_at_compile(mesh):
    x = mg.Input(("batch", 4))
    where = next_line()
    y = ops.Linear(8, kernel_axes=("embed",), name="fc")(x)
    with pytest.raises(mg.ShardingError) as info:
        mg.compile(mg.Graph(x, y), mesh=mesh, rules=RULES)
    assert "layer 'fc' (op linear): weight 'kernel' of shape (4, 8) has 2 dims" in str(info.value)
    assert where in str(info.value)


def test_a_rule_naming_a_missing_mesh_axis_raises_naming_the_first_layer_using_it(mesh):
    where = next_line()
    graph = mlp(4, (8,), 2)
    with pytest.raises(mg.ShardingError) as info:
        mg.compile(graph, mesh=mesh, rules={"batch": "data", "mlp": "modle"})
    message = str(info.value)
    assert message.startswith("layer 'dense' (op linear): weight 'kernel' cannot be sharded: "
                              "the rule for logical axis 'mlp' names mesh axis 'modle'")
    assert "expected: mesh axes 'data', 'model'" in message and where in message
    with pytest.raises(mg.ShardingError, match="rules\\['vocab'\\] names mesh axis 'x'"):
        mg.compile(graph, mesh=mesh, rules={"vocab": "x"})  # a rule no layer uses


def test_rules_need_a_mesh_and_the_right_types(mesh):
    with pytest.raises(mg.ShardingError, match="pass mesh="):
        mg.compile(mlp(4, (8,), 2), rules=RULES)
    with pytest.raises(mg.ShardingError, match="must be a jax.sharding.Mesh"):
        mg.compile(mlp(4, (8,), 2), mesh=(2, 4))
    with pytest.raises(mg.ShardingError, match="rules\\['mlp'\\] must be a mesh axis name"):
        mg.compile(mlp(4, (8,), 2), mesh=mesh, rules={"mlp": 3})
    # jax's DuplicateSpecError, later, in apply: refused at compile
    with pytest.raises(mg.ShardingError, match="rules\\['batch'\\] names mesh axis 'data' twice"):
        mg.compile(mlp(4, (8,), 2), mesh=mesh, rules={"batch": ("data", "data")})


def test_a_logical_axis_without_a_rule_is_replicated(mesh):
    model = mg.compile(mlp(4, (8,), 2), mesh=mesh, rules={"batch": "data"})
    assert model.sharding.params["dense"]["kernel"].spec == P(None, None)
    assert model.sharding.activations["dense"] == (P("data", None),)


def test_one_mesh_axis_shards_one_dim_of_an_array(mesh):
    # FSDP-style rules: weights split on "embed", activations on "batch", both on "data".
    model = mg.compile(mlp(4, (8,), 2), mesh=mesh, rules={"batch": "data", "embed": "data"})
    assert model.sharding.params["dense"]["kernel"].spec == P("data", None)
    assert model.sharding.activations["x"] == (P("data", None),)
    x = mg.Input(("batch", 4), axes=("batch", "embed"))
    model = mg.compile(mg.Graph(x, ops.relu(x)), mesh=mesh, rules={"batch": "data", "embed": "data"})
    assert model.sharding.activations["relu"] == (P("data", None),)  # embed stays whole


# --- logical axes of activations ------------------------------------------------------


def test_activation_axes_propagate_through_the_graph():
    x = mg.Input(("batch", 8, 8, 3), name="image")  # no axes: ("batch", None, None, None)
    h = ops.Conv(4, (3, 3), strides=2, padding="SAME", name="conv")(x)
    h = ops.relu(h)
    f = ops.Flatten(name="flat")(h)
    y = ops.Linear(6, kernel_axes=("embed", "vocab"), name="head")(f)
    t = ops.Transpose((1, 0), name="t")(y)
    c = ops.constrain(y, ("batch", None))
    axes = propagate(flatten(mg.Graph(x, [t, c])))
    assert axes["image"] == (("batch", None, None, None),)
    assert axes["conv"] == (("batch", UNKNOWN, UNKNOWN, "mlp"),)  # strided: spatial unknown
    assert axes["relu"] == axes["conv"]
    assert axes["flat"] == (("batch", UNKNOWN),)
    assert axes["head"] == (("batch", "vocab"),)
    assert axes["t"] == (("vocab", "batch"),)
    assert axes["constrain"] == (("batch", None),)


def test_attention_and_embedding_name_their_outputs():
    tokens = mg.Input(("batch", 5), "int32", axes=("batch", "length"))
    h = ops.Embedding(20, 8, name="embed")(tokens)
    a = ops.MultiHeadAttention(2, 4, name="mha")(h)
    axes = propagate(flatten(mg.Graph(tokens, a)))
    assert axes["embed"] == (("batch", "length", "embed"),)
    assert axes["mha"] == (("batch", "length", "embed"),)


def test_blocks_propagate_their_callers_axes(mesh):
    model = mg.compile(residual_cnn(), mesh=mesh, rules=RULES)
    acts = model.sharding.activations
    assert acts["res1/x"] == (P("data", None, None, "model"),)  # from the stem's channels
    assert acts["res1/conv_a"] == (P("data", None, None, "model"),)
    assert acts["flatten"] == (P("data", P.UNCONSTRAINED),)


# --- the compiled model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded_mlp(mesh):
    return mg.compile(mlp(4, (8,), 2, dropout=0.5), mesh=mesh, rules=RULES)


def test_a_one_device_mesh_gives_the_numbers_of_no_mesh(sharded_mlp):
    # Eight devices against one, for the three example graphs: test_sharding_devices.py.
    sharded = sharded_mlp
    graph = sharded.source_graph
    plain = mg.compile(graph)
    x = np.random.default_rng(0).normal(size=(4,) + tuple(graph.input_specs[0].shape[1:]))
    x = x.astype(np.float32)
    p0, s0 = plain.init(jax.random.key(0))
    p1, s1 = sharded.init(jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, p1, p0)
    assert all(isinstance(a.sharding, NamedSharding) for a in jax.tree.leaves(p1))
    out0, new0 = plain.apply(p0, s0, x, rng=jax.random.key(1))
    out1, new1 = sharded.apply(p1, s1, x, rng=jax.random.key(1))
    np.testing.assert_allclose(out1, out0, rtol=1e-6, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), new1, new0)
    grads = jax.grad(lambda p: jnp.sum(sharded.apply_fn(p, s1, x, rng=jax.random.key(1))[0]))(p1)
    assert jax.tree.structure(grads) == jax.tree.structure(p1)


def test_a_policy_and_a_mesh_together(mesh):
    policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    model = mg.compile(mlp(4, (8,), 2), policy, mesh=mesh, rules=RULES)
    labels = model.sharding.labels()
    assert labels["x_bf16"] == "out[data,-]"  # the inserted casts keep their input's axes
    assert labels["logits_f32"] == "out[data,model]"
    assert labels["dense"] == "kernel[-,model] bias[model] out[data,model]"


def test_an_explicit_mesh_is_used_with_auto_axes(sharded_mlp):
    # jax.make_mesh makes Explicit axes; XLA's partitioner needs Auto ones to decide.
    assert all(t == jax.sharding.AxisType.Explicit for t in jax.make_mesh((1,), ("d",)).axis_types)
    assert all(t == jax.sharding.AxisType.Auto for t in sharded_mlp.sharding.mesh.axis_types)


def test_summary_has_a_sharding_column_only_with_a_mesh(mesh):
    plain = mg.compile(residual_cnn()).summary()
    assert "sharding" not in plain.splitlines()[2]
    text = mg.compile(residual_cnn(), mesh=mesh, rules=RULES).summary(expand_nested=True)
    lines = text.splitlines()
    assert lines[2].split() == ["layer", "op", "output", "shape", "dtype", "params",
                                "connected", "to", "sharding"]
    row = next(line for line in lines if line.startswith("stem "))
    assert row.endswith("kernel[model,-,-,-] bias[model] out[data,-,-,model]")
    assert any(line.startswith("  conv_a") and line.endswith("kernel[model,-,-,-] out[data,-,-,model]")
               for line in lines)
    assert lines[-1] == "mesh: data=1 x model=1 (1 device); rules: batch->data, mlp->model, heads->model"


def test_rendering_labels_each_layer_with_its_sharding(mesh, tmp_path):
    model = mg.compile(residual_cnn(), mesh=mesh, rules=RULES)
    dot = model.to_dot(expand_nested=True)
    assert "kernel[model,-,-,-] bias[model] out[data,-,-,model]" in dot  # stem
    assert "kernel[model,-,-,-] out[data,-,-,model]" in dot  # res1/conv_a, in its cluster
    assert "out[data,?]" in dot  # flatten: the feature dim is left to XLA
    assert "out[data" not in model.graph.to_dot()  # the graph alone knows no mesh
    assert "out[data" not in mg.compile(residual_cnn()).to_dot()
    svg = html.unescape(model.render(tmp_path / "cnn.svg").read_text())
    assert "kernel[-,model] bias[model] out[data,model]" in svg  # logits
    with pytest.raises(TypeError, match="sharding must be a dict"):
        model.graph.to_dot(sharding="data")


def test_shard_batch_and_abstract_init(sharded_mlp):
    model = sharded_mlp
    x, y = shard_batch(model, np.ones((6, 4), np.float32), np.arange(6))
    assert x.sharding.spec == P("data", None) and y.sharding.spec == P("data")
    params, state = abstract_init(model)
    assert params["dense"]["kernel"].sharding == model.sharding.params["dense"]["kernel"]
    assert state == {}
    with pytest.raises(mg.ShardingError, match="compiled without a mesh"):
        shard_batch(mg.compile(mlp(4, (8,), 2)), np.ones((6, 4)))
    with pytest.raises(mg.ShardingError, match="shard_batch got unexpected keyword argument 'axis'"):
        shard_batch(model, np.ones((6, 4), np.float32), axis=0)


def test_hlo_of_a_sharded_model_and_its_collectives(sharded_mlp):
    model = sharded_mlp
    assert "sharding" in model.hlo(batch=4)  # the constraints are in the StableHLO
    assert collectives(model, batch=4) == []  # one device: nothing to communicate


def test_collectives_are_read_from_optimized_hlo():
    text = "\n".join([
        '  %all-gather = f32[8,128]{0,1} all-gather(%f), channel_id=1, dimensions={1}, '
        'metadata={op_name="jit(apply)/block/dense_1/dot_general" stack_frame_id=17}',
        '  %ar = (f32[128]{0}, f32[]) all-reduce(%a, %b), to_apply=%add, metadata={op_name='
        '"jit(step)/(transpose(jvp(dense))/reduce_sum:transpose(jvp(logits))/dot_general:jvp()/reduce_sum)"}',
        '  ROOT %cp = f32[4]{0} collective-permute-start(%x), source_target_pairs={{0,1}}',
        '  %add = f32[4]{0} add(%x, %y), metadata={op_name="jit(apply)/all-reduce/add"}',
    ])
    found = collectives(text)
    assert [tuple(c) for c in found] == [
        ("all-gather", "f32[8,128]{0,1}", "block/dense_1"),
        ("all-reduce", "(f32[128]{0}, f32[])", "dense,logits"),
        ("collective-permute", "f32[4]{0}", "")]
    assert str(found[0]) == "all-gather f32[8,128]{0,1} in block/dense_1"


def test_sharded_checkpoints_round_trip_and_refuse_to_overwrite(sharded_mlp, tmp_path):
    model = sharded_mlp
    params, _ = model.init(jax.random.key(0))
    where = sharded_checkpoint.save(tmp_path / "step_1", {"params": params})
    target, _ = abstract_init(model)
    restored = sharded_checkpoint.restore(where, {"params": target})["params"]
    jax.tree.map(np.testing.assert_array_equal, restored, params)
    assert jax.tree.map(lambda a: a.sharding, restored) == model.sharding.params
    with pytest.raises(mg.SerializationError, match="exists; pass overwrite=True"):
        sharded_checkpoint.save(where, {"params": params})
    sharded_checkpoint.save(where, {"params": params}, overwrite=True)
    with pytest.raises(mg.SerializationError, match="no checkpoint at"):
        sharded_checkpoint.restore(tmp_path / "missing", {"params": target})


def test_sharded_checkpoints_record_digests_and_refuse_damaged_files(sharded_mlp, tmp_path):
    """One flipped byte in any file, a file removed or added, or the checksums file
    edited: a SerializationError naming the file, before orbax reads a byte."""
    import hashlib
    import json
    import pathlib
    import shutil
    import warnings

    params, _ = sharded_mlp.init(jax.random.key(0))
    where = sharded_checkpoint.save(tmp_path / "step_1", {"params": params})
    recorded = json.loads((where / sharded_checkpoint.CHECKSUMS).read_text())["checksums"]
    files = sorted(p.relative_to(where).as_posix() for p in where.rglob("*")
                   if p.is_file() and p.name != sharded_checkpoint.CHECKSUMS)
    assert sorted(recorded) == files
    for name in files:  # an independent digest of each file's bytes
        assert recorded[name] == hashlib.blake2b((where / name).read_bytes(), digest_size=16).hexdigest()

    def damaged(change):
        copy = pathlib.Path(shutil.copytree(where, tmp_path / f"copy{len(list(tmp_path.iterdir()))}"))
        change(copy)
        return copy

    def flip(name):
        def change(copy):
            data = bytearray((copy / name).read_bytes())
            data[len(data) // 2] ^= 0xFF
            (copy / name).write_bytes(bytes(data))
        return change

    biggest = max(files, key=lambda n: (where / n).stat().st_size)
    for name in (biggest, files[0]):
        with pytest.raises(mg.SerializationError, match=f"file '{name}' does not match its checksum"):
            sharded_checkpoint.restore(damaged(flip(name)), {"params": params})
    with pytest.raises(mg.SerializationError, match=f"file '{biggest}' of the checkpoint is missing"):
        sharded_checkpoint.restore(damaged(lambda c: (c / biggest).unlink()), {"params": params})
    with pytest.raises(mg.SerializationError, match="file 'extra' was not in the checkpoint"):
        sharded_checkpoint.restore(damaged(lambda c: (c / "extra").write_bytes(b"x")), {"params": params})
    with pytest.raises(mg.SerializationError, match="checksums file is damaged"):
        sharded_checkpoint.restore(damaged(flip(sharded_checkpoint.CHECKSUMS)), {"params": params})
    # verify=False reads a damaged file unchecked; a checkpoint without checksums (saved
    # before they were recorded) restores with a warning
    sharded_checkpoint.restore(damaged(flip(sharded_checkpoint.CHECKSUMS)), {"params": params},
                               verify=False)
    old = damaged(lambda c: (c / sharded_checkpoint.CHECKSUMS).unlink())
    with pytest.warns(mg.UnverifiedFileWarning, match="without checksums"):
        restored = sharded_checkpoint.restore(old, {"params": params})
    jax.tree.map(np.testing.assert_array_equal, restored["params"], params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharded_checkpoint.restore(where, {"params": params})
    with pytest.raises(mg.SerializationError, match="did you mean verify"):
        sharded_checkpoint.restore(where, {"params": params}, verfy=False)
    with pytest.raises(mg.SerializationError, match="did you mean overwrite"):
        sharded_checkpoint.save(where, {"params": params}, overwrte=True)


# --- scanned blocks keep their layers' layout (8 virtual devices, in a subprocess) ------

_SCANNED_LAYOUT = r"""
import json, sys
import jax, mlaxgraph as mg

config = {"num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
          "intermediate_size": 64, "vocab_size": 64}
found = {}
for kv, mesh_shape in ((4, (2, 4)), (2, (2, 4))):
    graph = mg.models.llama(dict(config, num_key_value_heads=kv),
                            axes={"mlp.up_proj": {"kernel": ("embed", None)}})
    mesh = jax.make_mesh(mesh_shape, ("data", "model"))
    rules = mg.models.sharding_rules(graph, mesh)
    for scan in (False, "always"):
        model = mg.compile(graph, mesh=mesh, rules=rules, scan_blocks=scan)
        specs = {}
        for tree in ("params", "state"):
            for path, leaf in jax.tree_util.tree_flatten_with_path(getattr(model.sharding, tree))[0]:
                specs["/".join(str(k.key) for k in path)] = [
                    None if e is None else e if isinstance(e, str) else list(e) for e in leaf.spec]
        found[f"kv{kv}/{scan or 'never'}"] = specs
json.dump({"devices": jax.device_count(), "specs": found}, sys.stdout)
"""


def _on_eight_devices(script: str) -> dict:
    """What ``script`` prints (JSON), run in a process with 8 virtual CPU devices."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("JAX_NUM_CPU_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_scanned_blocks_keep_their_layers_param_axes_on_eight_devices():
    """A scanned block's stacked weights get the layout its layers have unscanned (their
    ``param_axes``, the zoo's Megatron layout, a user's ``axes=`` override, Llama's
    ``kv_heads``), with the stacked axis not sharded."""
    report = _on_eight_devices(_SCANNED_LAYOUT)
    assert report["devices"] == 8
    for kv in ("kv4", "kv2"):
        flat, scanned = report["specs"][f"{kv}/never"], report["specs"][f"{kv}/always"]
        expected = {}
        for path, spec in flat.items():
            top, _, weight = path.partition("/")
            if top.startswith("model.layers."):
                # the blocks' weights stacked under one node, the stacked axis whole
                expected.setdefault(f"model.layers.0..model.layers.2/{weight}", []).append([None, *spec])
            else:
                expected[path] = [spec]
        for path, specs in expected.items():
            assert all(s == specs[0] for s in specs), path
            assert scanned[path] == specs[0], (kv, path)
        assert len(scanned) == len(expected)
        layers = "model.layers.0..model.layers.2"
        assert scanned[f"{layers}/mlp.down_proj/kernel"] == [None, "model", None]  # row-parallel
        assert scanned[f"{layers}/mlp.up_proj/kernel"] == [None, None, None]  # the user's axes
    # 2 key/value heads on model=4: replicated (sharding_rules leaves kv_heads out)
    assert report["specs"]["kv2/always"][f"{layers}/self_attn/key/kernel"] == [None, None, None, None]
    assert report["specs"]["kv4/always"][f"{layers}/self_attn/key/kernel"] == [None, None, "model", None]


_TRAINABLE_ON_A_MESH = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax, mlaxgraph as mg
from mlaxgraph.examples import mlp

mesh = jax.make_mesh((2, 4), ("data", "model"))
model = mg.compile(mlp(4, (8,), 4), mesh=mesh, rules={"batch": "data", "mlp": "model"})
trainer = mg.train.Trainer(model, optax.adam(0.1), loss="mean_squared_error", trainable="dense")
ts = trainer.init(jax.random.key(0))
mu = ts.opt_state[0].mu
x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
y = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
params, state = jax.tree.map(np.asarray, ts.params), ts.state

def loss(trained):  # plain optax on the trainable weights, the others constants
    out = model.apply_fn(dict(params, dense=trained), state, x, inference_mode=False)[0]
    return jnp.mean(jnp.mean((out - y) ** 2, axis=1))

optimizer = optax.adam(0.1)
grads = jax.grad(loss)(params["dense"])
updates, _ = optimizer.update(grads, optimizer.init(params["dense"]), params["dense"])
want = optax.apply_updates(params["dense"], updates)
ts, _ = trainer.train_step(ts, x, y)
try:  # jax's IndivisibleError before: a batch of 3 over data=2
    mg.distributed.shard_batch(model, np.ones((3, 4), np.float32))
    indivisible = None
except mg.ShardingError as e:
    indivisible = str(e)
json.dump({"indivisible": indivisible, "moments": sorted(mu), "mu_spec": [e for e in mu["dense"]["kernel"].sharding.spec],
           "kernel_spec": [e for e in ts.params["dense"]["kernel"].sharding.spec],
           "error": max(float(np.abs(np.asarray(ts.params["dense"][k]) - np.asarray(want[k])).max())
                        for k in want),
           "frozen_same": bool((np.asarray(ts.params["logits"]["kernel"]) == params["logits"]["kernel"]).all())},
          sys.stdout)
"""


def test_a_trainer_with_trainable_on_a_mesh_shards_the_moments_of_its_weights():
    """Trainer(trainable=...) on a mesh: the optimizer state of the trainable weights
    alone, each moment sharded like its weight; a step moves those weights as plain optax
    does and leaves the frozen ones."""
    report = _on_eight_devices(_TRAINABLE_ON_A_MESH)
    assert report["moments"] == ["dense"]
    assert report["mu_spec"] == report["kernel_spec"] == [None, "model"]
    assert report["error"] < 1e-6 and report["frozen_same"]
    assert report["indivisible"].startswith(
        "shard_batch: array 0 (float32[3, 4]) has a leading (batch) dim of 3, which mesh axis "
        "'data' of size 2 does not divide"), report["indivisible"]
