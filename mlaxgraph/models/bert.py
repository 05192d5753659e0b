"""BERT (Hugging Face's ``BertModel``): token ids, token types and an attention mask ->
``(last_hidden_state, pooler_output)``, with the original's module names
(``embeddings.word_embeddings``, ``encoder.layer.0`` ..., ``pooler.dense``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import ops
from ..ir.graph import Graph, Input
from ..ops import initializers
from .common import ROW_PARALLEL, AxisOverrides, activation, dropout
from .config import Config, Family
from .torch_layout import TorchLayout, register_layout

__all__ = ["bert", "BERT_DEFAULTS", "BERT"]

#: BertConfig's defaults: BERT base.
BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                 "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                 "initializer_range": 0.02}

BERT = Family(
    "bert", ("bert",), BERT_DEFAULTS,
    checked={"position_embedding_type": ("absolute",), "is_decoder": (False,),
             "add_cross_attention": (False,)},
    # classifier_dropout: the task heads'; pooler_* and directionality: fields of the
    # original TensorFlow checkpoints' configs (bert-base-chinese) that the model ignores;
    # tie_word_embeddings (transformers 5.x writes it): the masked-LM head's, not built.
    harmless=frozenset({"classifier_dropout", "directionality", "tie_word_embeddings",
                        "pooler_fc_size",
                        "pooler_num_attention_heads", "pooler_num_fc_layers",
                        "pooler_size_per_head", "pooler_type"}))

register_layout("bert", TorchLayout(
    attention=(("query", "self.query"), ("key", "self.key"), ("value", "self.value"),
               ("out", "output.dense")),
    prefixes=("bert.",), buffers=r"embeddings\.position_ids"))


def bert(config: Any = None, *, add_pooling_layer: bool = True,
         axes: Mapping[str, Mapping[str, Any]] | None = None) -> Graph:
    """BERT from its Hugging Face config: ``(input_ids, token_type_ids,
    attention_mask)``, each ``(batch, seq)`` int32 (the mask 1 = attend, 0 = padding) ->
    ``(last_hidden_state (batch, seq, hidden_size), pooler_output (batch,
    hidden_size))``.

    Post-norm layers ``encoder.layer.{i}``: ``attention`` (its weights
    ``attention.self.query`` ... ``attention.output.dense`` in files),
    ``attention.output.LayerNorm``, ``intermediate.dense`` with ``hidden_act`` (exact
    GELU by default), ``output.dense``, ``output.LayerNorm``; LayerNorm epsilon
    ``layer_norm_eps`` (1e-12); dropout at ``hidden_dropout_prob`` and
    ``attention_probs_dropout_prob`` in training. The pooler is ``tanh(pooler.dense(
    h[:, 0]))``. ``seq`` is symbolic, at most ``max_position_embeddings``.

    ``add_pooling_layer=False`` leaves the pooler out, as the original's task models
    (``BertForTokenClassification``) do: their checkpoints have no ``pooler``
    weights; the graph's one output is then ``last_hidden_state``.

    Initialization as Hugging Face's: kernels and embeddings normal with standard
    deviation ``initializer_range`` (0.02), biases 0, LayerNorm 1 and 0 (the original
    also zeroes the padding token's embedding row; here it is drawn like the others).
    Logical axes: the Megatron layout (``output.dense`` row-parallel); ``axes=``
    overrides them per layer. ``config`` and its checks are as ``gpt2``'s
    (``model_type`` ``"bert"``).

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.bert({"num_hidden_layers": 2, "hidden_size": 64,
      ...                     "num_attention_heads": 4, "intermediate_size": 128})
      >>> g.output_specs
      (f32[batch,seq,64], f32[batch,64])
    """
    c = Config(BERT, config)
    o = AxisOverrides("bert", axes)
    normal = initializers.normal(c.number("initializer_range"))
    width, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
    eps = c.number("layer_norm_eps", 0.0, 1.0)

    x = Input(("batch", "seq", width), name="hidden_states")
    mask = Input(("batch", "seq"), "int32", name="attention_mask")
    a = ops.MultiHeadAttention(heads, dropout=c.number("attention_probs_dropout_prob", 0.0, 1.0),
                               kernel_init=normal, name="attention", param_axes=o("attention"))(x, mask=mask)
    a = dropout(c, "hidden_dropout_prob", "attention.output.dropout", a)
    h = ops.LayerNorm(epsilon=eps, name="attention.output.LayerNorm",
                      param_axes=o("attention.output.LayerNorm"))(x + a)
    m = ops.Linear(c.positive_int("intermediate_size"), kernel_init=normal, name="intermediate.dense",
                   param_axes=o("intermediate.dense"))(h)
    m = ops.Linear(width, kernel_init=normal, name="output.dense", param_axes=o("output.dense", ROW_PARALLEL))(
        activation(c, "hidden_act", "intermediate.intermediate_act_fn")(m))
    m = dropout(c, "hidden_dropout_prob", "output.dropout", m)
    layer = Graph([x, mask], ops.LayerNorm(epsilon=eps, name="output.LayerNorm",
                                           param_axes=o("output.LayerNorm"))(h + m), name="BertLayer")

    def embedding(size, name):
        return ops.Embedding(size, width, embedding_init=normal, name=name, param_axes=o(name))

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    types = Input(("batch", "seq"), "int32", name="token_type_ids")
    attention_mask = Input(("batch", "seq"), "int32", name="attention_mask")
    table = c.positive_int("max_position_embeddings")
    positions = ops.arange(ids.shape[1], limit=table)
    e = (embedding(c.positive_int("vocab_size"), "embeddings.word_embeddings")(ids)
         + embedding(table, "embeddings.position_embeddings")(positions)
         + embedding(c.positive_int("type_vocab_size"), "embeddings.token_type_embeddings")(types))
    h = ops.LayerNorm(epsilon=eps, name="embeddings.LayerNorm", param_axes=o("embeddings.LayerNorm"))(e)
    h = dropout(c, "hidden_dropout_prob", "embeddings.dropout", h)
    for i in range(c.positive_int("num_hidden_layers")):
        h = layer.as_block(f"encoder.layer.{i}")(h, attention_mask)
    if not add_pooling_layer:  # as the original's task models build theirs
        o.check()
        return Graph([ids, types, attention_mask], h, name="bert")
    pooled = ops.Tanh(name="pooler.activation")(
        ops.Linear(width, kernel_init=normal, name="pooler.dense", param_axes=o("pooler.dense"))(h[:, 0]))
    o.check()
    return Graph([ids, types, attention_mask], [h, pooled], name="bert")
