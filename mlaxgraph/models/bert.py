"""BERT (Hugging Face's ``BertModel``): token ids, token types and an attention mask ->
``(last_hidden_state, pooler_output)``, with the original's module names
(``embeddings.word_embeddings``, ``encoder.layer.0`` ..., ``pooler.dense``)."""

from __future__ import annotations

from typing import Any

from .. import ops
from ..ir.graph import Graph, Input
from .common import activation, dropout
from .config import Config
from .torch_layout import TorchLayout, register_layout

__all__ = ["bert", "BERT_DEFAULTS"]

#: BertConfig's defaults: BERT base.
BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                 "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12}

register_layout("bert", TorchLayout(
    attention=(("query", "self.query"), ("key", "self.key"), ("value", "self.value"),
               ("out", "output.dense")),
    prefixes=("bert.",), buffers=r"embeddings\.position_ids"))


def bert(config: Any = None, *, add_pooling_layer: bool = True) -> Graph:
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

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.bert({"num_hidden_layers": 2, "hidden_size": 64,
      ...                     "num_attention_heads": 4, "intermediate_size": 128})
      >>> g.output_specs
      (f32[batch,seq,64], f32[batch,64])
    """
    c = Config("bert", config, BERT_DEFAULTS)
    c.unsupported("position_embedding_type", "absolute")
    c.unsupported("is_decoder", False)
    c.unsupported("add_cross_attention", False)
    width, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
    eps = c.number("layer_norm_eps", 0.0, 1.0)

    x = Input(("batch", "seq", width), name="hidden_states")
    mask = Input(("batch", "seq"), "int32", name="attention_mask")
    a = ops.MultiHeadAttention(heads, dropout=c.number("attention_probs_dropout_prob", 0.0, 1.0),
                               name="attention")(x, mask=mask)
    a = dropout(c, "hidden_dropout_prob", "attention.output.dropout", a)
    h = ops.LayerNorm(epsilon=eps, name="attention.output.LayerNorm")(x + a)
    m = ops.Linear(c.positive_int("intermediate_size"), name="intermediate.dense")(h)
    m = ops.Linear(width, name="output.dense")(activation(c, "hidden_act", "intermediate.intermediate_act_fn")(m))
    m = dropout(c, "hidden_dropout_prob", "output.dropout", m)
    layer = Graph([x, mask], ops.LayerNorm(epsilon=eps, name="output.LayerNorm")(h + m), name="BertLayer")

    ids = Input(("batch", "seq"), "int32", name="input_ids")
    types = Input(("batch", "seq"), "int32", name="token_type_ids")
    attention_mask = Input(("batch", "seq"), "int32", name="attention_mask")
    positions = ops.arange(ids.shape[1])
    e = (ops.Embedding(c.positive_int("vocab_size"), width, name="embeddings.word_embeddings")(ids)
         + ops.Embedding(c.positive_int("max_position_embeddings"), width,
                         name="embeddings.position_embeddings")(positions)
         + ops.Embedding(c.positive_int("type_vocab_size"), width,
                         name="embeddings.token_type_embeddings")(types))
    h = ops.LayerNorm(epsilon=eps, name="embeddings.LayerNorm")(e)
    h = dropout(c, "hidden_dropout_prob", "embeddings.dropout", h)
    for i in range(c.positive_int("num_hidden_layers")):
        h = layer.as_block(f"encoder.layer.{i}")(h, attention_mask)
    if not add_pooling_layer:  # as the original's task models build theirs
        return Graph([ids, types, attention_mask], h, name="bert")
    pooled = ops.Tanh(name="pooler.activation")(ops.Linear(width, name="pooler.dense")(h[:, 0]))
    return Graph([ids, types, attention_mask], [h, pooled], name="bert")
