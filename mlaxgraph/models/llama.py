"""Llama (Hugging Face's ``LlamaForCausalLM``, and Mistral's configs) and Qwen2
(``Qwen2ForCausalLM``): token ids -> next-token logits, with the original's module names
(``model.embed_tokens``, ``model.layers.0`` ..., ``model.norm``, ``lm_head``): RMSNorm,
rotary embeddings, a SwiGLU MLP and grouped-query attention."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import ops
from ..core.errors import ConfigError
from ..ir.graph import Graph, Input
from ..ops import initializers
from .common import ROW_PARALLEL, AxisOverrides, activation
from .config import Config, Family
from .rope import ROPE_FIELDS, rope_settings
from .torch_layout import TorchLayout, register_layout

__all__ = ["llama", "qwen2", "LLAMA_DEFAULTS", "QWEN2_DEFAULTS", "LLAMA", "QWEN2"]

#: LlamaConfig's defaults: Llama 2 7B.
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                  "head_dim": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                  **ROPE_FIELDS, "tie_word_embeddings": False, "attention_bias": False,
                  "attention_dropout": 0.0, "initializer_range": 0.02, "sliding_window": None,
                  "mlp_bias": False}

LLAMA = Family(
    "llama", ("llama", "mistral"), LLAMA_DEFAULTS,
    checked={"pretraining_tp": (1,)},
    # max_position_embeddings: rotary embeddings have no table (Llama 3's scaling reads
    # its own original_max_position_embeddings).
    harmless=frozenset({"max_position_embeddings"}))

#: Qwen2Config's defaults: Qwen2 7B's sizes.
QWEN2_DEFAULTS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                  "head_dim": None, "hidden_act": "silu", "rms_norm_eps": 1e-6, **ROPE_FIELDS,
                  "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02}

QWEN2 = Family(
    "qwen2", ("qwen2",), QWEN2_DEFAULTS,
    checked={"use_sliding_window": (False,)},
    # The window's fields hold only with use_sliding_window (not supported): harmless.
    harmless=frozenset({"max_position_embeddings", "sliding_window", "max_window_layers",
                        "layer_types"}))

_LAYOUT = TorchLayout(tied=(("lm_head.weight", "model.embed_tokens.weight"),),
                      buffers=r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
register_layout("llama", _LAYOUT)
register_layout("qwen2", _LAYOUT)


def _decoder(c: Config, o: AxisOverrides, *, biases: bool, out_bias: bool,
             sliding_window: int | None) -> Graph:
    """The decoder both families share; ``biases``: on q, k and v; ``out_bias``: on o."""
    width, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
    kv_heads = c.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or heads % kv_heads:
        raise ConfigError(f"{c.model}: config field 'num_key_value_heads' must be a positive int "
                          f"dividing num_attention_heads={heads}, got {kv_heads!r}")
    head_dim = c.get("head_dim") or width // heads
    eps = c.number("rms_norm_eps", 0.0, 1.0)
    base, scaling = rope_settings(c)
    normal = initializers.normal(c.number("initializer_range"))
    # Key/value heads on their own logical axis, so that sharding rules can replicate
    # them when there are fewer than devices (mg.models.sharding_rules does).
    kv_axes: dict[str, Any] = {"key/kernel": ("embed", "kv_heads", "kv"),
                               "value/kernel": ("embed", "kv_heads", "kv")}
    if biases:
        kv_axes.update({"key/bias": ("kv_heads", "kv"), "value/bias": ("kv_heads", "kv")})

    x = Input(("batch", "seq", width), name="hidden_states")
    a = ops.MultiHeadAttention(heads, head_dim, num_kv_heads=kv_heads, causal=True, rope=base,
                               rope_scaling=scaling,  # type: ignore[arg-type]  # the field's converter takes dicts
                               sliding_window=sliding_window,
                               use_bias=biases, out_bias=out_bias, kernel_init=normal,
                               dropout=c.number("attention_dropout", 0.0, 1.0),
                               name="self_attn", param_axes=o("self_attn", kv_axes))(
        ops.RMSNorm(epsilon=eps, name="input_layernorm", param_axes=o("input_layernorm"))(x))
    h = x + a
    n = ops.RMSNorm(epsilon=eps, name="post_attention_layernorm", param_axes=o("post_attention_layernorm"))(h)
    inner = c.positive_int("intermediate_size")

    def linear(features, name, axes=None, bias=False):
        return ops.Linear(features, use_bias=bias, kernel_init=normal, name=name, param_axes=o(name, axes))

    mlp_bias = bool(c.get("mlp_bias", False))  # Llama's; Qwen2 has none
    gate = activation(c, "hidden_act", "mlp.act_fn")(linear(inner, "mlp.gate_proj", bias=mlp_bias)(n))
    m = linear(width, "mlp.down_proj", {"kernel": ROW_PARALLEL["kernel"]}, bias=mlp_bias)(
        gate * linear(inner, "mlp.up_proj", bias=mlp_bias)(n))
    layer = Graph(x, h + m, name="Qwen2DecoderLayer" if c.model == "qwen2" else "LlamaDecoderLayer")

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    vocab = c.positive_int("vocab_size")
    embed = ops.Embedding(vocab, width, embedding_init=normal, name="model.embed_tokens",
                          param_axes=o("model.embed_tokens"))
    h = embed(ids)
    for i in range(c.positive_int("num_hidden_layers")):
        h = layer.as_block(f"model.layers.{i}")(h)
    h = ops.RMSNorm(epsilon=eps, name="model.norm", param_axes=o("model.norm"))(h)
    head = None if c["tie_word_embeddings"] else linear(vocab, "lm_head", {"kernel": ("embed", "vocab")})
    logits = embed.attend(h) if head is None else head(h)
    o.check()
    return Graph(ids, logits, name=c.model)


def llama(config: Any = None, *, axes: Mapping[str, Mapping[str, Any]] | None = None) -> Graph:
    """Llama from its Hugging Face config (``model_type`` ``"llama"``, or ``"mistral"``:
    Mistral is Llama with a sliding window): ``input_ids (batch, seq)`` int32 ->
    ``logits (batch, seq, vocab_size)``.

    Pre-norm layers ``model.layers.{i}``: ``input_layernorm`` (RMSNorm,
    ``rms_norm_eps``), ``self_attn`` (causal grouped-query attention with
    ``num_key_value_heads`` key/value heads and rotary embeddings; its weights are
    ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` in files), ``post_attention_layernorm``,
    ``mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))``; then
    ``model.norm`` and ``lm_head`` (or the embedding's weights with
    ``tie_word_embeddings``).

    The rotary base and scaling are read from ``rope_theta`` and ``rope_scaling``
    (transformers 4.x) or ``rope_parameters`` (5.x); scalings ``"linear"``,
    ``"llama3"`` (Llama 3.1's) and ``"yarn"``. Mistral's ``sliding_window`` (when not null) limits each
    query to the last ``sliding_window`` keys (itself included), as its attention mask.

    Initialization as Hugging Face's: kernels and the embedding normal with standard
    deviation ``initializer_range`` (0.02), biases 0, RMSNorm 1. Logical axes: the
    Megatron layout (``mlp.down_proj`` row-parallel, kernel ``("mlp", "embed")``); the
    key/value projections' heads are ``"kv_heads"``; ``axes=`` overrides them per layer.

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.llama({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
      ...                      "num_hidden_layers": 2, "num_attention_heads": 4,
      ...                      "num_key_value_heads": 2})
      >>> g.output_specs
      (f32[batch,seq,100],)
    """
    c = Config(LLAMA, config)
    window = c.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"llama: config field 'sliding_window' must be null or a positive int, "
                          f"got {window!r}")
    bias = bool(c["attention_bias"])
    return _decoder(c, AxisOverrides("llama", axes), biases=bias, out_bias=bias, sliding_window=window)


def qwen2(config: Any = None, *, axes: Mapping[str, Mapping[str, Any]] | None = None) -> Graph:
    """Qwen2 (Hugging Face's ``Qwen2ForCausalLM``) from its config: as ``llama``, with
    biases on the query, key and value projections and none on ``o_proj``; the head tied
    to the embedding with ``tie_word_embeddings`` (the small Qwen2 models) or its own
    ``lm_head``. ``use_sliding_window`` (False in the published models) is not supported.

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.qwen2({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
      ...                      "num_hidden_layers": 2, "num_attention_heads": 4,
      ...                      "num_key_value_heads": 2, "tie_word_embeddings": True})
      >>> sorted(mg.compile(g).init(__import__("jax").random.key(0))[0]["model.layers.0"]["self_attn"])
      ['key', 'out', 'query', 'value']
    """
    c = Config(QWEN2, config)
    types = c.get("layer_types")
    if types is not None and any(t != "full_attention" for t in types):
        raise ConfigError(f"qwen2: config field 'layer_types' = {types!r}: only 'full_attention' "
                          f"layers are supported")
    return _decoder(c, AxisOverrides("qwen2", axes), biases=True, out_bias=False, sliding_window=None)
