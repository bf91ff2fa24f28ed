"""Marian's tokenizer (Helsinki-NLP's opus-mt models): SentencePiece pieces, numbered by the
model's ``vocab.json``.

A Marian directory holds ``source.spm`` (how the source language is cut into pieces),
``target.spm`` (how the target language's pieces are joined back into text) and
``vocab.json`` (piece → id, one vocabulary shared by both sides). A source sentence is its
pieces' ids followed by ``</s>``, as Marian was trained; an unknown piece is ``<unk>``. The
decoder starts from the pad id, which is this tokenizer's ``bos_id`` too.

The `sentencepiece` package reads the two models (``pip install 'glassformer[marian]'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glassformer.data.tokenizers.base import Tokenizer
from glassformer.errors import MissingDependencyError

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")


class MarianTokenizer(Tokenizer):
    """The tokenizer of the Marian directory ``folder`` (see the module doc)."""

    kind = "sentencepiece"

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        missing = [name for name in MARIAN_FILES if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"{folder} is not a Marian tokenizer: it has no {missing[0]}")
        spm = require_sentencepiece()
        try:
            self._source = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
            self._target = spm.SentencePieceProcessor(model_file=str(folder / "target.spm"))
            vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        except (OSError, RuntimeError, ValueError) as e:
            raise ValueError(f"{folder} holds an unreadable Marian tokenizer: {e}") from None
        if not isinstance(vocab, dict) or not {"</s>", "<unk>", "<pad>"} <= set(vocab):
            raise ValueError(f"{folder / 'vocab.json'} lacks </s>, <unk> or <pad>")
        self._ids: dict[str, int] = {str(p): int(i) for p, i in vocab.items()}
        self._pieces = {i: p for p, i in self._ids.items()}
        self.eos_id, self.unk_id = self._ids["</s>"], self._ids["<unk>"]
        self.pad_id = self.bos_id = self._ids["<pad>"]  # Marian's decoder starts from pad

    @property
    def vocab_size(self) -> int:
        return max(self._pieces) + 1

    def _encode(self, text: str) -> list[int]:
        pieces = self._source.encode(text, out_type=str)
        return [self._ids.get(p, self.unk_id) for p in pieces] + [self.eos_id]

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        return self._target.decode_pieces([self.id_to_token(i) for i in ids])

    def id_to_token(self, token_id: int) -> str:
        return self._pieces.get(token_id, "<unk>")

    def to_json(self) -> str:
        raise ValueError("a Marian tokenizer is its SentencePiece files; copy source.spm, "
                         "target.spm and vocab.json instead")  # fmt: skip


def require_sentencepiece() -> Any:
    """The `sentencepiece` library.

    Raises:
        MissingDependencyError: it is not installed.
    """
    try:
        import sentencepiece
    except ImportError:
        raise MissingDependencyError(
            "Marian's tokenizer needs the `sentencepiece` package: "
            "pip install 'glassformer[marian]'"
        ) from None
    return sentencepiece
