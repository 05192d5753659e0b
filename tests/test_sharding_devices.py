"""Sharding on several devices, which the test process (JAX already started with one
CPU device) cannot have: worker processes run with virtual CPU devices and report.

- ``_sharding_worker.py`` (8 devices; two of them at once, one per core, each with
  its share of the models) runs the MLP, the residual CNN and the
  Transformer block compiled without a mesh (on one device: the references) and on
  meshes 8x1 (data parallel), 1x8 (tensor parallel) and 2x4 (both): init, a forward
  pass in training mode (dropout, batch statistics), three steps of a plain jitted
  optax SGD step, three steps of ``mg.train.Trainer`` (2x4); where init put every
  shard; the collectives XLA inserted; bad annotations; an orbax checkpoint saved on
  one mesh and restored onto another; the CNN's BatchNorms folded on the 2x4 mesh.
- ``_multiprocess_worker.py`` x 2 (2 devices each) train the MLP together through
  ``jax.distributed`` on localhost, each feeding half of every batch.

Tolerance: initial weights must be identical (each device computes its shard of the
same random bits). Everything computed from them must agree within 1e-5, absolute
and relative, in float32 (measured worst: 3e-6, the CNN's outputs under tensor
parallelism): sharding a contraction or a batch mean over devices sums partial
results across devices, which changes the order of float32 additions (eps 1.2e-7,
sums of hundreds of terms), while a sharding bug (a wrong slice, a missing
reduction) is off by O(1).

The workers compile with ``--xla_backend_optimization_level=0``: it only lowers how
hard LLVM optimizes the CPU kernels (not the HLO passes, and not the SPMD partitioner
under test) and makes compiling five times faster. The workers start together when
the module's first test runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

import _sharding_cases as cases

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TIMEOUT = 900
RTOL = ATOL = 1e-5


def _env(devices: int) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith(("--xla_force_host_platform_device_count",
                                  "--xla_backend_optimization_level"))]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}",
                                         "--xla_backend_optimization_level=0"])
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_NUM_CPU_DEVICES", None)
    # the workers import this checkout's package (as the tests do), not another install
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _jax_version() -> str:
    import jax

    return jax.__version__


def _free_port() -> int:
    """A port free now; another process may take it before the coordinator binds it,
    which ``_start_pair`` notices and retries."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_pair(out: pathlib.Path, attempt: int) -> list[subprocess.Popen]:
    port = _free_port()
    return [_start([HERE / "_multiprocess_worker.py", i, port, out], 2,
                   out / f"process{i}-attempt{attempt}.log") for i in (0, 1)]


def _start(args, devices: int, log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *map(str, args)], env=_env(devices), cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _finish(process: subprocess.Popen, log: pathlib.Path, what: str) -> None:
    try:
        code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        code = "killed after a timeout"
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        pytest.fail(f"{what} failed ({code}); the end of its output:\n{tail}", pytrace=False)


#: The 8-device runs, split in two processes of about equal work (one per core).
PARTS = ("mlp,transformer", "cnn,zoo")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Starts the 8-device workers and the two-process pair at once."""
    out = tmp_path_factory.mktemp("sharding")
    eight = [_start([HERE / "_sharding_worker.py", out, part], 8, out / f"eight-{part}.log")
             for part in PARTS]
    pair = _start_pair(out, 0)
    yield out, eight, pair
    for process in [*eight, *pair]:
        if process.poll() is None:
            process.kill()


@pytest.fixture(scope="module")
def eight(workers):
    out, processes, _ = workers
    report, results = {}, {}
    for part, process in zip(PARTS, processes):
        _finish(process, out / f"eight-{part}.log",
                f"the 8-device worker (tests/_sharding_worker.py {part})")
        name = part.replace(",", "-")
        found = json.loads((out / f"report-{name}.json").read_text())
        for key in ("one_device", "seconds"):
            report.setdefault(key, {}).update(found.pop(key))
        report.update(found)
        results.update(np.load(out / f"results-{name}.npz"))
    return report, results


@pytest.fixture(scope="module")
def two_processes(workers):
    out, _, pair = workers
    from _multiprocess_worker import PORT_TAKEN

    attempt = 0
    while True:  # the port released by _free_port can be taken before the coordinator binds it
        try:
            taken = pair[0].wait(timeout=TIMEOUT) == PORT_TAKEN
        except subprocess.TimeoutExpired:
            taken = False
        if not taken or attempt == 4:
            break
        pair[1].kill()
        pair[1].wait()
        attempt += 1
        pair[:] = _start_pair(out, attempt)
    for i, process in enumerate(pair):
        _finish(process, out / f"process{i}-attempt{attempt}.log",
                f"process {i} of the two-process jax.distributed run on CPU "
                f"(tests/_multiprocess_worker.py; it needs CPU collectives through gloo, "
                f"which JAX 0.10.2 has and uses by default; an installed JAX {_jax_version()} "
                f"without them cannot run it)")
    return dict(np.load(out / "multiprocess.npz"))


def _compare(results: dict, reference: str, candidate: str, groups=None) -> int:
    """Asserts every array under ``candidate/`` matches ``reference/``; returns how
    many were compared."""
    count = 0
    for key, want in results.items():
        if not key.startswith(reference + "/"):
            continue
        name = key[len(reference) + 1:]
        if groups is not None and name.split("/")[0] not in groups:
            continue
        got = results[f"{candidate}/{name}"]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        if name.startswith("init/"):
            np.testing.assert_array_equal(got, want, err_msg=f"{candidate}: {name}")
        else:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{candidate}: {name}")
        count += 1
    return count


def test_the_worker_has_eight_devices_and_the_references_one(eight):
    report, _ = eight
    assert report["device_count"] == 8
    assert report["one_device"] == {name: 1 for name in cases.MODELS}
    assert report["mesh_axes"] == {"data_parallel": {"data": 8, "model": 1},
                                   "tensor_parallel": {"data": 1, "model": 8},
                                   "both": {"data": 2, "model": 4}}


@pytest.mark.parametrize("mesh", list(cases.MESHES))
@pytest.mark.parametrize("model", cases.MODELS)
def test_forward_pass_matches_one_device(eight, model, mesh):
    _, results = eight
    compared = _compare(results, f"{model}/one_device", f"{model}/{mesh}",
                        groups=("init", "outputs", "apply_state"))
    assert compared >= 4


@pytest.mark.parametrize("mesh", list(cases.MESHES))
@pytest.mark.parametrize("model", cases.MODELS)
def test_plain_optax_steps_match_one_device(eight, model, mesh):
    _, results = eight
    compared = _compare(results, f"{model}/one_device", f"{model}/{mesh}",
                        groups=("losses", "params", "state"))
    assert compared >= 4
    losses = results[f"{model}/{mesh}/losses"]
    assert losses.shape == (cases.STEPS,) and losses[-1] < losses[0]  # it trains


@pytest.mark.parametrize("mesh", list(cases.MESHES))
@pytest.mark.parametrize("model", cases.MODELS)
def test_capture_and_intervention_match_one_device(eight, model, mesh):
    _, results = eight
    compared = _compare(results, f"{model}/one_device", f"{model}/{mesh}", groups=("taps",))
    assert compared >= 4  # every layer's output and the model's, each compared


@pytest.mark.parametrize("model", cases.MODELS)
def test_trainer_matches_one_device_on_a_2x4_mesh(eight, model):
    report, results = eight
    assert _compare(results, f"trainer/{model}/one_device", f"trainer/{model}/both") >= 4
    # Trainer.init (its own jit around model.init_fn) creates the params sharded too.
    planned = {path: _trimmed(leaf["spec"]) for path, leaf in report[f"shards/{model}/both"].items()
               if path.startswith("params/")}
    trainer = {}

    def walk(tree, prefix):
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}/")
            else:
                trainer[prefix + key] = _trimmed(value)

    walk(report[f"trainer_specs/{model}"], "params/")
    assert trainer == planned


def _trimmed(spec: list) -> list:
    """A spec without trailing Nones (P(None, 'model', None) is P(None, 'model'))."""
    spec = list(spec)
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def test_batch_norm_folds_on_a_mesh_keeping_each_weight_where_init_puts_it(eight):
    report, results = eight
    fold = report["fold"]
    assert fold["folded"] == fold["planned"] and fold["state"] == {}
    assert fold["folded"]["res1/conv_a/bias"]["spec"] == ["model"]   # a new bias, split as its kernel
    np.testing.assert_allclose(results["fold/cnn/folded"], results["fold/cnn/unfolded"],
                               rtol=RTOL, atol=ATOL)


def test_optimizer_state_follows_the_params_once_constrained(eight):
    report, _ = eight
    state = report["optimizer_state"]
    assert state["sharded_mu"] == state["params"]
    assert state["params"]["dense"]["kernel"] == [None, "model"]
    # (Without it, JAX 0.10.2 replicates optax's zeros_like made inside jit: the worker
    # records that as "plain_mu"; not asserted, it is JAX's choice to make.)


def _expected_shard(shape, spec, axes) -> list:
    out = list(shape)
    for i, entry in enumerate(spec):
        for axis in ([] if entry is None else [entry] if isinstance(entry, str) else entry):
            out[i] //= axes[axis]
    return out


@pytest.mark.parametrize("mesh", list(cases.MESHES))
@pytest.mark.parametrize("model", cases.MODELS)
def test_init_creates_each_weight_sharded(eight, model, mesh):
    report, _ = eight
    axes = report["mesh_axes"][mesh]
    sharded = 0
    for path, leaf in report[f"shards/{model}/{mesh}"].items():
        devices = sorted(device for device, _ in leaf["shards"])
        assert devices == list(range(8)), path
        want = _expected_shard(leaf["shape"], leaf["spec"], axes)
        assert all(shape == want for _, shape in leaf["shards"]), (path, leaf)
        sharded += want != leaf["shape"]
    if mesh != "data_parallel":  # data parallel replicates the weights; the others split them
        assert sharded >= 3


def test_mlp_weights_live_where_the_rules_say(eight):
    report, _ = eight
    tp = report["shards/mlp/tensor_parallel"]
    assert tp["params/dense/kernel"]["spec"] == [None, "model"]
    assert {tuple(s) for _, s in tp["params/dense/kernel"]["shards"]} == {(64, 16)}
    assert {tuple(s) for _, s in tp["params/dense/bias"]["shards"]} == {(16,)}
    dp = report["shards/mlp/data_parallel"]
    assert {tuple(s) for _, s in dp["params/dense/kernel"]["shards"]} == {(64, 128)}
    assert report["output_spec/mlp/data_parallel"][:1] == ["data"]
    assert report["output_spec/mlp/tensor_parallel"] == [None, "model"]
    assert report["output_spec/mlp/both"] == ["data", "model"]


def test_init_never_makes_a_sharded_weight_whole(eight):
    report, _ = eight
    assert report["init_hlo"] == {"whole_kernel": False, "kernel_shard": True}


def test_collectives_are_the_ones_sharding_needs(eight):
    report, _ = eight
    assert report["collectives/dp_apply"] == []  # data parallel forward: no communication
    step = report["collectives/dp_step"]
    assert step and all(kind == "all-reduce" for kind, _, _ in step)  # gradients summed
    layers = {name for _, _, layer in step for name in layer.split(",")}
    assert {"dense", "dense_1", "logits"} <= layers
    tp = report["collectives/tp_apply"]
    assert tp and {layer for _, _, layer in tp} <= {"dense", "relu", "dense_1", "relu_1", "logits"}


def test_sharded_summary_has_a_sharding_column(eight):
    report, _ = eight
    summary = report["summary/tp"]
    assert "sharding" in summary.splitlines()[2]
    assert "kernel[-,model] bias[model] out[data,model]" in summary
    assert "mesh: data=1 x model=8 (8 devices); rules: batch->data, mlp->model, heads->model" in summary


def test_bad_annotations_raise_sharding_errors_naming_the_layer_and_line(eight):
    report, _ = eight
    errors = report["errors"]
    worker = str(HERE / "_sharding_worker.py")
    weight = errors["indivisible_weight"]
    assert weight["type"] == "ShardingError"
    assert weight["message"].startswith("layer 'logits' (op linear): weight 'kernel' cannot be sharded")
    assert "dim 1 ('mlp') of size 10 is not divisible by mesh axis 'model' of size 8" in weight["message"]
    assert f"{worker}:{weight['line']}" in weight["message"]
    inline = errors["indivisible_inline"]
    assert inline["message"].startswith("layer 'head' (op linear)")
    assert f"{worker}:{inline['line']}" in inline["message"]
    assert errors["constrain_ok"] is True
    batch = errors["indivisible_batch"]
    assert batch["type"] == "ShardingError"
    assert batch["message"].startswith("layer 'pixels' (op input): output 0 has dim 0 of size 12")


def test_orbax_checkpoint_restores_onto_another_mesh(eight):
    report, _ = eight
    checkpoint = report["checkpoint"]
    assert checkpoint["equal"]
    assert checkpoint["restored"] == checkpoint["planned"]  # each device holds its 1x8 shard


def test_two_processes_train_the_mlp_as_one(two_processes, eight):
    _, results = eight
    compared = 0
    for key, got in two_processes.items():
        if key.startswith("params/") or key == "losses":
            want = results[f"mlp/one_device/{key}"]
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=key)
            compared += 1
    assert compared == 7
    assert bool(two_processes["checkpoint_equal"])  # orbax, both processes writing shards
    # The single-file CheckpointManager refuses arrays split over processes, by name.
    refused = str(two_processes["single_file_refused"])
    assert "sharded over several processes" in refused and "sharded_checkpoint" in refused, refused


# --- the zoo under mg.models.sharding_rules (the Megatron layout) ------------------------


@pytest.mark.parametrize("mesh", cases.ZOO_MESHES)
@pytest.mark.parametrize("family", list(cases.ZOO))
def test_zoo_megatron_layout_matches_one_device(eight, family, mesh):
    """mg.models.sharding_rules(graph, mesh) on GPT-2 and a Llama with 2 key/value heads:
    logits, the next-token loss and every gradient equal one device's."""
    report, results = eight
    compared = _compare(results, f"zoo/{family}/one_device", f"zoo/{family}/{mesh}")
    assert compared >= 3 + 10
    found = report[f"zoo/{family}/{mesh}"]
    # Megatron: the down-projection and the attention's output projection row-parallel,
    # the key/value projections split by head unless fewer heads than devices.
    assert found["specs"]["down"] == ["model", None]
    assert found["specs"]["attn_out"] == ["model", None, None]
    if family == "llama":  # 2 key/value heads < 4 or 8 devices: replicated, as MaxText
        assert "kv_heads" not in found["rules"] and found["specs"]["key"] == [None, None, None]
    else:
        assert found["specs"]["key"] == [None, "model", None]


@pytest.mark.parametrize("mesh", cases.ZOO_MESHES)
@pytest.mark.parametrize("family", list(cases.ZOO))
def test_zoo_forward_pass_has_one_all_reduce_per_attention_and_per_mlp(eight, family, mesh):
    """The optimized HLO of the forward pass: per block, exactly two collectives, both
    all-reduces: one after the attention's row-parallel output projection, one after the
    MLP's down-projection; describe() counts them per block."""
    report, _ = eight
    found = report[f"zoo/{family}/{mesh}"]
    prefix = "h" if family == "gpt2" else "model.layers"
    attention, down = ("attn", "mlp.c_proj") if family == "gpt2" else ("self_attn", "mlp.down_proj")
    for block in range(cases.ZOO[family].get("n_layer", cases.ZOO[family].get("num_hidden_layers"))):
        mine = [c for c in found["forward"] if f"{prefix}.{block}/" in c[2]]
        assert [c[0] for c in mine] == ["all-reduce", "all-reduce"], mine
        assert any(f"{prefix}.{block}/{attention}" in c[2] for c in mine)
        assert any(f"{prefix}.{block}/{down}" in c[2] for c in mine)
        assert f"  {prefix}.{block}: 2 all-reduce" in found["describe"]
    assert len(found["forward"]) == 2 * (block + 1)  # nothing outside the blocks
    assert f"{prefix}.0/{down}" in found["describe"] and "kernel[model,-]" in found["describe"]


# --- mg.decoder on the 2x4 mesh ---------------------------------------------------------


@pytest.mark.parametrize("family", list(cases.ZOO))
def test_decoder_on_a_mesh_matches_one_device_with_the_cache_split_by_heads(eight, family):
    """mg.decoder of a model compiled with mg.models.sharding_rules on the 2x4 mesh: the
    prefill's logits and three greedy steps' equal one device's; each layer's cache is
    split by batch on "data" and, where the key/value heads are split (GPT-2's 8), by
    heads on "model"; Llama's 2 key/value heads are replicated, as its kernels are."""
    report, results = eight
    compared = _compare(results, f"decode/{family}/one_device", f"decode/{family}/both")
    assert compared == 1 + cases.DECODE_STEPS
    found = report[f"decode/{family}/both"]
    assert found["cache_shape"] == report[f"decode/{family}/one_device"]["cache_shape"]
    batch, length, heads, head_dim = found["cache_shape"]
    if family == "gpt2":
        assert found["cache_spec"] == ["data", None, "model"]
        assert found["cache_shards"] == [[batch // 2, length, heads // 4, head_dim]]
    else:
        assert found["cache_spec"] == ["data"]
        assert found["cache_shards"] == [[batch // 2, length, heads, head_dim]]
