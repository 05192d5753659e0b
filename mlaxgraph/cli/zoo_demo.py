"""``mlaxgraph demo --model NAME``: a model of the zoo built (random weights, or a local
checkpoint), summarized, rendered, drawn in the explorer, costed per layer, one block's
HLO written, and run once."""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from .. import models
from ..compiler.compile import compile
from ..core.specs import bind_dims
from .commands import UsageError
from .demo import write_drawing

__all__ = ["MODELS", "run_model"]

#: Demo models: text models with their Hugging Face configs' defaults (GPT-2 small,
#: BERT base, ViT-B/16) except Llama, a small one (Llama 2 7B's 27 GB of float32 weights
#: do not suit a demo; --config gives a real one).
MODELS = ("resnet18", "resnet34", "resnet50", "gpt2", "bert", "vit", "llama", "qwen2", "unet")
SMALL_LLAMA = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
               "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4}
SMALL_QWEN2 = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
               "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
               "tie_word_embeddings": True}
HUGGING_FACE = ("gpt2", "bert", "vit", "llama", "qwen2")  # built from a config
TEXT = ("gpt2", "bert", "llama", "qwen2")  # with a sequence dim
SEQ = 128
IMAGE = 224  # height and width of the images of the models that take any size


def _config(args) -> Any:
    """The config: --config, else a config.json beside --weights, else the defaults."""
    path = args.config
    if path is None and args.weights:
        folder = args.weights if os.path.isdir(args.weights) else os.path.dirname(args.weights)
        candidate = os.path.join(folder, "config.json")
        path = candidate if os.path.exists(candidate) else None
    if path is not None:
        if args.model not in HUGGING_FACE:
            raise UsageError(f"--config is for the Hugging Face models; {args.model} takes none")
        return path  # the builder reads it (errors name the file and line)
    return {"llama": SMALL_LLAMA, "qwen2": SMALL_QWEN2}.get(args.model)


def build(args):
    builder = getattr(models, args.model)
    config = _config(args)
    return builder(config) if args.model in HUGGING_FACE else builder()


def _example(graph, dims: dict):
    """Inputs of the graph's specs at ``dims``: token ids 0 (a valid id of any
    vocabulary), an attention mask of ones, images from a normal distribution."""
    values = []
    for name, spec in zip(graph.inputs, graph.input_specs):
        shape = bind_dims(spec.shape, dims)
        if np.issubdtype(spec.dtype, np.integer):
            values.append((np.ones if name == "attention_mask" else np.zeros)(shape, spec.dtype))
        else:
            values.append(np.asarray(jax.random.normal(jax.random.key(0), shape), spec.dtype))
    return values


def _first_block(graph) -> str | None:
    return next((n.name for n in graph.nodes if n.op.subgraph() is not None), None)


def run_model(args) -> int:
    if args.weights and not os.path.exists(args.weights):  # before any work, as generate
        raise UsageError(f"--weights {args.weights}: no such file or folder")
    if args.config and not os.path.isfile(args.config):
        raise UsageError(f"--config {args.config}: no such file")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    graph = build(args)
    model = compile(graph)
    print(graph.summary())
    start = time.perf_counter()
    if args.weights:
        params, state = models.load_state_dict(graph, args.weights)
        print(f"\nweights: {args.weights} ({time.perf_counter() - start:.1f} s)")
    else:
        params, state = model.init(jax.random.key(args.seed))
        print(f"\nweights: random, from seed {args.seed} ({time.perf_counter() - start:.1f} s)")
    dims: dict[str, Any] = {"batch": 1}
    if args.model in TEXT:
        # At most the position table's rows (a checkpoint's n_positions may be fewer).
        limits = [node.op.limit for _, node in graph.walk()
                  if node.op.op_name == "arange" and getattr(node.op, "limit", None)]
        dims["seq"] = min([SEQ, *limits])
    names = {str(d) for spec in graph.input_specs for d in spec.shape}
    dims.update({name: IMAGE for name in ("height", "width") if name in names})
    at = ", ".join(f"{k} {v}" for k, v in dims.items())
    written = [write_drawing(graph, os.path.join(out, args.model))]
    written.append(("explorer page", model.to_html(os.path.join(out, f"{args.model}.html"))))
    table = model.cost_table(inference_mode=True, **dims)
    path = os.path.join(out, f"{args.model}.cost.txt")
    with open(path, "w") as f:
        f.write(str(table) + "\n")
    written.append((f"cost per layer ({at}, inference)", path))
    block = _first_block(graph)
    if block is not None:
        by_layer = model.hlo_by_layer(inference_mode=True, **dims)
        lines = [f"# {block}: XLA's optimized HLO operations of each of its layers ({at}, inference)"]
        for layer in (name for name in by_layer if name.startswith(block + "/")):
            lines.append(f"\n{layer}:")
            lines += [f"  {op}" for op in by_layer[layer]] or ["  (no operations)"]
        path = os.path.join(out, f"{args.model}.{block}.hlo.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        written.append((f"HLO of block {block}", path))
    example = _example(graph, dims)
    start = time.perf_counter()
    outputs, _ = model.apply(params, state, *example, inference_mode=True)
    outputs = jax.block_until_ready(outputs)
    shapes = ", ".join(str(o.shape) for o in jax.tree.leaves(outputs))
    print(f"\none forward pass at {at}: outputs {shapes} "
          f"({time.perf_counter() - start:.1f} s with compiling)")
    xla = f", XLA counts {table.xla_flops:,}" if table.xla_flops is not None else ""
    print(f"forward FLOPs: {table.flops:,} (formula {table.flops_formula}{xla}); "
          f"params {table.params:,}")
    print("\nwritten:")
    for what, path in written:
        print(f"  {what}: {path}")
    return 0
