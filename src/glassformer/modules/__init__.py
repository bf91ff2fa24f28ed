"""Building blocks, one concept a file."""

from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import (
    Block,
    BlockInputs,
    BlockOutput,
    LayerOutput,
    Stack,
    StackOutput,
    run_blocks,
)
from glassformer.modules.cache import DecoderCache, KVCache, RollingKVCache, StaticKVCache
from glassformer.modules.feedforward import ACTIVATIONS, FeedForward, GatedFeedForward
from glassformer.modules.local_attention import (
    LocalWeights,
    Window,
    band_to_dense,
    local_attention,
    window_mask,
)
from glassformer.modules.norms import LayerNorm, RMSNorm
from glassformer.modules.patches import PatchEmbedding, SinusoidalGridEncoding
from glassformer.modules.position import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    positional_encoding,
)
from glassformer.modules.rope_scaling import RopeScaling
from glassformer.modules.rotary import RotaryAngles, RotaryEmbedding
from glassformer.modules.sdpa import (
    ATTEND,
    AttentionOutput,
    Scores,
    attention_mask_to_key_mask,
    auto_padding_mask,
    causal_mask,
    combine_masks,
    padding_mask,
    register_attend,
    scaled_dot_product_attention,
)
from glassformer.modules.stack import Decoder, DecoderLayer, Encoder, EncoderLayer

__all__ = [
    "ACTIVATIONS",
    "AttentionOutput",
    "ATTEND",
    "Block",
    "BlockInputs",
    "BlockOutput",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "GatedFeedForward",
    "KVCache",
    "LayerNorm",
    "LayerOutput",
    "LearnedPositionalEmbedding",
    "LocalWeights",
    "MultiHeadAttention",
    "PatchEmbedding",
    "RMSNorm",
    "RollingKVCache",
    "RotaryAngles",
    "RopeScaling",
    "RotaryEmbedding",
    "Scores",
    "SinusoidalGridEncoding",
    "SinusoidalPositionalEncoding",
    "Stack",
    "StackOutput",
    "StaticKVCache",
    "TokenEmbedding",
    "Window",
    "attention_mask_to_key_mask",
    "auto_padding_mask",
    "band_to_dense",
    "causal_mask",
    "combine_masks",
    "local_attention",
    "padding_mask",
    "positional_encoding",
    "register_attend",
    "run_blocks",
    "scaled_dot_product_attention",
    "window_mask",
]
