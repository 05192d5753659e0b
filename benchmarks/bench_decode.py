"""Decoding with the cache the compiler derives (``mg.decoder``, ``mg.generate``),
against a hand-written JAX KV-cache decoder of the same model, timed.

The model: GPT-2 small (``mg.models.gpt2()``: 12 layers, n_embd 768, 12 heads, vocab
50257), random weights from ``model.init``, float32, inference. The hand-written
decoder (``HandGPT2`` below) reads the same params dict and keeps the same cache
layout: per layer ``key`` and ``value`` of ``(batch, max_length, heads, head_dim)``,
written with ``lax.dynamic_update_slice`` at the cache index, attention over all
``max_length`` slots masked by slot (``slot <= index`` and the slot filled), positions
from the mask; its step is ``jax.jit`` with the cache donated, as ``dec.step``'s.

Measured:

  step         per-token time of one decode step (batch 1 and 8, 512-slot cache, a
               64-token prompt prefilled): ``dec.step`` vs the hand-written step, each
               step's greedy token (argmax on the device) fed to the next; ``calls``
               steps per round, rounds interleaved in a random order; the ratio per
               round, its median and a bootstrap 95% CI. Goal <= 1.05.
  generate     a whole ``mg.generate`` of 128 new tokens (16-token prompt, greedy,
               batch 1 and 8) vs the hand-written loop (prefill, then
               ``lax.while_loop`` over the step, one jitted function); goal <= 1.1.
  recompiles   ``dec.compile_count`` across 10 ``generate`` calls with prompt lengths
               5 to 60 (one bucket) after a first call; goal 0.
  cache        the cache's bytes (``dec.cache_bytes``, the arrays' ``nbytes``) vs its
               physical size ``2 x layers x batch x max_length x kv_heads x head_dim x
               4``, and XLA's memory analysis of the compiled step (the cache donated:
               the output aliases it, no copy); goal <= physical + 1%.

Run alone: ``.venv/bin/python benchmarks/bench_decode.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import time

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)
from _common import bootstrap_median_ci, fmt_time, md_table, median

import jax
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg

MAX_LENGTH = 512


# --- the hand-written decoder -----------------------------------------------------------


def _layer_norm(x, p, eps=1e-5):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x):
    return jax.nn.gelu(x, approximate=True)


class HandGPT2:
    """GPT-2 prefill and step over a key/value cache, written by hand in JAX."""

    def __init__(self, n_layer: int, n_head: int, max_length: int):
        self.n_layer, self.n_head, self.max_length = n_layer, n_head, max_length

    def empty(self, params, batch):
        d = params["wte"]["embedding"].shape[1]
        shape = (batch, self.max_length, self.n_head, d // self.n_head)
        layers = [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(self.n_layer)]
        return layers, jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32), jnp.zeros(
            (batch, self.max_length), bool)

    def _forward(self, params, cache, ids, positions, index, mask):
        layers = cache
        x = params["wte"]["embedding"][ids] + params["wpe"]["embedding"][positions]
        seq = ids.shape[1]
        slots = jnp.arange(self.max_length)
        allowed = (slots[None, :] <= index + jnp.arange(seq)[:, None])[None, None] & mask[:, None, None, :]
        new = []
        for i, (ck, cv) in enumerate(layers):
            b = params[f"h.{i}"]
            a = b["attn"]
            h = _layer_norm(x, b["ln_1"])
            q = jnp.einsum("bld,dhk->blhk", h, a["query"]["kernel"]) + a["query"]["bias"]
            k = jnp.einsum("bld,dhk->blhk", h, a["key"]["kernel"]) + a["key"]["bias"]
            v = jnp.einsum("bld,dhk->blhk", h, a["value"]["kernel"]) + a["value"]["bias"]
            ck = jax.lax.dynamic_update_slice(ck, k, (0, index, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, v, (0, index, 0, 0))
            new.append((ck, cv))
            q = q / math.sqrt(q.shape[-1])
            scores = jnp.einsum("bqhk,bshk->bhqs", q, ck)
            scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
            w = jax.nn.softmax(scores, axis=-1)
            att = jnp.einsum("bhqs,bshk->bqhk", w, cv)
            x = x + jnp.einsum("bqhk,hko->bqo", att, a["out"]["kernel"]) + a["out"]["bias"]
            h = _layer_norm(x, b["ln_2"])
            m = _gelu(h @ b["mlp.c_fc"]["kernel"] + b["mlp.c_fc"]["bias"])
            x = x + m @ b["mlp.c_proj"]["kernel"] + b["mlp.c_proj"]["bias"]
        x = _layer_norm(x, params["ln_f"])
        return jnp.einsum("bld,vd->blv", x, params["wte"]["embedding"]), new

    def prefill(self, params, cache, ids, attention_mask):
        layers, _, _, mask = cache
        attention_mask = attention_mask.astype(bool)
        positions = jnp.where(attention_mask, jnp.cumsum(attention_mask, 1) - 1, 1)
        mask = jax.lax.dynamic_update_slice(mask, attention_mask, (0, 0))
        logits, layers = self._forward(params, layers, ids, positions, jnp.zeros((), jnp.int32), mask)
        return logits, (layers, jnp.asarray(ids.shape[1], jnp.int32),
                        jnp.sum(attention_mask, 1, dtype=jnp.int32), mask)

    def step(self, params, cache, token):
        layers, index, positions, mask = cache
        mask = jax.lax.dynamic_update_slice(mask, jnp.ones((mask.shape[0], 1), bool), (0, index))
        logits, layers = self._forward(params, layers, token[:, None], positions[:, None], index, mask)
        return logits, (layers, index + 1, positions + 1, mask)

    def generate(self, params, ids, new):
        """Greedy: prefill, then a while_loop of steps; ``new`` tokens (static)."""
        batch = ids.shape[0]
        logits, cache = self.prefill(params, self.empty(params, batch), ids, jnp.ones(ids.shape, bool))
        token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
        out = jnp.zeros((batch, new), jnp.int32).at[:, 0].set(token)

        def body(carry):
            i, token, cache, out = carry
            logits, cache = self.step(params, cache, token)
            token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
            return i + 1, token, cache, jax.lax.dynamic_update_slice(out, token[:, None], (0, i))

        out = jax.lax.while_loop(lambda c: c[0] < new, body, (jnp.asarray(1), token, cache, out))[-1]
        return jnp.concatenate([ids, out], 1)


# --- timing ------------------------------------------------------------------------------


def interleaved(variants: dict, rounds: int, seed: int = 0) -> dict:
    """Seconds per round of each variant (``fn()`` runs the round and waits), the
    variants in a random order in each round, GC off."""
    times: dict = {k: [] for k in variants}
    order = list(variants)
    rng = random.Random(seed)
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return times


def ratio_row(label, times, per, unit_count):
    mg_t, hand_t = times["mlaxgraph"], times["hand"]
    ratios = [a / b for a, b in zip(mg_t, hand_t)]
    lo, hi = bootstrap_median_ci(ratios)
    return [label, fmt_time(median(mg_t) / unit_count), fmt_time(median(hand_t) / unit_count),
            f"{median(ratios):.3f} ({lo:.3f} – {hi:.3f})", per]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    steps = 8 if args.quick else 32
    print(f"jax {jax.__version__}, devices {jax.devices()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    g = mg.models.gpt2()
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    hand = HandGPT2(12, 12, MAX_LENGTH)
    dec = mg.decoder(model, max_length=MAX_LENGTH)
    hand_prefill = jax.jit(hand.prefill, donate_argnums=(1,))
    hand_step = jax.jit(hand.step, donate_argnums=(1,))
    rows = []
    checks = []
    for batch in (1, 8):
        ids = jax.random.randint(jax.random.key(1), (batch, 64), 0, 50257, jnp.int32)
        logits_mg, cache_mg = dec.prefill(params, state, ids, room=MAX_LENGTH - 64)
        logits_h, cache_h = hand_prefill(params, hand.empty(params, batch), ids, jnp.ones(ids.shape, bool))
        checks.append(float(jnp.max(jnp.abs(logits_mg - logits_h))))
        box = {"mg": (cache_mg, jnp.argmax(logits_mg[:, -1], -1)),
               "hand": (cache_h, jnp.argmax(logits_h[:, -1], -1))}

        def run_mg():
            cache, token = box["mg"]
            if cache.filled + steps > MAX_LENGTH:  # start again from the prompt
                _, cache = dec.prefill(params, state, ids, room=MAX_LENGTH - 64)
            for _ in range(steps):
                logits, cache = dec.step(params, state, cache, token)
                token = jnp.argmax(logits[:, -1], -1)
            token.block_until_ready()
            box["mg"] = (cache, token)

        def run_hand():
            cache, token = box["hand"]
            if int(cache[1]) + steps > MAX_LENGTH:
                _, cache = hand_prefill(params, hand.empty(params, batch), ids, jnp.ones(ids.shape, bool))
            for _ in range(steps):
                logits, cache = hand_step(params, cache, token)
                token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
            token.block_until_ready()
            box["hand"] = (cache, token)

        run_mg(), run_hand()  # compile and warm
        times = interleaved({"mlaxgraph": run_mg, "hand": run_hand}, rounds)
        rows.append(ratio_row(f"step, batch {batch}", times, "per step", steps))
        rows[-1].insert(4, f"{batch * steps / median(times['mlaxgraph']):.1f} / "
                           f"{batch * steps / median(times['hand']):.1f}")

    # whole generate, 128 new tokens
    hand_generate = jax.jit(hand.generate, static_argnums=(2,))
    for batch in (1, 8):
        prompt = jax.random.randint(jax.random.key(2), (batch, 16), 0, 50257, jnp.int32)
        out_mg = mg.generate(dec, params, state, prompt, max_new_tokens=128)
        out_h = hand_generate(params, prompt, 128)
        same = bool(jnp.all(out_mg == out_h))
        checks.append(same)
        times = interleaved({
            "mlaxgraph": lambda: mg.generate(dec, params, state, prompt, max_new_tokens=128).block_until_ready(),
            "hand": lambda: hand_generate(params, prompt, 128).block_until_ready()},
            max(2, rounds // 3))
        rows.append(ratio_row(f"generate 128, batch {batch}", times, "per call", 1))
        rows[-1].insert(4, f"{batch * 128 / median(times['mlaxgraph']):.1f} / "
                           f"{batch * 128 / median(times['hand']):.1f}")

    print(md_table(["what", "mlaxgraph", "hand-written", "ratio (95% CI)", "tokens/s (mg / hand)",
                    "unit"], rows))
    print(f"prefill logits max |mg - hand| (batch 1, 8): {checks[0]:.2e}, {checks[1]:.2e}; "
          f"greedy tokens equal (batch 1, 8): {checks[2]}, {checks[3]}")

    # recompiles
    mg.generate(dec, params, state, jnp.ones((1, 5), jnp.int32), max_new_tokens=16)
    before = dec.compile_count
    lengths = [5 + round(i * 55 / 9) for i in range(10)]
    for length in lengths:
        mg.generate(dec, params, state, jnp.ones((1, length), jnp.int32), max_new_tokens=16)
    print(f"recompiles across 10 generate calls, prompt lengths {lengths}: "
          f"{dec.compile_count - before} (compile_count {before} -> {dec.compile_count})")

    # cache memory
    for batch in (1, 8):
        physical = 2 * 12 * batch * MAX_LENGTH * 12 * 64 * 4
        cache = dec.empty_cache(batch)
        step = jax.jit(dec.step_fn(batch), donate_argnums=(2,))
        analysis = step.lower(params, state, cache, jnp.zeros((batch, 1), jnp.int32)).compile().memory_analysis()
        print(f"batch {batch}: cache_bytes {dec.cache_bytes(batch):,}, arrays {cache.nbytes:,}, physical "
              f"{physical:,} (x{dec.cache_bytes(batch) / physical:.4f}); compiled step: arguments "
              f"{analysis.argument_size_in_bytes:,}, outputs {analysis.output_size_in_bytes:,}, aliased "
              f"{analysis.alias_size_in_bytes:,}, temporaries {analysis.temp_size_in_bytes:,}")


if __name__ == "__main__":
    main()
