"""What is above the weights in the scanned LoRA train step's memory: the buffers of
a frozen kernel's size inside the scan's loop bodies, and whether a formulation of the
frozen product removes them.

1. GPT-2 small, ``scan_blocks=True`` (and, for its peak only, ``False``),
   ``mg.lora(g, "h.*/attn/qkv", rank=8, alpha=16)``, the ``Trainer`` step of
   ``bench_lora.py`` (batch 1 x 64 tokens): XLA's
   ``memory_analysis`` and, in the optimized HLO, every instruction that writes a
   buffer of one of a block's kernel shapes (not a bitcast or parameter), by loop
   (forward ``jvp``, backward ``transpose(jvp)``) and kind.
2. A stack of 12 frozen MLP blocks (768 -> 3072 -> 768) on ``lax.scan`` with a rank-8
   adapter on the first product, 64 tokens, the adapters' gradient: temporaries of
   the plain product, ``stop_gradient`` on the frozen kernels, a ``custom_vjp`` whose
   backward contracts the kernel's output dim directly (``dot_general(w, g)`` and a
   transpose of the small result), and the scan unrolled; each variant's gradients
   are checked equal to the plain one's.
3. Whether the two kernels' slices are live at once, and whether ordering them lets
   one die before the next is made: the temporaries with neither frozen product,
   with one, with the other, with both; then both products ordered after their input
   by ``lax.optimization_barrier`` (``(h, k1)`` and ``(u, k2)`` through one barrier
   each), the stacked kernels indexed inside the body after a barrier on ``(h,
   index)``, and a ``custom_vjp`` product that slices the closed-over stack itself
   after a barrier, forward and backward (its residual the loop-invariant stack).

4. The frozen products as a ``lax.switch`` over the blocks (branch ``k`` multiplies by
   block ``k``'s kernel) under a ``custom_vjp`` whose residuals are the product's input
   and the loop-invariant weights (its backward switches again for the input's
   cotangent): with the kernels a static slice of the stack in each branch, and with
   the kernels stored per block (12 arrays, no stack). Temporaries, compile CPU time
   and step time against the plain scan, gradients checked equal. Then GPT-2's LoRA
   step with ``remat="full"``: its peak and the kernel-shaped buffers left.

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/analyze_lora_memory.py
[--ordering | --switch]`` (``--ordering``: part 3 alone; ``--switch``: part 4 alone).
"""

from __future__ import annotations

import re
import time
from collections import Counter

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import mlaxgraph as mg

KERNELS = ("768,2304", "2304,768", "768,768", "768,12,64", "12,64,768", "768,3072", "3072,768")


def _lora_step(scan: bool, remat: str | None = None):
    g = mg.models.gpt2()
    model = mg.compile(mg.lora(g, "h.*/attn/qkv", rank=8, alpha=16), scan_blocks=scan, remat=remat)
    trainer = mg.train.Trainer(model, optax.adamw(1e-4), loss="softmax_cross_entropy",
                               trainable="**/*.lora_*")
    ts = trainer.init(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (1, 64), 0, 50257)
    compiled = trainer.train_step.lower(ts, ids, ids).compile()
    m = compiled.memory_analysis()
    weights = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(ts.params))
    peak = (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes)
    print(f"GPT-2 LoRA step, scan_blocks={scan}, remat={remat}: arguments {m.argument_size_in_bytes / 1e6:.1f} "
          f"MB, temporaries {m.temp_size_in_bytes / 1e6:.1f} MB, peak / weights "
          f"{peak / weights:.3f}")
    return compiled


def gpt2_loop_buffers(remat: str | None = None) -> None:
    if remat is None:
        _lora_step(False)
    compiled = _lora_step(True, remat)
    shapes = "|".join(re.escape(k) for k in KERNELS)
    pattern = re.compile(rf"^\s*%(\S+) = f32\[({shapes})\]\{{[0-9,]+\}} (\w[\w-]*)\(.*op_name=\"([^\"]+)\"")
    found: Counter = Counter()
    inside_fusion = False
    for line in compiled.as_text().splitlines():
        if line and not line[0].isspace():  # a computation's header
            inside_fusion = "computation" in line.split(" ", 1)[0]
        hit = pattern.match(line)
        if inside_fusion or not hit or hit.group(3) in ("bitcast", "parameter",
                                                         "get-tuple-element"):
            continue
        loop = "backward" if "transpose(jvp" in hit.group(4) else "forward"
        found[(loop, hit.group(1).rsplit(".", 1)[0] if hit.group(1)[-1].isdigit() else hit.group(1),
               hit.group(2))] += 1
    total = 0
    for (loop, kind, shape), n in sorted(found.items()):
        size = n * 4
        for d in shape.split(","):
            size *= int(d)
        total += size
        print(f"  {loop:8s} {kind:32s} f32[{shape}] x{n}: {size / 1e6:.1f} MB")
    print(f"  (all of them: {total / 1e6:.1f} MB; the forward and backward loops' are not "
          f"live at once)")


def toy() -> None:
    blocks, d, f, t = 12, 768, 3072, 64
    key = jax.random.key(0)
    w1 = jax.random.normal(key, (blocks, d, f)) * 0.02
    w2 = jax.random.normal(jax.random.key(1), (blocks, f, d)) * 0.02
    a = jax.random.normal(jax.random.key(2), (blocks, d, 8)) * 0.02
    b = jax.random.normal(jax.random.key(3), (blocks, 8, f)) * 0.02
    x = jax.random.normal(jax.random.key(4), (t, d))

    @jax.custom_vjp
    def frozen(v, w):
        return v @ w

    def frozen_fwd(v, w):
        return v @ w, w

    def frozen_bwd(w, g):  # dx = g @ w.T as (w . g^T)^T: contract w's output dim
        dxt = lax.dot_general(w, g, (((1,), (g.ndim - 1,)), ((), ())))
        return jnp.moveaxis(dxt, 0, -1), jnp.zeros_like(w)

    frozen.defvjp(frozen_fwd, frozen_bwd)
    products = {"plain": lambda v, w: v @ w,
                "stop_gradient": lambda v, w: v @ lax.stop_gradient(w),
                "custom_vjp": frozen}

    def grad_of(product, unroll):
        def loss(adapters, weights, v):
            def body(h, p):
                (k1, k2), (la, lb) = p
                u = jax.nn.gelu(product(h, k1) + (h @ la) @ lb)
                return h + product(u, k2), None
            h, _ = lax.scan(body, v, (weights, adapters), unroll=unroll)
            return jnp.sum(h ** 2)
        return jax.jit(jax.grad(loss))

    ref = None
    for unroll in (1, blocks):
        for name, product in products.items():
            fn = grad_of(product, unroll)
            temp = fn.lower((a, b), (w1, w2), x).compile().memory_analysis().temp_size_in_bytes
            grads = fn((a, b), (w1, w2), x)
            ref = grads if ref is None else ref
            same = all(bool(jnp.allclose(p, q, rtol=1e-5, atol=1e-7))
                       for p, q in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)))
            print(f"toy, {name:13s} unroll={unroll:2d}: temporaries {temp / 1e6:6.1f} MB "
                  f"(one block's two kernels: {2 * d * f * 4 / 1e6:.1f} MB); gradients equal "
                  f"the plain scan's: {same}")


def _toy_arrays():
    """12 frozen MLP blocks' stacked kernels (768 -> 3072 -> 768), a rank-8 adapter's
    stacked A and B, 64 tokens."""
    blocks, d, f, t = 12, 768, 3072, 64
    w1 = jax.random.normal(jax.random.key(0), (blocks, d, f)) * 0.02
    w2 = jax.random.normal(jax.random.key(1), (blocks, f, d)) * 0.02
    a = jax.random.normal(jax.random.key(2), (blocks, d, 8)) * 0.02
    b = jax.random.normal(jax.random.key(3), (blocks, 8, f)) * 0.02
    x = jax.random.normal(jax.random.key(4), (t, d))
    return blocks, d, w1, w2, a, b, x


def ordering() -> None:
    blocks, d, w1, w2, a, b, x = _toy_arrays()
    barrier = lax.optimization_barrier

    def temporaries(loss):
        fn = jax.jit(jax.grad(loss))
        return fn.lower((a, b), (w1, w2), x).compile().memory_analysis().temp_size_in_bytes, \
            fn((a, b), (w1, w2), x)

    def uses(first, second):
        def loss(adapters, weights, v):
            def body(h, p):
                (k1, k2), (la, lb) = p
                z = (h @ k1 if first else 0) + (h @ la) @ lb
                u = jax.nn.gelu(z)
                return h + (u @ k2 if second else u[:, :d] * 0.1), None
            return jnp.sum(lax.scan(body, v, (weights, adapters))[0] ** 2)
        return loss

    for first, second in ((False, False), (True, False), (False, True)):
        temp, _ = temporaries(uses(first, second))
        print(f"ordering, frozen products: first {first!s:5s} second {second!s:5s}: "
              f"temporaries {temp / 1e6:6.1f} MB")

    def ordered(adapters, weights, v):
        def body(h, p):
            (k1, k2), (la, lb) = p
            h, k1 = barrier((h, k1))
            u = jax.nn.gelu(h @ k1 + (h @ la) @ lb)
            u, k2 = barrier((u, k2))
            return h + u @ k2, None
        return jnp.sum(lax.scan(body, v, (weights, adapters))[0] ** 2)

    def indexed(adapters, weights, v):
        def body(h, p):
            (la, lb), i = p
            h, j = barrier((h, i))
            u = jax.nn.gelu(h @ lax.dynamic_index_in_dim(weights[0], j, keepdims=False)
                            + (h @ la) @ lb)
            u, j = barrier((u, i))
            return h + u @ lax.dynamic_index_in_dim(weights[1], j, keepdims=False), None
        return jnp.sum(lax.scan(body, v, (adapters, jnp.arange(blocks)))[0] ** 2)

    @jax.custom_vjp
    def sliced(h, stack, i):
        h, j = barrier((h, i))
        return h @ lax.dynamic_index_in_dim(stack, j, keepdims=False)

    def sliced_fwd(h, stack, i):
        return sliced(h, stack, i), (stack, i)

    def sliced_bwd(res, g):
        stack, i = res
        g, j = barrier((g, i))
        k = lax.dynamic_index_in_dim(stack, j, keepdims=False)
        return g @ k.T, jnp.zeros_like(stack), np.zeros(i.shape, jax.dtypes.float0)

    sliced.defvjp(sliced_fwd, sliced_bwd)

    def custom(adapters, weights, v):
        def body(h, p):
            (la, lb), i = p
            u = jax.nn.gelu(sliced(h, weights[0], i) + (h @ la) @ lb)
            return h + sliced(u, weights[1], i), None
        return jnp.sum(lax.scan(body, v, (adapters, jnp.arange(blocks)))[0] ** 2)

    ref = None
    for name, loss in (("both, as the layers do", uses(True, True)),
                       ("barrier on (h, k1), (u, k2)", ordered),
                       ("stack indexed after a barrier", indexed),
                       ("custom_vjp slicing after a barrier", custom)):
        temp, grads = temporaries(loss)
        ref = grads if ref is None else ref
        same = all(bool(jnp.allclose(p, q, rtol=1e-5, atol=1e-7))
                   for p, q in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)))
        print(f"ordering, {name:36s}: temporaries {temp / 1e6:6.1f} MB; gradients equal: {same}")


def switched() -> None:
    blocks, _, w1, w2, a, b, x = _toy_arrays()
    per_block = (tuple(w1[i] for i in range(blocks)), tuple(w2[i] for i in range(blocks)))

    @jax.custom_vjp
    def product(v, i, kernels):  # kernels: the stack, or a tuple of one array per block
        return lax.switch(i, [lambda v, w, k=k: v @ w[k] for k in range(blocks)], v, kernels)

    def product_fwd(v, i, kernels):
        return product(v, i, kernels), (i, kernels)

    def product_bwd(res, g):  # the input's cotangent only: the kernels are frozen
        i, kernels = res
        dv = lax.switch(i, [lambda g, w, k=k: g @ w[k].T for k in range(blocks)], g, kernels)
        return dv, None, None

    product.defvjp(product_fwd, product_bwd)

    def plain(adapters, weights, v):
        def body(h, p):
            (k1, k2), (la, lb) = p
            u = jax.nn.gelu(h @ k1 + (h @ la) @ lb)
            return h + u @ k2, None
        return jnp.sum(lax.scan(body, v, (weights, adapters))[0] ** 2)

    def switch(adapters, weights, v):
        def body(h, p):
            (la, lb), i = p
            u = jax.nn.gelu(product(h, i, weights[0]) + (h @ la) @ lb)
            return h + product(u, i, weights[1]), None
        return jnp.sum(lax.scan(body, v, (adapters, jnp.arange(blocks)))[0] ** 2)

    ref = base = None
    for name, loss, weights in (("plain scan (the layers' form)", plain, (w1, w2)),
                                ("switch, static slices of the stack", switch, (w1, w2)),
                                ("switch, kernels stored per block", switch, per_block)):
        fn = jax.jit(jax.grad(loss))
        start = time.process_time()
        compiled = fn.lower((a, b), weights, x).compile()
        compile_s = time.process_time() - start
        temp = compiled.memory_analysis().temp_size_in_bytes
        grads = compiled((a, b), weights, x)
        times = []
        for _ in range(7):
            start = time.perf_counter()
            jax.block_until_ready(compiled((a, b), weights, x))
            times.append(time.perf_counter() - start)
        step = float(np.median(times))
        ref = grads if ref is None else ref
        base = (compile_s, step) if base is None else base
        same = all(bool(jnp.allclose(p, q, rtol=1e-5, atol=1e-7))
                   for p, q in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)))
        print(f"switch, {name:36s}: temporaries {temp / 1e6:6.1f} MB, compile "
              f"{compile_s:.2f} s (x{compile_s / base[0]:.2f}), step {step * 1e3:.0f} ms "
              f"(x{step / base[1]:.2f}); gradients equal: {same}")
    gpt2_loop_buffers(remat="full")


if __name__ == "__main__":
    import sys
    if "--switch" in sys.argv[1:]:
        switched()
    else:
        if "--ordering" not in sys.argv[1:]:
            gpt2_loop_buffers()
            toy()
        ordering()
