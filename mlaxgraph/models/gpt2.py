"""GPT-2 (Hugging Face's ``GPT2LMHeadModel``): token ids -> next-token logits, with the
original's module names (``wte``, ``wpe``, ``h.0`` ... ``h.11``, ``ln_f``) and its
checkpoints' layout (``Conv1D`` weights stored ``(in, out)``; one fused ``c_attn``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import ops
from ..ir.graph import Graph, Input
from ..ops import initializers
from .common import ROW_PARALLEL, AxisOverrides, activation, dropout
from .config import Config, Family
from .torch_layout import TorchLayout, register_layout

__all__ = ["gpt2", "GPT2_DEFAULTS", "GPT2"]

#: GPT2Config's defaults: GPT-2 small (124M).
GPT2_DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
                 "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
                 "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
                 "layer_norm_epsilon": 1e-5, "initializer_range": 0.02}

GPT2 = Family(
    "gpt2", ("gpt2",), GPT2_DEFAULTS,
    checked={"add_cross_attention": (False,), "scale_attn_weights": (True,),
             "scale_attn_by_inverse_layer_idx": (False,), "tie_word_embeddings": (True,)},
    # n_ctx: the old name of n_positions; summary_*: GPT2DoubleHeadsModel's head;
    # reorder_and_upcast_attn: float32 scores, which the softmax here always has.
    harmless=frozenset({"n_ctx", "summary_type", "summary_use_proj", "summary_activation",
                        "summary_proj_to_labels", "summary_first_dropout",
                        "reorder_and_upcast_attn"}))

register_layout("gpt2", TorchLayout(
    linear="in_out", attention=(("qkv", "c_attn"), ("out", "c_proj")),
    prefixes=("transformer.",), tied=(("lm_head.weight", "wte.weight"),), model_prefix="transformer.",
    buffers=r"h\.\d+\.attn\.(bias|masked_bias)"))


def gpt2(config: Any = None, *, axes: Mapping[str, Mapping[str, Any]] | None = None) -> Graph:
    """GPT-2 from its Hugging Face config: ``input_ids (batch, seq)`` int32 ->
    ``logits (batch, seq, vocab_size)``, the head tied to ``wte`` (``wte.attend``).

    Pre-norm blocks ``h.{i}``: ``ln_1``, ``attn`` (causal multi-head attention, its
    weights ``c_attn`` and ``c_proj`` in files), ``ln_2``, ``mlp.c_fc``, ``mlp.act``
    (``activation_function``; ``"gelu_new"`` is the tanh GELU), ``mlp.c_proj``; dropout
    at ``resid_pdrop``, ``embd_pdrop`` and ``attn_pdrop`` in training. LayerNorm epsilon
    ``layer_norm_epsilon``. ``seq`` is symbolic, at most ``n_positions`` (more is a
    ``ShapeError`` when the length is known, at build or call time).

    Initialization as Hugging Face's: every weight normal with standard deviation
    ``initializer_range`` (0.02), the two ``c_proj`` kernels ``initializer_range /
    sqrt(2 * n_layer)``, biases 0, LayerNorm 1 and 0. Logical axes: the Megatron layout
    (``mlp.c_proj`` row-parallel: kernel ``("mlp", "embed")``); ``axes=`` overrides
    them per layer (``{"attn": {"key/kernel": ("embed", None, "kv")}}``).

    Args:
      config: the config's fields as a dict (``config.to_dict()``, a ``config.json``'s
        contents), the path of a ``config.json`` or of a checkpoint folder holding one;
        missing fields take GPT2Config's defaults (GPT-2 small). ``model_type`` must be
        ``"gpt2"``; a field that is neither read nor known to be harmless is an error.
      axes: layer name (a pattern with ``*``) -> ``{weight path: logical axes}``.

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 2, "n_embd": 64, "n_head": 4})
      >>> g.output_specs
      (f32[batch,seq,50257],)
    """
    c = Config(GPT2, config)
    o = AxisOverrides("gpt2", axes)
    width, heads, layers = c.positive_int("n_embd"), c.positive_int("n_head"), c.positive_int("n_layer")
    inner = c.get("n_inner") or 4 * width
    eps = c.number("layer_norm_epsilon", 0.0, 1.0)
    std = c.number("initializer_range")
    normal, projection = initializers.normal(std), initializers.normal(std / math.sqrt(2 * layers))

    x = Input(("batch", "seq", width), name="hidden_states")
    h = ops.LayerNorm(epsilon=eps, name="ln_1", param_axes=o("ln_1"))(x)
    h = ops.MultiHeadAttention(heads, causal=True, dropout=c.number("attn_pdrop", 0.0, 1.0),
                               kernel_init=normal, out_init=projection, name="attn",
                               param_axes=o("attn"))(h)
    h = x + dropout(c, "resid_pdrop", "attn.resid_dropout", h)
    m = ops.Linear(inner, kernel_init=normal, name="mlp.c_fc", param_axes=o("mlp.c_fc"))(
        ops.LayerNorm(epsilon=eps, name="ln_2", param_axes=o("ln_2"))(h))
    m = ops.Linear(width, kernel_init=projection, name="mlp.c_proj", param_axes=o("mlp.c_proj", ROW_PARALLEL))(
        activation(c, "activation_function", "mlp.act")(m))
    block = Graph(x, h + dropout(c, "resid_pdrop", "mlp.dropout", m), name="GPT2Block")

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    n_positions = c.positive_int("n_positions")
    wte = ops.Embedding(c.positive_int("vocab_size"), width, embedding_init=normal, name="wte",
                        param_axes=o("wte"))
    positions = ops.Embedding(n_positions, width, embedding_init=normal, name="wpe", param_axes=o("wpe"))(
        ops.arange(ids.shape[1], limit=n_positions))
    h = dropout(c, "embd_pdrop", "drop", wte(ids) + positions)
    for i in range(layers):
        h = block.as_block(f"h.{i}")(h)
    h = ops.LayerNorm(epsilon=eps, name="ln_f", param_axes=o("ln_f"))(h)
    o.check()
    return Graph(ids, wte.attend(h), name="gpt2")
