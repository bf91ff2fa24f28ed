"""The interface every tokenizer has (``Tokenizer``), and the special ids and tokens that
the tokenizers trained here fix: pad = 0, bos = 1, eos = 2, unk = 3.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from glassformer.atomic import make_folder, write_atomic

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
DEFAULT_VOCAB_SIZE = 8000
# Beside tokenizer.json, what it does not hold: special tokens chosen by something other
# than their names, and a chat template (Hugging Face's file and field names).
TOKENIZER_CONFIG = "tokenizer_config.json"

# Special tokens in id order (pad, bos, eos, unk), then extras.
CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
BPE_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
WORDPIECE_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")


class Tokenizer(ABC):
    """The interface every tokenizer here has.

    Attributes:
        kind: ``"char"``, ``"bpe"`` or ``"wordpiece"``.
        pad_id, bos_id, eos_id, unk_id: the special ids (0, 1, 2, 3 for a tokenizer trained
            here; whatever the vocabulary says for a loaded BERT one).
        chat_template: a chat model's Jinja template (None for the others); see
            ``apply_chat_template``.
        chat_template_source: the file the template was read from, which a template that
            does not render is named by (None: made in Python).
    """

    kind: ClassVar[str]
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    chat_template: str | None = None
    chat_template_source: str | None = None

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""

    @abstractmethod
    def _encode(self, text: str) -> list[int]:
        """Text → ids, without BOS/EOS."""

    @abstractmethod
    def _decode(self, ids: list[int], skip_special: bool) -> str:
        """Ids → text; the framing ids are already removed when ``skip_special``."""

    @abstractmethod
    def id_to_token(self, token_id: int) -> str:
        """The token string of one id (for labelling plots and traces)."""

    @abstractmethod
    def to_json(self) -> str:
        """The contents of ``tokenizer.json``."""

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text → ids, optionally framed by BOS and EOS."""
        return self._frame(self._encode(text), add_bos, add_eos)

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """``encode`` for many texts (in parallel, for the `tokenizers`-backed ones)."""
        return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Ids (a list or a 1-D tensor) → text.

        With ``skip_special`` (the default), padding, BOS and EOS are dropped; an unknown id
        stays visible (``"\\ufffd"`` for characters, the unknown token for the others).
        With ``skip_special=False`` every special token is written out by name.

        Raises:
            ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"cannot decode id {bad[0]}: the vocabulary has ids 0..{self.vocab_size - 1}"
            )
        if skip_special:
            framing = {self.pad_id, self.bos_id, self.eos_id}
            ids = [i for i in ids if i not in framing]
        return self._decode(ids, skip_special)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        """A conversation as the text the model was trained on (see ``chat.render_chat``).

        Raises:
            ValueError: the tokenizer has no chat template, or a message is malformed.
        """
        from glassformer.data.tokenizers.chat import render_chat

        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template; it is not a chat model's")
        names = {"bos_token": self.bos_id, "eos_token": self.eos_id, "pad_token": self.pad_id}
        return render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens={name: self.id_to_token(i) for name, i in names.items()},
            source=self.chat_template_source,
        )

    def special_config(self) -> dict[str, Any]:
        """What ``tokenizer.json`` does not carry, as ``tokenizer_config.json`` fields (empty
        when nothing): only tokenizers loaded from elsewhere have any."""
        return {}

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically (a temporary file, then a rename), and beside
        it ``tokenizer_config.json`` when ``special_config`` has something to keep.

        Args:
            path: the file to write, or a directory (existing, or a path without a suffix)
                to write ``tokenizer.json`` into.

        Returns:
            The path of ``tokenizer.json``.
        """
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path = path / "tokenizer.json"
        make_folder(path.parent)
        config = self.special_config()
        beside = path.with_name(TOKENIZER_CONFIG)
        if config:  # first, so that no tokenizer.json is ever read without it
            write_atomic(beside, json.dumps(config, indent=2).encode("utf-8"))
        else:  # one left by an earlier tokenizer would be read with this one
            beside.unlink(missing_ok=True)
        write_atomic(path, self.to_json().encode("utf-8"))
        return path

    def _frame(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"
