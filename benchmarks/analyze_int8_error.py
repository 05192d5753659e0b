"""Where ``int8``'s error on GPT-2 small comes from (``mg.models.gpt2()``, random
weights from ``init(jax.random.key(0))``, 4 random prompts of 32 tokens; relative
error ``||logits_q - logits_f32|| / ||logits_f32||`` and next-token agreement):

  parts      ``mg.quantize(g, scheme, targets=...)`` on one kind of layer at a time
  layers     the relative error of the residual stream after each block (captured with
             ``capture=`` on the float and the int8 model)
  simulated  the float model with fake-quantized weights (``round(w / s) * s``: per
             output channel, or per group of G inputs; or float weights) and
             activations (``intervene=`` on the outputs feeding the quantized layers:
             symmetric per token, its range clipped to a share of ``max |x|``, or
             asymmetric with a zero point; or one scale per group of G features of a
             token), to compare choices ``mg.quantize`` does not all offer

Run: ``PYTHONPATH=. nice .venv/bin/python benchmarks/analyze_int8_error.py``
(``--simulated``: the simulations alone).
"""

from __future__ import annotations

import _common  # noqa: F401  (sys.path, JAX_PLATFORMS)

import jax
import jax.numpy as jnp
import numpy as np

import mlaxgraph as mg

H = [f"h.{i}" for i in range(12)]


def main(simulated_only: bool = False) -> None:
    g = mg.models.gpt2()
    model = mg.compile(g)
    params, state = model.init(jax.random.key(0))
    prompts = jax.random.randint(jax.random.key(1), (4, 32), 0, 50257)
    ref = model.apply(params, state, prompts, inference_mode=True)[0]

    def report(name, logits):
        err = float(jnp.linalg.norm(logits - ref) / jnp.linalg.norm(ref))
        agree = float(jnp.mean(logits.argmax(-1) == ref.argmax(-1)))
        print(f"  {name:44s} {err:.4f}  {agree:.3f}", flush=True)

    if simulated_only:
        return _simulated(model, params, state, prompts, report)
    print("parts (scheme on one kind of layer):   rel err  agree")
    parts = {"all": None, "wte (lookup and tied head)": ["wte"], "wpe": ["wpe"],
             "attention": [f"{h}/attn" for h in H], "mlp.c_fc": [f"{h}/mlp.c_fc" for h in H],
             "mlp.c_proj": [f"{h}/mlp.c_proj" for h in H]}
    for scheme in ("int8", "int8_weight_only"):
        for name, targets in parts.items():
            qg = mg.quantize(g, scheme, targets=targets)
            qp, qs = mg.quantize_weights(qg, params, state)
            report(f"{scheme}: {name}", mg.compile(qg).apply(qp, qs, prompts,
                                                            inference_mode=True)[0])

    print("layers (int8, residual stream after each block): rel err")
    qg = mg.quantize(g, "int8")
    qp, qs = mg.quantize_weights(qg, params, state)
    names = ["add"] + [f"{h}/add_1" for h in H] + ["ln_f"]
    _, _, cf = model.apply(params, state, prompts, inference_mode=True, capture=names)
    _, _, cq = mg.compile(qg).apply(qp, qs, prompts, inference_mode=True, capture=names)
    for n in names:
        print(f"  {n:10s} {float(jnp.linalg.norm(cq[n] - cf[n]) / jnp.linalg.norm(cf[n])):.4f}")

    _simulated(model, params, state, prompts, report)


def _simulated(model, params, state, prompts, report) -> None:
    print("simulated (fake quantization in the float model):   rel err  agree")
    ln1, ln2 = [f"{h}/ln_1" for h in H], [f"{h}/ln_2" for h in H]
    act = [f"{h}/mlp.act" for h in H]
    cases = [("weights per channel", None, {}),
             ("weights per group of 128", 128, {}),
             ("weights per group of 64", 64, {}),
             ("weights per group of 32", 32, {}),
             ("per channel, inputs symmetric", None, {"sym": ln1 + ln2 + act + ["ln_f"]}),
             ("per channel, GELU output asymmetric", None,
              {"sym": ln1 + ln2 + ["ln_f"], "asym": act}),
             ("per channel, every input asymmetric", None, {"asym": ln1 + ln2 + act + ["ln_f"]}),
             ("wte float, GELU output asymmetric", "skip wte",
              {"sym": ln1 + ln2, "asym": act}),
             ("weights float, inputs as int8 quantizes them", "float",
              {"sym": ln1 + ln2 + ["ln_f"], "asym": act}),
             ("weights float, inputs clipped at 0.95 max|x|", "float",
              {"sym095": ln1 + ln2 + ["ln_f"], "asym": act}),
             ("weights float, inputs clipped at 0.9 max|x|", "float",
              {"sym09": ln1 + ln2 + ["ln_f"], "asym": act}),
             # finer scales than int8's layout: a scale per group of G inputs, for the
             # weights (per output channel) and the activations (per token)
             ("weights per channel, inputs per group of 128", None, {"groups": 128}),
             ("weights and inputs per group of 128", 128, {"groups": 128}),
             ("weights float, inputs per group of 128", "float", {"groups": 128}),
             ("weights and inputs per group of 64", 64, {"groups": 64}),
             ("weights float, inputs per group of 64", "float", {"groups": 64})]
    for name, group, acts in cases:
        fake = params if group == "float" else _fake_weights(
            params, None if group == "skip wte" else group,
            skip=("wte",) if group == "skip wte" else ())
        intervene = {n: _symmetric for n in acts.get("sym", ())}
        intervene.update({n: _clipped for n in acts.get("sym09", ())})
        intervene.update({n: _clipped_095 for n in acts.get("sym095", ())})
        intervene.update({n: _asymmetric for n in acts.get("asym", ())})
        if "groups" in acts:  # the LayerNorms' outputs symmetric, the GELU's with a zero point
            size = acts["groups"]
            intervene.update({n: _grouped(_symmetric, size) for n in ln1 + ln2 + ["ln_f"]})
            intervene.update({n: _grouped(_asymmetric, size) for n in act})
        report(name, model.apply(fake, state, prompts, inference_mode=True,
                                 intervene=intervene)[0])


def _fake_matrix(m, group):
    """``m`` (in, out) rounded to int8 by absmax per column or per group of rows."""
    size = m.shape[0] if group is None else group
    grouped = m.reshape(m.shape[0] // size, size, -1)
    s = np.abs(grouped).max(1, keepdims=True) / 127
    return (np.round(grouped / s) * s).reshape(m.shape)


def _fake_weights(params, group, skip=()):
    out = {}
    for key, layer in jax.tree.map(np.asarray, params).items():
        layer = dict(layer)
        if key in ("wte", "wpe") and key not in skip:
            layer["embedding"] = _fake_matrix(layer["embedding"].T, group).T
        elif key.startswith("h."):
            for name in ("mlp.c_fc", "mlp.c_proj"):
                layer[name] = dict(layer[name], kernel=_fake_matrix(layer[name]["kernel"], group))
            attn = {}
            for name, p in layer["attn"].items():
                w = p["kernel"]
                m = w.reshape(w.shape[0], -1) if name != "out" else w.reshape(-1, w.shape[-1])
                attn[name] = dict(p, kernel=_fake_matrix(m, group).reshape(w.shape))
            layer["attn"] = attn
        out[key] = layer
    return out


def _symmetric(x):
    s = jnp.max(jnp.abs(x), -1, keepdims=True) / 127
    return jnp.round(x / s) * s


def _clipped(x, ratio=0.9):
    """Symmetric per token with the range clipped to ``ratio`` of ``max |x|``."""
    s = ratio * jnp.max(jnp.abs(x), -1, keepdims=True) / 127
    return jnp.clip(jnp.round(x / s), -127, 127) * s


def _clipped_095(x):
    return _clipped(x, 0.95)


def _asymmetric(x):
    low = jnp.minimum(jnp.min(x, -1, keepdims=True), 0)
    high = jnp.maximum(jnp.max(x, -1, keepdims=True), 0)
    s = (high - low) / 255
    z = jnp.round(-low / s) - 128
    return (jnp.clip(jnp.round(x / s) + z, -128, 127) - z) * s


def _grouped(quantize, size):
    """``quantize`` applied to each group of ``size`` features of a token."""
    def fn(x):
        groups = x.reshape(x.shape[:-1] + (x.shape[-1] // size, size))
        return quantize(groups).reshape(x.shape)
    return fn


if __name__ == "__main__":
    import sys

    main(simulated_only="--simulated" in sys.argv[1:])
