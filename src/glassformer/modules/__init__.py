"""Building blocks, one concept a file."""

from glassformer.modules.attention import (
    AttentionOutput,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from glassformer.modules.cache import DecoderCache, KVCache, RollingKVCache
from glassformer.modules.feedforward import ACTIVATIONS, FeedForward, GatedFeedForward
from glassformer.modules.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LayerOutput,
    StackOutput,
)
from glassformer.modules.local_attention import (
    LocalWeights,
    band_to_dense,
    local_attention,
    window_mask,
)
from glassformer.modules.masks import (
    attention_mask_to_key_mask,
    auto_padding_mask,
    causal_mask,
    combine_masks,
    padding_mask,
)
from glassformer.modules.norms import RMSNorm
from glassformer.modules.patches import PatchEmbedding
from glassformer.modules.position import (
    LearnedPositionalEmbedding,
    SinusoidalGridEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    positional_encoding,
)
from glassformer.modules.rotary import RotaryEmbedding

__all__ = [
    "ACTIVATIONS",
    "AttentionOutput",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "GatedFeedForward",
    "KVCache",
    "LayerOutput",
    "LearnedPositionalEmbedding",
    "LocalWeights",
    "MultiHeadAttention",
    "PatchEmbedding",
    "RMSNorm",
    "RollingKVCache",
    "RotaryEmbedding",
    "SinusoidalGridEncoding",
    "SinusoidalPositionalEncoding",
    "StackOutput",
    "TokenEmbedding",
    "attention_mask_to_key_mask",
    "auto_padding_mask",
    "band_to_dense",
    "causal_mask",
    "combine_masks",
    "local_attention",
    "padding_mask",
    "positional_encoding",
    "scaled_dot_product_attention",
    "window_mask",
]
