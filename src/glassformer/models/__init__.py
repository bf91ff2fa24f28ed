"""Whole models assembled from the building blocks, each built from a dataclass config."""

from glassformer.models.backbone import Backbone
from glassformer.models.base import MODEL_KINDS, ModelOutput, PretrainedModel
from glassformer.models.bert import (
    BertClassifier,
    BertClassifierConfig,
    BertConfig,
    BertEncoder,
    BertOutput,
)
from glassformer.models.classifier import (
    ClassifierConfig,
    GPTClassifier,
    SequenceClassifier,
    TransformerClassifier,
)
from glassformer.models.encoder_lm import EncoderLM, EncoderLMConfig
from glassformer.models.gpt import GPT, GPTClassifierConfig, GPTConfig
from glassformer.models.sae import SAEConfig, SparseAutoencoder
from glassformer.models.sentence import SentenceConfig, SentenceEncoder
from glassformer.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from glassformer.models.transcoder import TranscoderConfig, Transcoders
from glassformer.models.vit import VisionTransformer, ViTConfig

__all__ = [
    "SAEConfig",
    "SparseAutoencoder",
    "TranscoderConfig",
    "Transcoders",
    "GPT",
    "Backbone",
    "SequenceClassifier",
    "MODEL_KINDS",
    "GPTClassifier",
    "GPTClassifierConfig",
    "BertClassifier",
    "BertClassifierConfig",
    "BertConfig",
    "BertEncoder",
    "BertOutput",
    "ClassifierConfig",
    "EncoderLM",
    "EncoderLMConfig",
    "GPTConfig",
    "ModelOutput",
    "PretrainedModel",
    "SentenceConfig",
    "SentenceEncoder",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "TransformerClassifier",
    "ViTConfig",
    "VisionTransformer",
]
