"""The zoo's Transformers under ``mg.models.sharding_rules`` (Megatron's layout) on 8
virtual CPU devices: train step time on meshes 2x4 and 1x8 against the same model on
one device, measured in the same run (interleaved rounds), and the collectives of the
forward pass and of the train step.

    .venv/bin/python benchmarks/bench_zoo_sharding.py [--rounds N]

The 8 devices are XLA's host platform split in 8 (``--xla_force_host_platform_device_count``)
on the machine's CPU cores: the collectives are real, the parallelism is not (8
devices share 2 cores), so the ratios measure what partitioning costs here, not a
speed-up.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import _common  # noqa: E402  (sys.path, JAX_PLATFORMS)

CONFIGS = {
    "gpt2": dict(vocab_size=2048, n_positions=128, n_embd=256, n_layer=4, n_head=8,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2),
}
MESHES = {"one device": None, "2x4": (2, 4), "1x8": (1, 8)}
BATCH, SEQ = 8, 128


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import mlaxgraph as mg
    from mlaxgraph.analysis.hlo.collectives import collectives

    assert jax.device_count() == 8, jax.device_count()
    ids = np.random.default_rng(0).integers(0, 2048, size=(BATCH, SEQ + 1)).astype(np.int32)
    print(f"jax {jax.__version__}, {jax.device_count()} devices, batch {BATCH}, seq {SEQ}, "
          f"{args.rounds} interleaved rounds")
    for family, config in CONFIGS.items():
        graph = getattr(mg.models, family)(config)
        steps, info = {}, {}
        for name, shape in MESHES.items():
            if shape is None:
                model, rules = mg.compile(graph), None
            else:
                mesh = jax.make_mesh(shape, ("data", "model"))
                rules = mg.models.sharding_rules(graph, mesh)
                model = mg.compile(graph, mesh=mesh, rules=rules)
            optimizer = optax.sgd(1e-3)
            params, state = model.init(jax.random.key(0))
            opt_state = optimizer.init(params)

            def objective(params, state, ids, model=model):
                logits, _ = model.apply_fn(params, state, ids[:, :-1], inference_mode=True)
                return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]))

            @jax.jit
            def step(params, opt_state, ids, objective=objective, optimizer=optimizer, state=state):
                loss, grads = jax.value_and_grad(objective)(params, state, ids)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state, loss

            t0 = time.perf_counter()
            params, opt_state, loss = step(params, opt_state, ids)
            loss.block_until_ready()
            first = time.perf_counter() - t0
            steps[name] = [step, params, opt_state, []]
            if shape is not None:
                forward = collectives(model, batch=BATCH, seq=SEQ, inference_mode=True)
                train = collectives(step.lower(params, opt_state, ids).compile().as_text())
                count = lambda found: ", ".join(f"{sum(c.kind == k for c in found)} {k}"  # noqa: E731
                                                for k in sorted({c.kind for c in found})) or "none"
                info[name] = (rules, count(forward), count(train), first)
            else:
                info[name] = (None, "-", "-", first)
        for _ in range(args.rounds):
            for name, entry in steps.items():
                step, params, opt_state, times = entry
                t0 = time.perf_counter()
                params, opt_state, loss = step(params, opt_state, ids)
                loss.block_until_ready()
                times.append(time.perf_counter() - t0)
                entry[1], entry[2] = params, opt_state
        base = steps["one device"][3]
        print(f"\n{family}: {config}")
        print("| mesh | rules | train step, median ms (IQR) | / one device (median of per-round ratios, 95% CI) "
              "| collectives, forward | collectives, train step | first call s |")
        print("|---|---|---|---|---|---|---|")
        for name, (_, _, _, times) in steps.items():
            rules, fwd, train, first = info[name]
            q1, q3 = _common.quantiles(times)
            ratios = [t / b for t, b in zip(times, base)]
            lo, hi = _common.bootstrap_median_ci(ratios)
            ratio = "1" if name == "one device" else f"{_common.median(ratios):.2f} ({lo:.2f} – {hi:.2f})"
            print(f"| {name} | {rules or '-'} | {1e3 * _common.median(times):.1f} ({1e3 * q1:.1f} – {1e3 * q3:.1f}) "
                  f"| {ratio} | {fwd} | {train} | {first:.1f} |")


if __name__ == "__main__":
    main()
