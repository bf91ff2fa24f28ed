"""glassformer: a Transformer written from scratch in PyTorch, readable and proven."""

from glassformer import interop  # noqa: F401  (registers the foreign formats it reads)
from glassformer._version import __version__
from glassformer.checkpoint import load_checkpoint, save_checkpoint
from glassformer.generation import GenerationConfig
from glassformer.inference import load_run
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
from glassformer.training import RunConfig, RunResult, fit

__all__ = [
    "__version__",
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
    "RunConfig",
    "RunResult",
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
    "fit",
    "load_checkpoint",
    "load_run",
    "padding_mask",
    "save_checkpoint",
    "scaled_dot_product_attention",
]
