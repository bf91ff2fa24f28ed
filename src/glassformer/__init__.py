"""glassformer: a Transformer written from scratch in PyTorch, readable and proven."""

__version__ = "0.1.0"

from glassformer.checkpoint import load_checkpoint, save_checkpoint
from glassformer.generation import GenerationConfig
from glassformer.models import (
    GPT,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    ModelOutput,
    SentenceConfig,
    SentenceEncoder,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.modules import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
)

__all__ = [
    "GPT",
    "BertConfig",
    "BertEncoder",
    "ClassifierConfig",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLM",
    "EncoderLMConfig",
    "EncoderLayer",
    "FeedForward",
    "GPTConfig",
    "GenerationConfig",
    "LearnedPositionalEmbedding",
    "ModelOutput",
    "MultiHeadAttention",
    "SentenceConfig",
    "SentenceEncoder",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "TransformerClassifier",
    "causal_mask",
    "combine_masks",
    "load_checkpoint",
    "padding_mask",
    "save_checkpoint",
    "scaled_dot_product_attention",
]
