"""The ResNet-style CNN's train step (hand-written, as mlaxgraph computes it) with its
OHWI convolution kernels stored in another physical layout: does XLA's compile get as
short as with HWIO kernels when the parameters keep api.md's OHWI shape?

Three forms of the same step, each compiled in the same rounds (process CPU time of
``lower`` + ``compile``, fresh arrays each round):

  ohwi    the kernels OHWI, row-major (mlaxgraph's)
  layout  the same OHWI arrays stored with the physical layout ``major_to_minor=(1, 2,
          3, 0)`` (HWIO in memory) by ``jax.experimental.layout.Format``, the train
          state's kernels and their optimizer moments in and out of the step
  hwio    the kernels HWIO (Flax's, Haiku's, Keras's)

and ``Layout.AUTO`` for the kernels (XLA chooses): what the CPU backend picks. The
optimized HLO's transposes, copies and fusions; the losses of the three are equal.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/analyze_conv_layout.py [ROUNDS]``.
"""

from __future__ import annotations

import sys
import time

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Format, Layout

import models_hand as H
import models_spec as S


def _build(form: str, tx, device):
    params, state = H.init("resnet", jax.random.key(0))
    if form == "hwio":
        params = H._hwio(params)
    ts = (params, state, tx.init(params))
    step = H.make_step_fn("resnet", tx, variant="conv_hwio" if form == "hwio" else None)
    if form != "layout":
        return jax.jit(step, donate_argnums=0), ts

    def fmt(a):
        order = (1, 2, 3, 0) if a.ndim == 4 else tuple(range(a.ndim))
        return Format(Layout(major_to_minor=order), device)

    formats = jax.tree.map(fmt, ts)
    ts = jax.tree.map(jax.device_put, ts, formats)
    return jax.jit(step, donate_argnums=0, in_shardings=(formats, None, None),
                   out_shardings=(formats, None)), ts


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    spec = S.SPECS["resnet"]
    x, y = (jnp.asarray(a) for a in S.batch(spec))
    tx = S.optimizer()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params, state = H.init("resnet", jax.random.key(0))
    auto = jax.tree.map(lambda a: Format(Layout.AUTO) if a.ndim == 4 else None, params)
    chosen = jax.jit(lambda p: jax.tree.map(lambda a: a * 2, p), in_shardings=(auto,)).lower(
        params).compile().input_formats[0][0]
    kernels = {fmt.layout.major_to_minor for fmt in jax.tree.leaves(chosen) if fmt is not None}
    print(f"Layout.AUTO for the 4-d kernels on {jax.default_backend()}: major_to_minor {sorted(kernels)}")
    times: dict[str, list[float]] = {f: [] for f in ("ohwi", "layout", "hwio")}
    losses = {}
    for r in range(rounds):
        for form in times:
            jitted, ts = _build(form, tx, device)
            start = time.process_time()
            compiled = jitted.lower(ts, x, y).compile()
            times[form].append(time.process_time() - start)
            if r == 0:
                text = compiled.as_text()
                print(f"{form:7s} HLO: transposes {text.count(' transpose(')}, copies "
                      f"{text.count(' copy(')}, fusions {text.count(' fusion(')}")
                losses[form] = float(compiled(ts, x, y)[1])
    base = np.array(times["ohwi"])
    for form, values in times.items():
        ratio = float(np.median(np.array(values) / base))
        print(f"{form:7s} lower + compile (CPU): median {np.median(values):.2f} s, / ohwi {ratio:.3f}")
    print(f"losses equal: {len(set(losses.values())) == 1} ({losses})")


if __name__ == "__main__":
    main()
