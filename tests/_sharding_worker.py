"""The 8-device half of the sharding tests: ``python _sharding_worker.py OUT MODELS``
in a process started with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (by
test_sharding_devices.py, twice at once: ``mlp,transformer`` and ``cnn``, one per
core). It runs the example graphs MODELS compiled without a mesh (on one device: the
references) and on three meshes; the run with the MLP also checks the optimizer
state, init's HLO, the collectives, bad annotations and a checkpoint, the run with the
CNN ``mg.fold_batch_norm`` on a mesh. It writes every
number to OUT/results-MODELS.npz and every finding to OUT/report-MODELS.json, which
the tests compare. Nothing runs on import."""

from __future__ import annotations

import json
import os
import sys
import time


def here() -> int:
    """The caller's line number (errors must name the line that made the layer)."""
    return sys._getframe(1).f_lineno


def spec_entries(spec) -> list:
    return [None if e is None else e if isinstance(e, str) else list(e) for e in spec]


def shards_of(tree) -> dict:
    """path -> the global shape, the spec and (device id, shard shape) of every shard."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        out[name] = {"shape": list(leaf.shape), "spec": spec_entries(leaf.sharding.spec),
                     "shards": [[s.device.id, list(s.data.shape)] for s in leaf.addressable_shards]}
    return out


def main(out_dir: str, names: tuple[str, ...]) -> None:
    import jax

    jax.config.update("jax_numpy_dtype_promotion", "strict")  # as the test suite
    import numpy as np
    import optax

    import mlaxgraph as mg
    import _sharding_cases as cases
    from mlaxgraph import ops
    from mlaxgraph.io import sharded_checkpoint
    from mlaxgraph.analysis.hlo.collectives import collectives
    from mlaxgraph.examples import mlp
    from mlaxgraph.distributed import abstract_init

    report: dict = {"device_count": jax.device_count(), "mesh_axes": {}, "seconds": {}}
    part_names = names
    clock = [time.perf_counter()]

    def lap(what):  # where the time goes, for whoever keeps this test fast
        now = time.perf_counter()
        report["seconds"][what] = round(now - clock[0], 2)
        clock[0] = now
    arrays: dict = {}
    meshes = {name: jax.make_mesh(shape, ("data", "model")) for name, shape in cases.MESHES.items()}
    report["mesh_axes"] = {name: dict(m.shape) for name, m in meshes.items()}
    if "zoo" in names:
        zoo(meshes, arrays, report, lap)
        decode(meshes["both"], arrays, report, lap)
        names = tuple(n for n in names if n != "zoo")

    # The references: each model compiled without a mesh runs on one device.
    one_device = {}
    for name in names:
        model, record = mg.compile(cases.graph(name)), {}
        results = cases.run(model, name, record=record)
        arrays.update({f"{name}/one_device/{k}": v for k, v in results.items()})
        arrays.update({f"trainer/{name}/one_device/{k}": v
                       for k, v in cases.run_trainer(model, name).items()})
        one_device[name] = len(record["outputs"].sharding.device_set)
    report["one_device"] = one_device
    lap("one_device")

    # Same numbers on a mesh: forward, and three plain optax steps; where params live.
    models, records = {}, {}
    for name in names:
        for mesh_name, mesh in meshes.items():
            model = mg.compile(cases.graph(name), mesh=mesh, rules=cases.RULES)
            record: dict = {}
            results = cases.run(model, name, record=record)
            models[name, mesh_name], records[name, mesh_name] = model, record
            arrays.update({f"{name}/{mesh_name}/{k}": v for k, v in results.items()})
            report[f"shards/{name}/{mesh_name}"] = shards_of(record["init"])
            report[f"output_spec/{name}/{mesh_name}"] = spec_entries(record["outputs"].sharding.spec)
            lap(f"{name}/{mesh_name}")

    # Capture and intervention on every mesh give the one-device numbers.
    for name in names:
        arrays.update({f"{name}/one_device/{k}": v
                       for k, v in cases.run_taps(mg.compile(cases.graph(name)), name).items()})
        for mesh_name in meshes:
            arrays.update({f"{name}/{mesh_name}/{k}": v
                           for k, v in cases.run_taps(models[name, mesh_name], name).items()})
    lap("taps")

    # The library's Trainer on the 2x4 mesh: its init creates the params sharded too.
    for name in names:
        record = {}
        results = cases.run_trainer(models[name, "both"], name, record=record)
        arrays.update({f"trainer/{name}/both/{k}": v for k, v in results.items()})
        report[f"trainer_specs/{name}"] = jax.tree.map(lambda s: spec_entries(s.spec),
                                                       record["init_shardings"])
        lap(f"trainer/{name}")

    if "cnn" in names:
        # BatchNorm folded on the 2x4 mesh (statistics from a training-mode call): each
        # weight placed as the folded model's own init places it, new biases included;
        # its outputs at inference are the unfolded model's.
        model, init = models["cnn", "both"], records["cnn", "both"]["init"]
        x, _ = cases.data("cnn")
        _, stats = model.apply(init["params"], init["state"], x, rng=jax.random.key(1))
        folded, fparams, fstate = mg.fold_batch_norm(cases.graph("cnn"), init["params"], stats)
        fmodel = mg.compile(folded, mesh=meshes["both"], rules=cases.RULES)
        arrays["fold/cnn/unfolded"] = np.asarray(model.apply(init["params"], stats, x,
                                                             inference_mode=True)[0])
        arrays["fold/cnn/folded"] = np.asarray(fmodel.apply(fparams, fstate, x,
                                                            inference_mode=True)[0])
        report["fold"] = {"folded": shards_of(fparams), "state": shards_of(fstate),
                          "planned": shards_of(fmodel.init(jax.random.key(0))[0])}
        lap("fold")

    if "mlp" not in names:
        return write(out_dir, part_names, arrays, report)

    # Optimizer state made inside jit follows the params once constrained to them.
    optimizer = optax.adam(1e-3)
    model = models["mlp", "both"]

    @jax.jit
    def init_with_optimizer(key):
        params, _ = model.init_fn(key)
        with jax.numpy_dtype_promotion("standard"):
            opt_state = optimizer.init(params)
        return params, opt_state, model.sharding.shard_optimizer_state(optimizer, opt_state)

    params, plain_state, sharded_state = init_with_optimizer(jax.random.key(0))
    report["optimizer_state"] = {
        "params": jax.tree.map(lambda a: spec_entries(a.sharding.spec), params),
        "plain_mu": jax.tree.map(lambda a: spec_entries(a.sharding.spec), plain_state[0].mu),
        "sharded_mu": jax.tree.map(lambda a: spec_entries(a.sharding.spec), sharded_state[0].mu)}
    lap("optimizer_state")

    # init computes each weight's shard on its device: no whole sharded weight in its HLO.
    tp, dp = models["mlp", "tensor_parallel"], models["mlp", "data_parallel"]
    init_hlo = tp.init.lower(jax.random.key(0)).compile().as_text()
    report["init_hlo"] = {"whole_kernel": "f32[64,128]" in init_hlo,
                          "kernel_shard": "f32[64,16]" in init_hlo}

    # Collectives: none in a data-parallel forward pass, gradients all-reduced in its
    # train step, activations gathered or reduced across "model" under tensor parallel.
    report["collectives/dp_apply"] = [list(c) for c in collectives(dp, batch=16, inference_mode=True)]
    report["collectives/dp_step"] = [list(c) for c in collectives(records["mlp", "data_parallel"]["step_hlo"])]
    report["collectives/tp_apply"] = [list(c) for c in collectives(tp.hlo(batch=16, optimized=True,
                                                                          inference_mode=True))]
    report["summary/tp"] = tp.summary()
    lap("hlo")

    # Bad annotations: errors naming the layer and this file's line.
    errors = {}
    try:
        graph, line = mlp(64, (128, 64), 10), here()  # 10 classes over 8 devices
        mg.compile(graph, mesh=meshes["tensor_parallel"], rules=cases.RULES)
    except mg.ShardingError as e:
        errors["indivisible_weight"] = {"message": str(e), "line": line, "type": type(e).__name__}
    x_in = mg.Input(("batch", 64), axes=("batch", "embed"))
    head, line = ops.Linear(10, name="head")(x_in), here()  # 10 over 4 devices
    try:
        mg.compile(mg.Graph(x_in, head), mesh=meshes["both"], rules={"batch": "data", "mlp": "model"})
    except mg.ShardingError as e:
        errors["indivisible_inline"] = {"message": str(e), "line": line, "type": type(e).__name__}
    x_in = mg.Input(("batch", 64), name="pixels", axes=("batch", "embed"))
    relu = ops.relu(ops.Linear(16, kernel_axes=("embed", "hidden"), name="fc")(x_in))
    graph, line = mg.Graph(x_in, ops.constrain(relu, ("batch", "hidden")), name="g"), here()
    try:
        mg.compile(graph, mesh=meshes["tensor_parallel"], rules={"batch": "data", "hidden": "model"})
        errors["constrain_ok"] = True
    except mg.ShardingError as e:  # pragma: no cover - reported to the test
        errors["constrain_ok"] = str(e)
    try:
        model = mg.compile(graph, mesh=meshes["data_parallel"], rules={"batch": "data"})
        params, state = model.init(jax.random.key(0))
        model.apply(params, state, np.ones((12, 64), np.float32))  # 12 rows over 8 devices
    except mg.ShardingError as e:
        errors["indivisible_batch"] = {"message": str(e), "type": type(e).__name__}
    report["errors"] = errors
    lap("errors")

    # Sharded checkpoints through orbax: saved from the 2x4 mesh, restored onto 1x8.
    params = records["mlp", "both"]["init"]["params"]
    where = sharded_checkpoint.save(os.path.join(out_dir, "checkpoint"), {"params": params})
    target, _ = abstract_init(tp)
    restored = sharded_checkpoint.restore(where, {"params": target})["params"]
    report["checkpoint"] = {
        "equal": all(np.array_equal(np.asarray(a), np.asarray(b))
                     for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored))),
        "restored": shards_of(restored),
        "planned": shards_of(records["mlp", "tensor_parallel"]["init"]["params"])}
    lap("checkpoint")
    write(out_dir, names, arrays, report)


def zoo(meshes, arrays: dict, report: dict, lap) -> None:
    """GPT-2 and Llama under ``mg.models.sharding_rules`` on the 2x4 and 1x8 meshes: the
    logits, the loss and its gradients against one device; the collectives of the
    forward pass; ``describe()``. (The train step's collectives and time are measured
    by benchmarks/bench_zoo_sharding.py.)"""
    import jax
    import numpy as np

    import mlaxgraph as mg
    import _sharding_cases as cases
    from mlaxgraph.analysis.hlo.collectives import collectives

    ids = cases.zoo_data()
    for name in cases.ZOO:
        graph = cases.zoo_graph(name)
        for mesh_name in ("one_device",) + cases.ZOO_MESHES:
            if mesh_name == "one_device":
                model, rules = mg.compile(graph), None
            else:
                rules = mg.models.sharding_rules(graph, meshes[mesh_name])
                model = mg.compile(graph, mesh=meshes[mesh_name], rules=rules)
            params, state = model.init(jax.random.key(0))
            logits, _ = model.apply(params, state, ids[:, :-1], inference_mode=True)
            step = cases.zoo_loss_and_grads(model)
            loss, grads = step(params, state, ids)
            prefix = f"zoo/{name}/{mesh_name}"
            arrays[f"{prefix}/logits"] = np.asarray(logits)
            arrays[f"{prefix}/loss"] = np.asarray(loss)
            for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
                arrays[f"{prefix}/grads/" + "/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(leaf)
            if rules is not None:
                forward = collectives(model, batch=cases.ZOO_BATCH, seq=cases.ZOO_SEQ, inference_mode=True)
                report[prefix] = {"rules": rules, "forward": [list(c) for c in forward],
                                  "describe": model.sharding.describe(forward),
                                  "specs": {k: spec_entries(v.sharding.spec) for k, v in
                                            (("down", params[f"{'h.0' if name == 'gpt2' else 'model.layers.0'}"][
                                                "mlp.c_proj" if name == "gpt2" else "mlp.down_proj"]["kernel"]),
                                             ("attn_out", params["h.0" if name == "gpt2" else "model.layers.0"][
                                                 "attn" if name == "gpt2" else "self_attn"]["out"]["kernel"]),
                                             ("key", params["h.0" if name == "gpt2" else "model.layers.0"][
                                                 "attn" if name == "gpt2" else "self_attn"]["key"]["kernel"]))}}
            lap(prefix)


def decode(mesh, arrays: dict, report: dict, lap) -> None:
    """``mg.decoder`` of GPT-2 and Llama on one device and on the 2x4 mesh under
    ``mg.models.sharding_rules``: the prefill's logits and three greedy steps' logits,
    and where each layer's cache lives."""
    import jax
    import numpy as np

    import mlaxgraph as mg
    import _sharding_cases as cases

    ids = cases.zoo_data()[:, :cases.DECODE_PROMPT]
    for name in cases.ZOO:
        graph = cases.zoo_graph(name)
        for mesh_name in ("one_device", "both"):
            if mesh_name == "one_device":
                dec, params_from = mg.decoder(graph, max_length=cases.DECODE_LENGTH), mg.compile(graph)
            else:
                rules = mg.models.sharding_rules(graph, mesh)
                params_from = mg.compile(graph, mesh=mesh, rules=rules)
                dec = mg.decoder(params_from, max_length=cases.DECODE_LENGTH)  # its mesh and rules
            params, state = params_from.init(jax.random.key(0))
            prefix = f"decode/{name}/{mesh_name}"
            logits, cache = dec.prefill(params, state, ids)
            arrays[f"{prefix}/prefill"] = np.asarray(logits)
            layer = cache.layers["h.0" if name == "gpt2" else "model.layers.0"]
            layer = layer["attn" if name == "gpt2" else "self_attn"]["key"]
            spec = getattr(layer.sharding, "spec", None)
            report[prefix] = {"cache_spec": None if spec is None else spec_entries(spec),
                              "cache_shards": sorted({tuple(s.data.shape) for s in layer.addressable_shards}),
                              "cache_shape": list(layer.shape)}
            for i in range(cases.DECODE_STEPS):
                token = np.asarray(logits[:, -1]).argmax(-1)
                logits, cache = dec.step(params, state, cache, token)
                arrays[f"{prefix}/step{i}"] = np.asarray(logits)
            lap(prefix)


def write(out_dir: str, names, arrays: dict, report: dict) -> None:
    import numpy as np

    part = "-".join(names)
    np.savez(os.path.join(out_dir, f"results-{part}.npz"), **arrays)
    with open(os.path.join(out_dir, f"report-{part}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1], tuple(sys.argv[2].split(",")))
