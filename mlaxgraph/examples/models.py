"""Example graphs: an MLP, a residual CNN (with a ResNet basic block), a Transformer
encoder block, a deep causal Transformer language model and an LSTM sequence
classifier."""

from __future__ import annotations

from .. import ops
from ..ir import Graph, Input


def mlp(features: int = 784, hidden: tuple[int, ...] = (128, 64), classes: int = 10,
        dropout: float = 0.0) -> Graph:
    """A multi-layer perceptron on ``(batch, features)`` inputs.

    Example:
      >>> print(mlp(4, (3,), 2))
      graph mlp(%x: f32[batch,4]) {
        %dense: f32[batch,3] = linear[features=3](%x)
        %relu: f32[batch,3] = relu(%dense)
        %logits: f32[batch,2] = linear[features=2](%relu)
        return %logits
      }
    """
    x = Input(("batch", features), name="x")
    h = x
    for i, width in enumerate(hidden):
        h = ops.relu(ops.Linear(width, name="dense" if i == 0 else f"dense_{i}")(h))
        if dropout:
            h = ops.Dropout(dropout)(h)
    return Graph(x, ops.Linear(classes, name="logits")(h), name="mlp")


def residual_block(channels: int, name: str) -> Graph:
    """conv-bn-relu-conv-bn plus the input, then relu: a ResNet basic block."""
    x = Input(("batch", "height", "width", channels), name="x")
    h = ops.Conv(channels, (3, 3), padding="SAME", use_bias=False, name="conv_a")(x)
    h = ops.relu(ops.BatchNorm(name="bn_a")(h))
    h = ops.Conv(channels, (3, 3), padding="SAME", use_bias=False, name="conv_b")(h)
    h = ops.BatchNorm(name="bn_b")(h)
    return Graph(x, ops.relu(ops.add(h, x)), name=name)


def residual_cnn(size: int = 8, channels: int = 16, classes: int = 10) -> Graph:
    """A small residual CNN for ``(batch, size, size, 1)`` images (8x8 digits by default):
    a stem convolution, one residual block, pooling and a linear classifier.

    Example:
      >>> g = residual_cnn()
      >>> g.output_specs
      (f32[batch,10],)
    """
    x = Input(("batch", size, size, 1), name="image")
    h = ops.Conv(channels, (3, 3), padding="SAME", name="stem")(x)
    h = ops.relu(ops.BatchNorm(name="stem_bn")(h))
    block = residual_block(channels, "res1")
    h = block(h)
    h = ops.MaxPool((2, 2))(h)
    h = ops.Flatten()(h)
    h = ops.Dropout(0.1)(h)
    return Graph(x, ops.Linear(classes, name="logits")(h), name="residual_cnn")


def transformer_block(length: int = 16, width: int = 64, heads: int = 4, mlp: int = 128,
                      causal: bool = False, dropout: float = 0.0) -> Graph:
    """A pre-norm Transformer encoder block on ``(batch, length, width)``:
    ``x + MHA(LN(x))`` then ``h + MLP(LN(h))``.

    Example:
      >>> transformer_block().output_specs
      (f32[batch,16,64],)
    """
    x = Input(("batch", length, width), name="x")
    h = ops.LayerNorm(name="ln_attention")(x)
    mask = ops.causal_mask(h) if causal else None
    attention = ops.MultiHeadAttention(heads, width // heads, name="attention")
    a = attention(h) if mask is None else attention(h, mask=mask)
    if dropout:
        a = ops.Dropout(dropout, name="attention_dropout")(a)
    h = ops.add(x, a)
    m = ops.LayerNorm(name="ln_mlp")(h)
    m = ops.Linear(width, name="mlp_out")(ops.gelu(ops.Linear(mlp, name="mlp_in")(m)))
    if dropout:
        m = ops.Dropout(dropout, name="mlp_dropout")(m)
    return Graph(x, ops.add(h, m), name="transformer_block")


def lstm_classifier(vocab: int = 100, length: int = 20, width: int = 32, hidden: int = 64,
                    classes: int = 5) -> Graph:
    """Token ids ``(batch, length)`` -> embeddings -> LSTM -> the final hidden state ->
    class logits.

    Example:
      >>> lstm_classifier().output_specs
      (f32[batch,5],)
    """
    tokens = Input(("batch", length), "int32", name="tokens")
    h = ops.Embedding(vocab, width, name="embed")(tokens)
    _, final_h, _ = ops.LSTM(hidden, return_state=True, name="lstm")(h)
    return Graph(tokens, ops.Linear(classes, name="logits")(final_h), name="lstm_classifier")


def transformer_lm(vocab: int = 256, length: int = 64, depth: int = 4, width: int = 128,
                   heads: int = 4, mlp: int | None = None, dropout: float = 0.0) -> Graph:
    """A causal Transformer language model: token ids ``(batch, length)`` -> embeddings
    -> ``depth`` pre-norm causal blocks (``block0``, ``block1``, ..., each a call of
    one ``transformer_block`` graph with weights of its own) -> a final LayerNorm ->
    next-token logits ``(batch, length, vocab)``. The blocks form one run of equal
    blocks, which ``mg.compile(..., scan_blocks=True)`` folds into one scan.

    Example:
      >>> lm = transformer_lm(vocab=32, length=8, depth=3, width=16, heads=2)
      >>> [node.name for node in lm.nodes]
      ['tokens', 'embed', 'block0', 'block1', 'block2', 'ln_final', 'logits']
      >>> lm.output_specs
      (f32[batch,8,32],)
    """
    tokens = Input(("batch", length), "int32", name="tokens")
    block = transformer_block(length, width, heads, mlp or 4 * width, causal=True, dropout=dropout)
    h = ops.Embedding(vocab, width, name="embed")(tokens)
    for i in range(depth):
        h = block.as_block(f"block{i}")(h)
    h = ops.LayerNorm(name="ln_final")(h)
    return Graph(tokens, ops.Linear(vocab, name="logits")(h), name="transformer_lm")
