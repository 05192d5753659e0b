"""Llama (Hugging Face's ``LlamaForCausalLM``): token ids -> next-token logits, with the
original's module names (``model.embed_tokens``, ``model.layers.0`` ...,
``model.norm``, ``lm_head``): RMSNorm, rotary embeddings, a SwiGLU MLP and
grouped-query attention."""

from __future__ import annotations

from typing import Any

from .. import ops
from ..ir.graph import Graph, Input
from .common import activation
from .config import Config
from .torch_layout import TorchLayout, register_layout

__all__ = ["llama", "LLAMA_DEFAULTS"]

#: LlamaConfig's defaults: Llama 2 7B.
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                  "head_dim": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                  "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
                  "attention_dropout": 0.0, "mlp_bias": False}

register_layout("llama", TorchLayout(
    tied=(("lm_head.weight", "model.embed_tokens.weight"),),
    buffers=r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"))


def llama(config: Any = None) -> Graph:
    """Llama from its Hugging Face config: ``input_ids (batch, seq)`` int32 ->
    ``logits (batch, seq, vocab_size)``.

    Pre-norm layers ``model.layers.{i}``: ``input_layernorm`` (RMSNorm,
    ``rms_norm_eps``), ``self_attn`` (causal grouped-query attention with
    ``num_key_value_heads`` key/value heads and rotary embeddings of base
    ``rope_theta``; its weights are ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` in
    files), ``post_attention_layernorm``, ``mlp.down_proj(mlp.act_fn(mlp.gate_proj(x))
    * mlp.up_proj(x))``; then ``model.norm`` and ``lm_head`` (or the embedding's
    weights with ``tie_word_embeddings``). ``rope_scaling`` (Llama 3.1's) is not
    supported.

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.llama({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
      ...                      "num_hidden_layers": 2, "num_attention_heads": 4,
      ...                      "num_key_value_heads": 2})
      >>> g.output_specs
      (f32[batch,seq,100],)
    """
    c = Config("llama", config, LLAMA_DEFAULTS)
    c.unsupported("rope_scaling", None)
    c.unsupported("pretraining_tp", 1)
    c.unsupported("mlp_bias", False)
    width, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or width // heads
    eps = c.number("rms_norm_eps", 0.0, 1.0)

    x = Input(("batch", "seq", width), name="hidden_states")
    a = ops.MultiHeadAttention(heads, head_dim, num_kv_heads=kv_heads, causal=True,
                               rope=c.number("rope_theta", 1.0), use_bias=bool(c["attention_bias"]),
                               dropout=c.number("attention_dropout", 0.0, 1.0),
                               name="self_attn")(ops.RMSNorm(epsilon=eps, name="input_layernorm")(x))
    h = x + a
    n = ops.RMSNorm(epsilon=eps, name="post_attention_layernorm")(h)
    inner = c.positive_int("intermediate_size")
    gate = activation(c, "hidden_act", "mlp.act_fn")(ops.Linear(inner, use_bias=False, name="mlp.gate_proj")(n))
    m = ops.Linear(width, use_bias=False, name="mlp.down_proj")(
        gate * ops.Linear(inner, use_bias=False, name="mlp.up_proj")(n))
    layer = Graph(x, h + m, name="LlamaDecoderLayer")

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    embed = ops.Embedding(c.positive_int("vocab_size"), width, name="model.embed_tokens")
    h = embed(ids)
    for i in range(c.positive_int("num_hidden_layers")):
        h = layer.as_block(f"model.layers.{i}")(h)
    h = ops.RMSNorm(epsilon=eps, name="model.norm")(h)
    if c["tie_word_embeddings"]:
        return Graph(ids, embed.attend(h), name="llama")
    return Graph(ids, ops.Linear(c.positive_int("vocab_size"), use_bias=False, name="lm_head")(h), name="llama")
