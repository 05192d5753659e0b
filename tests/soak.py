"""The soak (``make soak``; not part of ``make test``): many random valid graphs
compiled and compared with the reference interpreter, many mutated files through every
loader, many saves killed at random points. It writes its figures to SOAK.md.

- Graphs: tests/test_property.py's strategy draws the programs (branches, merges,
  shared layers, nested and shared blocks, activations, Linear, Flatten, Reshape,
  BatchNorm, Dropout, casts) and its reference interpreter checks them. Each graph is
  compiled once, at one binding of its symbolic dims, in batches: one ``jax.jit`` runs
  a batch's applies (inference, and training for graphs with BatchNorm), so XLA's fixed
  cost is paid once per batch. Every fourth graph is also compiled with a bfloat16
  policy and compared with the reference at bfloat16's tolerance. Every registered op
  (tests/test_ops_infer_matches_apply.py's cases) runs through ``mg.compile`` and is
  compared with the op's own apply run outside the compiler.
- Files: a saved model file, train checkpoint and export folder (artifact, weights and
  manifest) mutated (bit flips anywhere and in the arrays, truncations, inserted and
  deleted bytes, a lying header length, JSON-valid edits of the header and of the
  embedded graph) and loaded; each must be refused with an mg error or load equal to
  what was saved. A loader that takes over 10 s counts as a hang; a worker that dies,
  as a crash.
- Kills: tests/_kill_saves.py's children killed at random points of their saves.

Usage: ``python tests/soak.py [--graphs N] [--files N] [--kills N] [--workers W]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import concurrent.futures as futures
import multiprocessing
import os
import platform
import random
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHUNK = 40


def _setup():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path[:0] = [HERE, ROOT]
    import jax

    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_disable_most_optimizations", True)  # compile time, as in test_property


class Hang(Exception):
    pass


def _alarm(seconds):
    import signal

    def raise_hang(*_):
        raise Hang()

    signal.signal(signal.SIGALRM, raise_hang)
    signal.alarm(seconds)


# --- graphs --------------------------------------------------------------------------------


def _graph_chunk(progs, policy_every):
    """Compiles and checks a batch of programs; returns (counts, failures)."""
    import jax
    import numpy as np

    import mlaxgraph as mg
    import test_property as tp

    counts = {"graphs": 0, "graphs_training": 0, "graphs_policy": 0}
    failures = []
    prepared = []
    bindings = tp.BINDINGS[0]
    for index, prog in progs:
        try:
            graph, _ = tp.build(prog)
            models = [("float32", mg.compile(graph))]
            if index % policy_every == 0:
                policy = mg.Policy(compute_dtype="bfloat16", output_dtype="float32")
                models.append(("bfloat16", mg.compile(graph, policy)))
            shapes = jax.eval_shape(models[0][1].init, jax.random.key(0))
            rng = np.random.default_rng(index)
            params = tp.random_weights(shapes[0], rng, state=False)
            state = tp.random_weights(shapes[1], rng, state=True)
            arrays = tp.make_inputs(prog, bindings, rng)
            all_ops = list(tp._walk_ops(graph))
            training = (any(isinstance(op, mg.ops.BatchNorm) for op in all_ops)
                        and not any(isinstance(op, mg.ops.Dropout) and op.rate > 0 for op in all_ops))
            prepared.append((index, prog, graph, models, params, state, arrays, training))
        except Exception as e:  # a valid program must build and compile
            failures.append(f"graph {index}: {type(e).__name__}: {str(e)[:300]}")

    def run_all(batch):
        results = []
        for (_, _, graph, models, _, _, _, training), (params, state, arrays) in zip(prepared, batch):
            mine = []
            for _, model in models:
                mine.append(model.apply_fn(params, state, *arrays, inference_mode=True))
            if training:
                mine.append(models[0][1].apply_fn(params, state, *arrays, inference_mode=False,
                                                  **tp.apply_kwargs(graph, True)))
            results.append(mine)
        return results

    batch = [(p[4], p[5], p[6]) for p in prepared]
    try:
        outputs = jax.jit(run_all)(batch)
    except Exception as e:
        return counts, failures + [f"graphs {[p[0] for p in prepared]}: {type(e).__name__}: {str(e)[:300]}"]
    for (index, prog, graph, models, params, state, arrays, training), mine in zip(prepared, outputs):
        try:
            tp.compare_with_reference(prog, graph, params, state, arrays, *mine[0], bindings, False)
            counts["graphs"] += 1
            if len(models) > 1:
                _compare_loosely(tp, prog, graph, params, state, arrays, mine[1][0], bindings)
                counts["graphs_policy"] += 1
            if training:
                tp.compare_with_reference(prog, graph, params, state, arrays, *mine[-1], bindings, True)
                counts["graphs_training"] += 1
        except Exception as e:
            failures.append(f"graph {index}: {type(e).__name__}: {str(e)[:300]}\n{graph}")
    return counts, failures


def _compare_loosely(tp, prog, graph, params, state, arrays, out, bindings):
    """A bfloat16-policy output against the float64 reference, at bfloat16's precision
    compounded over the graph's layers."""
    import numpy as np

    ref, _ = tp.reference(graph, params, state, [tp.as_reference_input(a) for a in arrays], False, set())
    out = out if isinstance(out, tuple) else (out,)
    for i, (o, r) in enumerate(zip(out, ref)):
        o = np.asarray(o)
        assert o.shape == r.shape, f"bfloat16 policy output {i}: shape {o.shape}, reference {r.shape}"
        if r.dtype.kind == "i":
            np.testing.assert_array_equal(o, r)
            continue
        scale = max(1.0, float(np.max(np.abs(r))) if r.size else 1.0)
        np.testing.assert_allclose(o.astype(np.float64), r, rtol=0.1, atol=0.1 * scale,
                                   err_msg=f"bfloat16 policy output {i}")


def graph_worker(worker: int, count: int, policy_every: int):
    _setup()
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    import test_property as tp

    totals = {"graphs": 0, "graphs_training": 0, "graphs_policy": 0, "graph_hangs": 0}
    failures: list[str] = []
    if count == 0:
        return totals, failures
    pending: list = []

    def flush():
        _alarm(600)
        try:
            counts, found = _graph_chunk(pending, policy_every)
        except Hang:
            counts, found = {"graph_hangs": 1}, [f"graphs {[i for i, _ in pending]}: over 600 s"]
        finally:
            _alarm(0)
        for k, v in counts.items():
            totals[k] += v
        failures.extend(found)
        pending.clear()

    drawn = [0]

    @with_seed(1000 + worker)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(prog=tp.programs())
    def draw(prog):
        drawn[0] += 1
        pending.append((worker * 10**6 + drawn[0], prog))
        if len(pending) == CHUNK:
            flush()

    draw()
    if pending:
        flush()
    return totals, failures


def every_op_worker():
    """Every registered op's cases, compiled as a one-layer graph, against the op's own
    apply outside the compiler."""
    _setup()
    import jax
    import numpy as np

    import mlaxgraph as mg
    from mlaxgraph.compiler.interpreter import step_key
    from mlaxgraph.compiler.program import get_in
    from test_ops_infer_matches_apply import CASES

    checked, failures, names = 0, [], set()
    for name in sorted(CASES):
        for layer, input_lists in CASES[name]:
            for inputs in input_lists:
                try:
                    dims = {"batch": 3, "time": 4, "h": 6, "w": 5, "seq": 4}
                    xs = [mg.Input(tuple(d for d in shape), dtype, name=f"in{i}")
                          for i, (shape, dtype) in enumerate(inputs)]
                    fresh = dataclasses.replace(layer)  # a new object: no sharing across cases
                    if name == "multi_head_attention" and len(xs) == 3:
                        outs = fresh(xs[0], xs[1], mask=xs[2])
                    else:
                        outs = fresh(*xs)
                    graph = mg.Graph(xs, list(outs) if isinstance(outs, tuple) else outs)
                    model = mg.compile(graph)
                    params, state = model.init(jax.random.key(1))
                    rng = np.random.default_rng(0)
                    arrays = []
                    for shape, dtype in inputs:
                        concrete = tuple(dims.get(d, 3) if isinstance(d, str) else d for d in shape)
                        if np.dtype(mg.TensorSpec.of(concrete, dtype).dtype).kind in "iub":
                            value = rng.integers(0, 2, concrete)
                        else:
                            value = rng.standard_normal(concrete)
                        arrays.append(jax.numpy.asarray(value).astype(dtype))
                    key = jax.random.key(2)
                    got, _ = model.apply(params, state, *arrays, rng=key, inference_mode=True)
                    step = model.program.steps[-1]
                    p = get_in(params, step.weights) if step.param_specs else {}
                    s = get_in(state, step.weights) if step.state_specs else {}
                    with jax.disable_jit():
                        want, _ = step.op.apply(p, s, arrays, inference_mode=True,
                                                rng=step_key(key, step.rng_path) if step.rng_path else None)
                    got = got if isinstance(got, tuple) else (got,)
                    for g, w in zip(got, want):
                        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                                   rtol=2e-2, atol=2e-2)
                    checked += 1
                    names.add(name)
                except Exception as e:
                    failures.append(f"op {name} {inputs}: {type(e).__name__}: {str(e)[:300]}")
    return {"op_cases": checked, "ops": len(names)}, failures


# --- mutated files --------------------------------------------------------------------------


def _mutate(raw: bytes, rng: random.Random, kind: str, data_start: int | None) -> bytes:
    """One mutant of ``raw``; ``data_start``: where a safetensors file's arrays begin."""
    import json
    import struct

    b = bytearray(raw)
    if kind == "flip":
        at = rng.randrange(len(b))
        b[at] ^= 1 << rng.randrange(8)
    elif kind == "flip_data" and data_start is not None and data_start < len(b):
        at = rng.randrange(data_start, len(b))
        b[at] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randrange(2, 9)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == "truncate":
        del b[rng.randrange(len(b)):]
    elif kind == "insert":
        at = rng.randrange(len(b) + 1)
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 8, 64))))
    elif kind == "delete":
        at = rng.randrange(len(b))
        del b[at:at + rng.choice((1, 8, 64))]
    elif kind == "header_length" and data_start is not None:
        (n,) = struct.unpack("<Q", raw[:8])
        b[:8] = struct.pack("<Q", max(0, n + rng.choice((-16, -8, -1, 1, 8, 16, 2**40))))
    elif kind in ("json_header", "json_graph") and data_start is not None:
        header = json.loads(raw[8:data_start])
        meta = header.get("__metadata__", {})
        if kind == "json_graph" and "mlaxgraph.graph" in meta:
            graph = json.loads(meta["mlaxgraph.graph"])
            _edit_json(graph, rng)
            meta["mlaxgraph.graph"] = json.dumps(graph, sort_keys=True, separators=(",", ":"))
        else:
            _edit_json(header, rng)
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + raw[data_start:]
    elif kind == "json_manifest":
        manifest = json.loads(raw)
        _edit_json(manifest, rng)
        return json.dumps(manifest, indent=2).encode()
    else:
        b[rng.randrange(len(b))] ^= 0xFF
    return bytes(b)


def _edit_json(value, rng: random.Random) -> None:
    """A JSON-valid edit of one leaf (a number changed, a string changed, a list
    element dropped) somewhere in ``value``."""
    path = []
    node = value
    while isinstance(node, (dict, list)) and node:
        key = rng.choice(sorted(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
        if rng.random() < 0.2:
            break
    if not path:
        return
    parent, key = path[-1]
    old = parent[key]
    if isinstance(old, bool):
        parent[key] = not old
    elif isinstance(old, int):
        parent[key] = old + rng.choice((-1, 1, 7))
    elif isinstance(old, float):
        parent[key] = old * 1.5 + 1
    elif isinstance(old, str):
        parent[key] = old[:-1] + chr(ord(old[-1]) ^ 1) if old else "x"
    elif isinstance(parent, list):
        parent.pop(key)
    else:
        parent[key] = None


FILE_KINDS = ("flip", "flip_data", "flips", "truncate", "insert", "delete", "header_length",
              "json_header", "json_graph")


def files_worker(worker: int, count: int):
    """Mutants of a model file, a checkpoint and an export folder through their loaders;
    returns the outcome counts and a sample of what went wrong."""
    _setup()
    import shutil
    import struct
    import warnings

    import jax
    import numpy as np
    import optax

    import mlaxgraph as mg
    from mlaxgraph.examples import mlp

    warnings.simplefilter("error", mg.UnverifiedFileWarning)  # a mutant must not pass as old
    scratch = tempfile.mkdtemp(prefix="soak-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    graph = mlp(4, (8,), 3)
    model = mg.compile(graph)
    params, state = model.init(jax.random.key(0))
    model_path = os.path.join(scratch, "model.mlg")
    mg.save(model_path, graph, params, state)
    trainer = mg.train.Trainer(model, optax.adam(1e-3))
    ts = trainer.init(jax.random.key(0))
    manager = mg.train.CheckpointManager(os.path.join(scratch, "run"))
    checkpoint_path = manager.save(ts)
    template = trainer.init(jax.random.key(1))
    folder = os.path.join(scratch, "export")
    model.save_hlo(folder, params=params, state=state)
    exported_files = ("exported.jax", "weights.safetensors", "manifest.json")
    originals = {name: open(os.path.join(folder, name), "rb").read() for name in exported_files}
    leaves = [np.asarray(a) for a in jax.tree.leaves((params, state))]
    ts_leaves = [np.asarray(a) for a in jax.tree.leaves(jax.tree.map(
        lambda a: jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a, ts))]

    def data_start(raw):
        if len(raw) < 8:
            return None
        (n,) = struct.unpack("<Q", raw[:8])
        return 8 + n if 8 + n <= len(raw) else None

    def same(got, want):
        return len(got) == len(want) and all(
            g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
            for g, w in zip(map(np.asarray, got), want))

    def load_model(raw):
        open(model_path, "wb").write(raw)
        g, p, s = mg.load(model_path)
        return g == graph and same(jax.tree.leaves((p, s)), leaves)

    def load_checkpoint(raw):
        open(checkpoint_path, "wb").write(raw)
        restored = manager.restore(template)
        restored = jax.tree.map(lambda a: jax.random.key_data(a) if jax.dtypes.issubdtype(
            a.dtype, jax.dtypes.prng_key) else a, restored)
        return same(jax.tree.leaves(restored), ts_leaves)

    def load_export(name, raw):
        for other, content in originals.items():
            open(os.path.join(folder, other), "wb").write(raw if other == name else content)
        loaded = mg.load_exported(folder)
        x = np.ones((2, 4), np.float32)
        return (same(jax.tree.leaves((loaded.params, loaded.state)), leaves)
                and np.array_equal(np.asarray(loaded(x)[0]), np.asarray(model.apply(params, state, x)[0])))

    targets = [("model file", open(model_path, "rb").read(), load_model, 6),
               ("checkpoint", open(checkpoint_path, "rb").read(), load_checkpoint, 2)]
    for name in exported_files:
        targets.append((f"export {name}", originals[name], lambda raw, n=name: load_export(n, raw), 1))
    weighted = [t for t in targets for _ in range(t[3])]
    outcomes: dict = {}
    samples: list[str] = []
    rng = random.Random(5000 + worker)
    for i in range(count):
        label, raw, load, _ = weighted[i % len(weighted)]
        kinds = FILE_KINDS if label != "export manifest.json" else ("flip", "flips", "truncate",
                                                                      "insert", "delete", "json_manifest")
        if label == "export exported.jax":
            kinds = ("flip", "flips", "truncate", "insert", "delete")
        kind = rng.choice(kinds)
        mutant = _mutate(raw, rng, kind, data_start(raw))
        _alarm(10)
        try:
            outcome = "loaded equal" if load(mutant) else "SILENT: loaded other content"
        except Hang:
            outcome = "HANG"
        except mg.MlaxGraphError:
            outcome = "refused (mg error)"
        except Exception as e:
            outcome = f"RAW EXCEPTION {type(e).__name__}"
            if len(samples) < 20:
                samples.append(f"{label} {kind}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            _alarm(0)
        if outcome.startswith("SILENT") and len(samples) < 20:
            samples.append(f"{label} {kind}: loaded other content")
        outcomes[(label, outcome)] = outcomes.get((label, outcome), 0) + 1
    shutil.rmtree(scratch, ignore_errors=True)
    return outcomes, samples


# --- killed saves ---------------------------------------------------------------------------


def kills_worker(count: int):
    _setup()
    from _kill_saves import STAGES, run_trials

    rng = random.Random(7)
    directory = tempfile.mkdtemp(prefix="soak-kills-")
    size = 4 * 2**20  # the arrays' bytes: every write kill point lies inside the file
    points = []
    for _ in range(count):
        stage = rng.choice(STAGES + ("write",) * 4)   # most kills while writing
        points.append((rng.randint(1, 3), stage, rng.randrange(size) if stage == "write" else 0))
    stages: dict = {}
    counts = run_trials(os.path.join(directory, "model.mlg"), points,
                        on_result=lambda point, _: stages.__setitem__(point[1], stages.get(point[1], 0) + 1))
    return {**counts, "stages": stages}


# --- the run --------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=120)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--policy-every", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(ROOT, "SOAK.md"))
    args = parser.parse_args(argv)
    start = time.monotonic()
    w = args.workers
    crashes: list[str] = []
    results: dict = {"graphs": [], "ops": [], "files": [], "kills": []}
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=w, mp_context=context) as pool:
        jobs = [(pool.submit(kills_worker, args.kills), "kills")]
        jobs.append((pool.submit(every_op_worker), "ops"))
        parts = 4 * w
        jobs += [(pool.submit(graph_worker, i, args.graphs // parts + (i < args.graphs % parts),
                              args.policy_every), "graphs") for i in range(parts)]
        jobs += [(pool.submit(files_worker, i, args.files // parts + (i < args.files % parts)), "files")
                 for i in range(parts)]
        for job, kind in jobs:
            try:
                results[kind].append(job.result())
            except Exception as e:  # a worker that died: a crash (BrokenProcessPool)
                crashes.append(f"{kind}: {type(e).__name__}: {e}")
    minutes = (time.monotonic() - start) / 60
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_minutes = (usage.ru_utime + usage.ru_stime) / 60
    text = report(args, results, crashes, minutes, cpu_minutes)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    bad = ("SILENT", "RAW", "HANG")
    failed = (crashes or any(f for _, f in results["graphs"] + results["ops"])
              or any(k[1].startswith(bad) for o, _ in results["files"] for k in o))
    return 1 if failed else 0


def report(args, results, crashes, minutes, cpu_minutes) -> str:
    graphs: dict = {}
    graph_failures: list[str] = []
    for counts, failures in results["graphs"] + results["ops"]:
        for k, v in counts.items():
            graphs[k] = graphs.get(k, 0) + v
        graph_failures += failures
    outcomes: dict = {}
    samples: list[str] = []
    for found, sample in results["files"]:
        for key, v in found.items():
            outcomes[key] = outcomes.get(key, 0) + v
        samples += sample
    kills = results["kills"][0] if results["kills"] else {}
    command = ("nice -n 10 .venv/bin/python tests/soak.py" +
               "".join(f" --{k.replace('_', '-')} {getattr(args, k)}"
                       for k in ("graphs", "files", "kills", "workers")))
    lines = [
        "# Soak", "",
        f"`make soak` ran `{command}` on {platform.machine()} with {os.cpu_count()} cores "
        f"in {minutes:.1f} minutes of wall time and {cpu_minutes:.1f} minutes of CPU time "
        f"over its processes ({time.strftime('%Y-%m-%d')}; the machine's load average was "
        f"{os.getloadavg()[0]:.1f} at the end, other work sharing the cores).", "",
        "## Random graphs against the reference interpreter", "",
        "| what | count |", "|---|---|",
        f"| random valid graphs compiled and equal to the reference (inference) | {graphs.get('graphs', 0):,} |",
        f"| of them also checked in training mode (BatchNorm statistics and state) | {graphs.get('graphs_training', 0):,} |",
        f"| of them also compiled with a bfloat16 policy, within bfloat16's tolerance | {graphs.get('graphs_policy', 0):,} |",
        f"| registered ops ({graphs.get('ops', 0)}) in cases compiled and equal to the op's own apply | {graphs.get('op_cases', 0):,} |",
        f"| batches over 600 s (hangs) | {graphs.get('graph_hangs', 0)} |",
        f"| failures | {len(graph_failures)} |", "",
    ]
    lines += [f"    {f}" for f in graph_failures[:20]]
    lines += ["## Mutated files through the loaders", "",
              "| file | outcome | count |", "|---|---|---|"]
    lines += [f"| {label} | {outcome} | {count:,} |" for (label, outcome), count in sorted(outcomes.items())]
    total = sum(outcomes.values())
    silent = sum(v for (_, o), v in outcomes.items() if o.startswith(("SILENT", "RAW", "HANG")))
    lines += ["", f"{total:,} mutants; silent, raw exceptions or hangs: {silent}.", ""]
    lines += [f"    {s}" for s in samples[:20]]
    lines += ["## Saves killed at random points", "",
              f"{kills.get('trials', 0)} saves killed with SIGKILL (by stage: "
              f"{', '.join(f'{k} {v}' for k, v in sorted(kills.get('stages', {}).items()))}); "
              f"after each the file loaded as one whole version: the new one "
              f"{kills.get('replaced', 0)} times, the old one {kills.get('kept', 0)} times.", ""]
    lines += ["## Crashes", "", f"{len(crashes)} worker processes died."]
    lines += [f"    {c}" for c in crashes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
