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
"""

from __future__ import annotations

import json
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

KINDS = ("char", "bpe", "wordpiece")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
DEFAULT_VOCAB_SIZE = 8000

# Special tokens in id order (pad, bos, eos, unk), then extras.
CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
BPE_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
WORDPIECE_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")


class MissingDependencyError(ImportError, ValueError):
    """An optional package is not installed (a ValueError too, so the CLI prints one line)."""


class Tokenizer(ABC):
    """The interface every tokenizer here has.

    Attributes:
        kind: ``"char"``, ``"bpe"`` or ``"wordpiece"``.
        pad_id, bos_id, eos_id, unk_id: the special ids (0, 1, 2, 3 for a tokenizer trained
            here; whatever the vocabulary says for a loaded BERT one).
    """

    kind: ClassVar[str]
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

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

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically (a temporary file, then a rename).

        Args:
            path: the file to write, or a directory (existing, or a path without a suffix)
                to write ``tokenizer.json`` into.

        Returns:
            The path of the file written.
        """
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path = path / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tokenizer.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def _frame(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """One id per character seen in training (after the four specials); others → unk.

    Args:
        chars: the vocabulary's characters (sorted and de-duplicated here).
        lowercase: lower-case text before encoding.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], *, lowercase: bool = False) -> None:
        self.chars = sorted(set(chars))
        bad = [c for c in self.chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"a character vocabulary holds single characters, got {bad[0]!r}")
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
        tk = _require_tokenizers()
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
        tk = _require_tokenizers()
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
        tk = _require_tokenizers()
        vocab: dict[str, int] = {}
        for i, line in enumerate(_read_utf8_lines(path)):
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


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise MissingDependencyError(
            "BPE and WordPiece tokenizers need the `tokenizers` package: "
            "pip install 'glassformer[data]'"
        ) from None
    return tokenizers


def _read_utf8_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None


_TRAINERS = {"char": CharTokenizer, "bpe": BPETokenizer, "wordpiece": WordPieceTokenizer}


def train_tokenizer(
    kind: str, texts: Iterable[str], *, vocab_size: int | None = None, lowercase: bool = False
) -> Tokenizer:
    """Train a tokenizer on ``texts``.

    Args:
        kind: ``"char"``, ``"bpe"`` or ``"wordpiece"``.
        texts: the training text, as any number of strings.
        vocab_size: for BPE and WordPiece (default 8000); a character vocabulary is whatever
            characters occur, so it ignores this.
        lowercase: lower-case all text first (WordPiece also strips accents).

    Raises:
        ValueError: an unknown kind, a vocabulary too small for the special tokens, or
            no text.
        MissingDependencyError: BPE/WordPiece without the ``tokenizers`` package.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {list(KINDS)}")
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    if isinstance(size, bool) or not isinstance(size, int) or size <= len(WORDPIECE_SPECIALS):
        raise ValueError(
            f"vocab_size must be an integer above {len(WORDPIECE_SPECIALS)}, got {vocab_size!r}"
        )
    if isinstance(texts, str):
        texts = [texts]
    texts = [t for t in texts if t]
    if all(t.isspace() for t in texts):
        raise ValueError("cannot train a tokenizer on empty text")
    if kind == "char":
        return CharTokenizer.train(texts, lowercase=lowercase)
    return _TRAINERS[kind].train(texts, vocab_size=size, lowercase=lowercase)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer.

    Args:
        path: a ``tokenizer.json`` (glassformer's character one, or a `tokenizers` BPE or
            WordPiece one, such as a Hugging Face BERT or GPT-2 ``tokenizer.json``), a BERT
            ``vocab.txt``, or a directory holding one of them.

    Raises:
        ValueError: no such file, or one glassformer cannot read (the message names it).
    """
    path = Path(path)
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                return load_tokenizer(path / name)
        raise ValueError(f"{path} holds no tokenizer.json or vocab.txt")
    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist")
    if path.suffix == ".txt":
        return WordPieceTokenizer.from_vocab(path)
    text = "\n".join(_read_utf8_lines(path))
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a tokenizer file: invalid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path} is not a tokenizer file: expected a JSON object")
    if spec.get("type") == "glassformer-char":
        return _char_from_spec(path, spec)
    model = spec.get("model")
    model_type = model.get("type") if isinstance(model, dict) else None
    classes = {"BPE": BPETokenizer, "WordPiece": WordPieceTokenizer}
    if model_type not in classes:
        raise ValueError(
            f"{path} is not a tokenizer glassformer can read: model type {model_type!r}; "
            "readable: glassformer-char, BPE, WordPiece"
        )
    tk = _require_tokenizers()
    try:
        backend = tk.Tokenizer.from_str(text)
    except Exception as e:  # the library raises a bare Exception
        raise ValueError(f"{path} is not a tokenizer glassformer can read: {e}") from None
    return classes[model_type](backend)


def _char_from_spec(path: Path, spec: dict[str, Any]) -> CharTokenizer:
    version = spec.get("version")
    if version != 1:
        raise ValueError(f"{path}: character tokenizer version {version!r}; this reads version 1")
    chars = spec.get("chars")
    if not isinstance(chars, list) or not chars:
        raise ValueError(f"{path}: a character tokenizer needs a non-empty list 'chars'")
    return CharTokenizer(chars, lowercase=bool(spec.get("lowercase", False)))
