"""Byte-level BPE and WordPiece: subword tokenizers whose work the `tokenizers` library does.

That library is optional (``pip install 'glassformer[data]'``) and imported only when one of
them is trained or loaded (``require_tokenizers``); without it they raise
``MissingDependencyError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from glassformer.data.tokenizers.base import (
    BOS_ID,
    BPE_SPECIALS,
    DEFAULT_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    WORDPIECE_SPECIALS,
    Tokenizer,
)
from glassformer.errors import MissingDependencyError
from glassformer.jsonfile import read_text


class _TokenizersBacked(Tokenizer):
    """A tokenizer whose work the `tokenizers` library does; ``backend`` is its Tokenizer.

    The special ids are looked up by name in the vocabulary (``_SPECIAL_NAMES``: candidate
    names for pad, bos, eos, unk, in order of preference).
    """

    _SPECIAL_NAMES: ClassVar[tuple[tuple[str, ...], ...]]

    def __init__(self, backend: Any) -> None:
        # glassformer frames, cuts and pads sequences itself: drop any truncation or
        # padding a loaded tokenizer.json asks for (a Hugging Face one may pad to 128).
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        # The largest id + 1, not the token count: a vocab.txt may skip a blank line.
        self._vocab_size = max(backend.get_vocab(with_added_tokens=True).values()) + 1
        found = [_first_id(backend, names) for names in self._SPECIAL_NAMES]
        pad, bos, eos, unk = found
        # A vocabulary without some of them (GPT-2 has only <|endoftext|>) borrows EOS,
        # as Hugging Face does; one with none of them keeps the fixed ids.
        eos = eos if eos is not None else bos
        fallback = eos if eos is not None else None
        self.pad_id = _pick(pad, fallback, PAD_ID)
        self.bos_id = _pick(bos, fallback, BOS_ID)
        self.eos_id = _pick(eos, fallback, EOS_ID)
        self.unk_id = _pick(unk, fallback, UNK_ID)
        self._named_ids = self._special_ids()

    def _special_ids(self) -> dict[str, int]:
        return {
            "pad_token": self.pad_id,
            "bos_token": self.bos_id,
            "eos_token": self.eos_id,
            "unk_token": self.unk_id,
        }

    def special_config(self) -> dict[str, Any]:
        """The special tokens that are not the ones their names give, and the chat template."""
        config: dict[str, Any] = {
            field: self.id_to_token(token_id)
            for field, token_id in self._special_ids().items()
            if token_id != self._named_ids[field]
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    def configure(self, config: dict[str, Any], source: Path) -> None:
        """Take the special tokens and chat template of a ``tokenizer_config.json``.

        A token is a string or ``{"content": string}``; one named but not in the vocabulary
        is an error. A ``chat_template`` is a string, or a list of ``{"name", "template"}``
        of which the one named ``"default"`` is taken.
        """
        for field in ("pad_token", "bos_token", "eos_token", "unk_token"):
            token = config.get(field)
            if isinstance(token, dict):
                token = token.get("content")
            if token is None:
                continue
            token_id = self.backend.token_to_id(token) if isinstance(token, str) else None
            if token_id is None:
                raise ValueError(f"{source}: {field} {token!r} is not in the vocabulary")
            setattr(self, field.replace("_token", "_id"), token_id)
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{source}: chat_template must be a string, got {template!r}")
        if template is not None:
            self.chat_template = template

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def _encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [self._frame(e.ids, add_bos, add_eos) for e in encodings]

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id)

    def to_json(self) -> str:
        return self.backend.to_str()


class BPETokenizer(_TokenizersBacked):
    """Byte-level BPE (GPT-2's scheme): any text round-trips exactly."""

    kind = "bpe"
    _SPECIAL_NAMES = (
        ("<pad>", "<|pad|>", "[PAD]"),
        ("<bos>", "<s>", "<|startoftext|>"),
        ("<eos>", "</s>", "<|endoftext|>"),
        ("<unk>", "[UNK]"),
    )

    @classmethod
    def train(
        cls, texts: Iterable[str], *, vocab_size: int = DEFAULT_VOCAB_SIZE, lowercase: bool = False
    ) -> BPETokenizer:
        """Learn merges on ``texts``; the 256 byte tokens are always in the vocabulary, so
        the vocabulary has at least 260 entries whatever ``vocab_size`` asks for."""
        tk = require_tokenizers()
        backend = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
        if lowercase:
            backend.normalizer = tk.normalizers.Lowercase()
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(BPE_SPECIALS),
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        backend.train_from_iterator(texts, trainer)
        return cls(backend)


class WordPieceTokenizer(_TokenizersBacked):
    """BERT's WordPiece: words split on spaces and punctuation, then into ``##`` pieces.

    Decoding joins pieces and tidies spaces before punctuation, so it round-trips text up
    to whitespace (and case and accents, when lower-casing).
    """

    kind = "wordpiece"
    _SPECIAL_NAMES = (("[PAD]",), ("[BOS]", "[CLS]"), ("[EOS]", "[SEP]"), ("[UNK]",))

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.mask_id: int | None = backend.token_to_id("[MASK]")

    @classmethod
    def train(
        cls, texts: Iterable[str], *, vocab_size: int = DEFAULT_VOCAB_SIZE, lowercase: bool = False
    ) -> WordPieceTokenizer:
        """Learn a vocabulary on ``texts``; ``lowercase`` also strips accents (BERT uncased)."""
        tk = require_tokenizers()
        backend = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
        backend.normalizer = tk.normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        backend.decoder = tk.decoders.WordPiece()
        trainer = tk.trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIALS), show_progress=False
        )
        backend.train_from_iterator(texts, trainer)
        return cls(backend)

    @classmethod
    def from_vocab(cls, path: str | Path) -> WordPieceTokenizer:
        """A BERT tokenizer from its ``vocab.txt`` (one token a line; line number = id).

        The vocabulary is taken as uncased (lower-case and strip accents) unless it holds
        upper-case word pieces, as cased BERT vocabularies do.
        """
        path = Path(path)
        tk = require_tokenizers()
        vocab: dict[str, int] = {}
        for i, line in enumerate(read_utf8_lines(path)):
            vocab.setdefault(line.strip(), i)
        vocab.pop("", None)
        if "[UNK]" not in vocab:
            raise ValueError(f"{path} is not a BERT vocab.txt: it has no [UNK] token")
        cased = any(t.lower() != t for t in vocab if not t.startswith("["))
        backend = tk.Tokenizer(tk.models.WordPiece(vocab, unk_token="[UNK]"))
        backend.normalizer = tk.normalizers.BertNormalizer(lowercase=not cased)
        backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        backend.decoder = tk.decoders.WordPiece()
        backend.add_special_tokens([t for t in (*WORDPIECE_SPECIALS,) if t in vocab])
        return cls(backend)


def require_tokenizers() -> Any:
    """The `tokenizers` library (the top-level package, imported now).

    Raises:
        MissingDependencyError: it is not installed.
    """
    try:
        import tokenizers  # absolute: the library, not this package, glassformer.data.tokenizers
    except ImportError:
        raise MissingDependencyError(
            "BPE and WordPiece tokenizers need the `tokenizers` package: "
            "pip install 'glassformer[data]'"
        ) from None
    return tokenizers


MAX_VOCAB_BYTES = 1 << 26  # BERT's vocab.txt is 232 kB; the largest WordPiece vocabularies a few MB


def read_utf8_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file of at most ``MAX_VOCAB_BYTES``, read without blocking
    (a FIFO would wait, ``/dev/zero`` never end); one ``ValueError`` naming it otherwise."""
    return read_text(path, "a vocabulary file", MAX_VOCAB_BYTES).splitlines()


def _first_id(backend: Any, names: Sequence[str]) -> int | None:
    for name in names:
        token_id = backend.token_to_id(name)
        if token_id is not None:
            return token_id
    return None


def _pick(found: int | None, fallback: int | None, default: int) -> int:
    if found is not None:
        return found
    return fallback if fallback is not None else default
