"""The character tokenizer, glassformer's own: one id per character, no dependencies."""

from __future__ import annotations

import json
from collections.abc import Iterable

from glassformer.data.tokenizers.base import CHAR_SPECIALS, UNK_ID, Tokenizer
from glassformer.errors import shown


class CharTokenizer(Tokenizer):
    """One id per character seen in training (after the four specials); others → unk.

    Args:
        chars: the vocabulary's characters (sorted and de-duplicated here).
        lowercase: lower-case text before encoding.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], *, lowercase: bool = False) -> None:
        chars = list(chars)  # checked before set(), where a dict would be a TypeError
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"a character vocabulary holds single characters, got {shown(bad[0])}")
        self.chars = sorted(set(chars))
        self.lowercase = lowercase
        self._id = {c: i + len(CHAR_SPECIALS) for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, texts: Iterable[str], *, lowercase: bool = False) -> CharTokenizer:
        """The vocabulary of every character in ``texts``."""
        chars: set[str] = set()
        for text in texts:
            chars.update(text.lower() if lowercase else text)
        if not chars:
            raise ValueError("cannot train a tokenizer on empty text")
        return cls(chars, lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return len(CHAR_SPECIALS) + len(self.chars)

    def _encode(self, text: str) -> list[int]:
        get = self._id.get
        return [get(c, UNK_ID) for c in (text.lower() if self.lowercase else text)]

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        unk = "\ufffd" if skip_special else CHAR_SPECIALS[UNK_ID]
        return "".join(unk if i == UNK_ID else self.id_to_token(i) for i in ids)

    def id_to_token(self, token_id: int) -> str:
        n = len(CHAR_SPECIALS)
        return self.chars[token_id - n] if token_id >= n else CHAR_SPECIALS[token_id]

    def to_json(self) -> str:
        spec = {"type": "glassformer-char", "version": 1, "chars": self.chars}
        if self.lowercase:
            spec["lowercase"] = True
        return json.dumps(spec, ensure_ascii=False)
