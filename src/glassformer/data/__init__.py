"""Data: tokenizers, the user's files, bundled corpora, and batching."""

from glassformer.data.batching import (
    BucketBatches,
    LMBatches,
    collate_labelled,
    collate_pairs,
    eval_batches,
    pad_batch,
)
from glassformer.data.corpora import CORPORA, CorpusUnavailableError, Splits, load_corpus
from glassformer.data.files import read_labelled, read_pairs, read_text
from glassformer.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    MissingDependencyError,
    Tokenizer,
    WordPieceTokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "CORPORA",
    "BPETokenizer",
    "BucketBatches",
    "CharTokenizer",
    "CorpusUnavailableError",
    "LMBatches",
    "MissingDependencyError",
    "Splits",
    "Tokenizer",
    "WordPieceTokenizer",
    "collate_labelled",
    "collate_pairs",
    "eval_batches",
    "load_corpus",
    "load_tokenizer",
    "pad_batch",
    "read_labelled",
    "read_pairs",
    "read_text",
    "train_tokenizer",
]
