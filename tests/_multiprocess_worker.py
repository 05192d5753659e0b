"""One of two processes training the MLP together through ``jax.distributed`` on CPU:
``python _multiprocess_worker.py PROCESS_ID PORT OUT`` (test_sharding_devices.py starts
both, each with 2 virtual CPU devices: 4 devices in all, a 2x2 mesh whose "data" axis
spans the two processes and whose "model" axis lies within each).

Each process feeds its own half of every batch; process 0 writes the final params
(gathered from both processes) and the losses to OUT/multiprocess.npz, and every
process checks a sharded checkpoint saved and restored by both. Nothing runs on
import."""

from __future__ import annotations

import os
import sys


#: The exit status of process 0 when the coordinator's port was taken meanwhile (the
#: test picks a free port and releases it before the coordinator binds it): the test
#: then starts both processes again on another port.
PORT_TAKEN = 75


def main(process_id: int, port: int, out_dir: str) -> None:
    import jax

    # The CPU collectives: gloo is JAX 0.10's default; set it for older versions.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                                   process_id=process_id, initialization_timeout=120)
    except Exception as e:
        if process_id == 0 and "Failed to start RPC server" in str(e):
            print(f"port {port} was taken before the coordinator could bind it: {e}", flush=True)
            sys.exit(PORT_TAKEN)
        raise
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    import numpy as np
    import optax
    from jax.experimental import multihost_utils

    import mlaxgraph as mg
    import _sharding_cases as cases
    from mlaxgraph.io import sharded_checkpoint
    from mlaxgraph.distributed import abstract_init, shard_batch

    assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.devices())
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    model = mg.compile(cases.graph("mlp"), mesh=mesh, rules=cases.RULES)
    params, state = model.init(jax.random.key(0))

    x, y = cases.data("mlp")
    half = cases.BATCH // 2
    local = slice(process_id * half, (process_id + 1) * half)
    xs, ys = shard_batch(model, x[local], y[local])  # global arrays from each half
    optimizer = optax.sgd(cases.LEARNING_RATE)
    step = cases.train_step(model, "mlp", optimizer)
    opt_state = optimizer.init(params)
    losses = []
    for i in range(cases.STEPS):
        params, state, opt_state, loss = step(params, state, opt_state, xs, ys, jax.random.key(10 + i))
        losses.append(float(multihost_utils.process_allgather(loss, tiled=True)))

    where = sharded_checkpoint.save(os.path.join(out_dir, "multiprocess_checkpoint"), {"params": params})
    target, _ = abstract_init(model)
    restored = sharded_checkpoint.restore(where, {"params": target})["params"]
    same = all(bool(np.array_equal(a, b)) for a, b in zip(
        multihost_utils.process_allgather(jax.tree.leaves(params), tiled=True),
        multihost_utils.process_allgather(jax.tree.leaves(restored), tiled=True)))

    # The single-file CheckpointManager cannot hold arrays no process has whole: it says
    # so, and names the tool that can.
    try:
        mg.train.CheckpointManager(os.path.join(out_dir, f"single_{process_id}")).save(
            mg.train.TrainState(jax.numpy.zeros((), "int32"), params, state, opt_state,
                                jax.random.key_data(jax.random.key(0))))
        refused = ""
    except mg.SerializationError as e:
        refused = str(e)

    gathered = multihost_utils.process_allgather(params, tiled=True)
    if process_id == 0:
        arrays = {"losses": np.asarray(losses), "checkpoint_equal": np.asarray(same),
                  "single_file_refused": np.asarray(refused)}
        arrays.update(cases.flatten("params", gathered))
        np.savez(os.path.join(out_dir, "multiprocess.npz"), **arrays)
    multihost_utils.sync_global_devices("done")
    jax.distributed.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
