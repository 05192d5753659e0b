"""GPT-2 (Hugging Face's ``GPT2LMHeadModel``): token ids -> next-token logits, with the
original's module names (``wte``, ``wpe``, ``h.0`` ... ``h.11``, ``ln_f``) and its
checkpoints' layout (``Conv1D`` weights stored ``(in, out)``; one fused ``c_attn``)."""

from __future__ import annotations

from typing import Any

from .. import ops
from ..ir.graph import Graph, Input
from .common import activation, dropout
from .config import Config
from .torch_layout import TorchLayout, register_layout

__all__ = ["gpt2", "GPT2_DEFAULTS"]

#: GPT2Config's defaults: GPT-2 small (124M).
GPT2_DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
                 "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
                 "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
                 "layer_norm_epsilon": 1e-5}

register_layout("gpt2", TorchLayout(
    linear="in_out", attention=(("qkv", "c_attn"), ("out", "c_proj")),
    prefixes=("transformer.",), tied=(("lm_head.weight", "wte.weight"),), model_prefix="transformer.",
    buffers=r"h\.\d+\.attn\.(bias|masked_bias)"))


def gpt2(config: Any = None) -> Graph:
    """GPT-2 from its Hugging Face config: ``input_ids (batch, seq)`` int32 ->
    ``logits (batch, seq, vocab_size)``, the head tied to ``wte`` (``wte.attend``).

    Pre-norm blocks ``h.{i}``: ``ln_1``, ``attn`` (causal multi-head attention, its
    weights ``c_attn`` and ``c_proj`` in files), ``ln_2``, ``mlp.c_fc``, ``mlp.act``
    (``activation_function``; ``"gelu_new"`` is the tanh GELU), ``mlp.c_proj``; dropout
    at ``resid_pdrop``, ``embd_pdrop`` and ``attn_pdrop`` in training. LayerNorm epsilon
    ``layer_norm_epsilon``. ``seq`` is symbolic, at most ``n_positions``.

    Args:
      config: the config's fields as a dict (``config.to_dict()``, a ``config.json``'s
        contents or its path); missing fields take GPT2Config's defaults (GPT-2 small).

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.gpt2({"n_layer": 2, "n_embd": 64, "n_head": 4})
      >>> g.output_specs
      (f32[batch,seq,50257],)
    """
    c = Config("gpt2", config, GPT2_DEFAULTS)
    c.unsupported("add_cross_attention", False)
    c.unsupported("scale_attn_weights", True)
    c.unsupported("scale_attn_by_inverse_layer_idx", False)
    width, heads = c.positive_int("n_embd"), c.positive_int("n_head")
    inner = c.get("n_inner") or 4 * width
    eps = c.number("layer_norm_epsilon", 0.0, 1.0)

    x = Input(("batch", "seq", width), name="hidden_states")
    h = ops.LayerNorm(epsilon=eps, name="ln_1")(x)
    h = ops.MultiHeadAttention(heads, causal=True, dropout=c.number("attn_pdrop", 0.0, 1.0),
                               name="attn")(h)
    h = x + dropout(c, "resid_pdrop", "attn.resid_dropout", h)
    m = ops.Linear(inner, name="mlp.c_fc")(ops.LayerNorm(epsilon=eps, name="ln_2")(h))
    m = ops.Linear(width, name="mlp.c_proj")(activation(c, "activation_function", "mlp.act")(m))
    block = Graph(x, h + dropout(c, "resid_pdrop", "mlp.dropout", m), name="GPT2Block")

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    wte = ops.Embedding(c.positive_int("vocab_size"), width, name="wte")
    positions = ops.Embedding(c.positive_int("n_positions"), width, name="wpe")(ops.arange(ids.shape[1]))
    h = dropout(c, "embd_pdrop", "drop", wte(ids) + positions)
    for i in range(c.positive_int("n_layer")):
        h = block.as_block(f"h.{i}")(h)
    h = ops.LayerNorm(epsilon=eps, name="ln_f")(h)
    return Graph(ids, wte.attend(h), name="gpt2")
