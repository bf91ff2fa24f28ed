"""Tokenizers: characters (our own), byte-level BPE and WordPiece (through `tokenizers`).

All three share one small interface. The ones glassformer trains fix the special ids the
models expect: pad = 0, bos = 1, eos = 2, unk = 3. A tokenizer loaded from elsewhere (a BERT
``vocab.txt`` or ``tokenizer.json``) keeps the ids its vocabulary gives those tokens, so code
reads ``tok.pad_id`` and friends, never the numbers. Each tokenizer saves to one file,
``tokenizer.json``, stored with every checkpoint.

    tok = train_tokenizer("bpe", texts, vocab_size=8000)
    ids = tok.encode("Hello there", add_bos=True)   # [1, ...]
    tok.decode(ids)                                  # "Hello there"
    tok.save("run/tokenizer.json"); load_tokenizer("run")

BPE and WordPiece need the ``tokenizers`` package (``pip install 'glassformer[data]'``); it is
imported only when one of them is trained or loaded.

The pieces: ``base`` (the ``Tokenizer`` interface; the special ids and tokens, such as
``PAD_ID`` and ``WORDPIECE_SPECIALS``), ``char`` (``CharTokenizer``), ``subword``
(``BPETokenizer``, ``WordPieceTokenizer``) and ``make`` (``train_tokenizer``,
``load_tokenizer``).
"""

from glassformer.data.tokenizers.base import Tokenizer
from glassformer.data.tokenizers.char import CharTokenizer
from glassformer.data.tokenizers.make import KINDS, load_tokenizer, train_tokenizer
from glassformer.data.tokenizers.subword import (
    BPETokenizer,
    MissingDependencyError,
    WordPieceTokenizer,
)

__all__ = [
    "KINDS",
    "BPETokenizer",
    "CharTokenizer",
    "MissingDependencyError",
    "Tokenizer",
    "WordPieceTokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
