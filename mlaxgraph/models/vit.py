"""ViT (Hugging Face's ``ViTModel``): NCHW ``pixel_values`` -> ``(last_hidden_state,
pooler_output)``, with the original's module names (``embeddings.cls_token``,
``embeddings.patch_embeddings.projection``, ``encoder.layer.0`` ..., ``layernorm``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import ops
from ..core.errors import ConfigError
from ..ir.graph import Graph, Input
from ..ops import initializers
from .common import ROW_PARALLEL, AxisOverrides, activation, dropout
from .config import Config, Family
from .torch_layout import TorchLayout, register_layout

__all__ = ["vit", "VIT_DEFAULTS", "VIT"]

#: ViTConfig's defaults: ViT-Base/16 at 224 x 224.
VIT_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-12,
                "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True,
                "initializer_range": 0.02, "pooler_output_size": None}

VIT = Family(
    "vit", ("vit",), VIT_DEFAULTS,
    checked={"qkv_bias": (True,), "use_mask_token": (False,), "pooler_act": ("tanh",)},
    # encoder_stride: ViTForMaskedImageModeling's decoder.
    harmless=frozenset({"encoder_stride"}))

register_layout("vit", TorchLayout(
    attention=(("query", "attention.query"), ("key", "attention.key"),
               ("value", "attention.value"), ("out", "output.dense")),
    prefixes=("vit.",),
    # transformers 5.x's ViTModel in memory (its conversion mapping, undone): layers.N
    # for encoder.layer.N, q/k/v/o_proj for the attention's modules, mlp.fc1 and fc2
    renames=((r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
             (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
             (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
             (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
             (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
             (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
             (r"^layers\.(\d+)\.", r"encoder.layer.\1."))))


def vit(config: Any = None, *, add_pooling_layer: bool = True,
        axes: Mapping[str, Mapping[str, Any]] | None = None) -> Graph:
    """ViT from its Hugging Face config: ``pixel_values (batch, num_channels,
    image_size, image_size)`` float32, channel-first as Hugging Face passes them ->
    ``(last_hidden_state (batch, patches + 1, hidden_size), pooler_output (batch,
    hidden_size))``.

    The patches are a ``patch_size`` convolution with stride ``patch_size``
    (``embeddings.patch_embeddings.projection``, OIHW as in the files); then the
    ``embeddings.cls_token`` and ``embeddings.position_embeddings`` params; pre-norm
    layers ``encoder.layer.{i}`` (``layernorm_before``, ``attention``, whose weights
    are ``attention.attention.query`` ... ``attention.output.dense`` in files,
    ``layernorm_after``, ``intermediate.dense`` with ``hidden_act``, ``output.dense``);
    ``layernorm``; the pooler ``tanh(pooler.dense(h[:, 0]))``. LayerNorm epsilon
    ``layer_norm_eps`` (1e-12).

    ``add_pooling_layer=False`` leaves the pooler out, as the original's task models
    (``ViTForImageClassification``) do: their checkpoints have no ``pooler``
    weights; the graph's one output is then ``last_hidden_state``.

    Initialization as Hugging Face's: kernels (the patch convolution's too),
    ``cls_token`` and ``position_embeddings`` normal with standard deviation
    ``initializer_range`` (0.02; the original truncates at +-2, 100 standard deviations
    away), biases 0, LayerNorm 1 and 0. Logical axes: the Megatron layout
    (``output.dense`` row-parallel); ``axes=`` overrides them per layer. ``config`` and
    its checks are as ``gpt2``'s (``model_type`` ``"vit"``).

    Example:
      >>> import mlaxgraph as mg
      >>> g = mg.models.vit({"image_size": 32, "patch_size": 8, "hidden_size": 64,
      ...                    "num_hidden_layers": 2, "num_attention_heads": 4,
      ...                    "intermediate_size": 128})
      >>> g.output_specs
      (f32[batch,17,64], f32[batch,64])
    """
    c = Config(VIT, config)
    o = AxisOverrides("vit", axes)
    normal = initializers.normal(c.number("initializer_range"))
    width, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
    eps = c.number("layer_norm_eps", 0.0, 1.0)
    size, patch, channels = c.positive_int("image_size"), c.positive_int("patch_size"), c.positive_int("num_channels")
    if size % patch:
        raise ConfigError(f"vit: patch_size {patch} does not divide image_size {size}")
    patches = (size // patch) ** 2

    x = Input(("batch", patches + 1, width), name="hidden_states")
    h = ops.LayerNorm(epsilon=eps, name="layernorm_before", param_axes=o("layernorm_before"))(x)
    a = ops.MultiHeadAttention(heads, dropout=c.number("attention_probs_dropout_prob", 0.0, 1.0),
                               kernel_init=normal, name="attention", param_axes=o("attention"))(h)
    h = x + dropout(c, "hidden_dropout_prob", "attention.output.dropout", a)
    m = ops.Linear(c.positive_int("intermediate_size"), kernel_init=normal, name="intermediate.dense",
                   param_axes=o("intermediate.dense"))(
        ops.LayerNorm(epsilon=eps, name="layernorm_after", param_axes=o("layernorm_after"))(h))
    m = ops.Linear(width, kernel_init=normal, name="output.dense", param_axes=o("output.dense", ROW_PARALLEL))(
        activation(c, "hidden_act", "intermediate.intermediate_act_fn")(m))
    layer = Graph(x, h + dropout(c, "hidden_dropout_prob", "output.dropout", m), name="ViTLayer")

    pixels = Input(("batch", channels, size, size), name="pixel_values")
    e = ops.Conv(width, patch, strides=patch, data_format="NCHW", kernel_init=normal,
                 name="embeddings.patch_embeddings.projection",
                 param_axes=o("embeddings.patch_embeddings.projection"))(pixels)
    e = ops.transpose(ops.reshape(e, (width, patches)), (0, 2, 1))
    cls = ops.Param((1, 1, width), init=normal, name="embeddings.cls_token")()
    e = ops.concat([ops.broadcast_to(cls, (pixels.shape[0], 1, width)), e], axis=1)
    e = e + ops.Param((1, patches + 1, width), init=normal, name="embeddings.position_embeddings")()
    h = dropout(c, "hidden_dropout_prob", "embeddings.dropout", e)
    for i in range(c.positive_int("num_hidden_layers")):
        h = layer.as_block(f"encoder.layer.{i}")(h)
    h = ops.LayerNorm(epsilon=eps, name="layernorm", param_axes=o("layernorm"))(h)
    o.check()
    if not add_pooling_layer:  # as the original's task models build theirs
        return Graph(pixels, h, name="vit")
    pooled = ops.Tanh(name="pooler.activation")(
        ops.Linear(c.get("pooler_output_size") or width, kernel_init=normal, name="pooler.dense",
                   param_axes=o("pooler.dense"))(h[:, 0]))
    return Graph(pixels, [h, pooled], name="vit")
