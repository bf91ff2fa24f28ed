"""Tokenizers: characters (our own), byte-level BPE and WordPiece (through `tokenizers`).

All three share one small interface and fix the special ids the models expect:
pad = 0, bos = 1, eos = 2, unk = 3. Each saves to one file, ``tokenizer.json``, that is
stored with every checkpoint.

    tok = train_tokenizer("bpe", texts, vocab_size=8000)
    ids = tok.encode("Hello there", add_bos=True)   # [1, ...]
    tok.decode(ids)                                  # "Hello there"
    tok.save("run/tokenizer.json"); load_tokenizer("run")
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
KINDS = ("char", "bpe", "wordpiece")


class Tokenizer:
    """The interface every tokenizer here has."""

    kind: str
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text → ids, optionally framed by BOS/EOS."""
        ids = self._encode(text)
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def encode_batch(self, texts: Sequence[str], **kwargs: bool) -> list[list[int]]:
        return [self.encode(t, **kwargs) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Ids (a list or a 1-D tensor) → text; padding, BOS and EOS are dropped."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        if skip_special:
            special = {self.pad_id, self.bos_id, self.eos_id}
            ids = [i for i in ids if i not in special]
        return self._decode(ids)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` (``path`` is the file or its directory), atomically."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        fd, tmp = tempfile.mkstemp(prefix=".tokenizer.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)
        return path

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """One id per character seen in training; others become ``<unk>``."""

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars = sorted(set(chars))
        self._id = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        if not chars:
            raise ValueError("cannot train a tokenizer on empty text")
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def _encode(self, text: str) -> list[int]:
        get = self._id.get
        return [get(c, UNK_ID) for c in text]

    def _decode(self, ids: list[int]) -> str:
        n = len(SPECIALS)
        return "".join(self.chars[i - n] if i >= n else "\ufffd" for i in ids)

    def to_json(self) -> str:
        return json.dumps({"type": "glassformer-char", "version": 1, "chars": self.chars})


class HFTokenizer(Tokenizer):
    """A tokenizer from the `tokenizers` library (byte-level BPE or WordPiece)."""

    def __init__(self, tokenizer: Any, kind: str) -> None:
        self.tk = tokenizer
        self.kind = kind
        ids = {name: tokenizer.token_to_id(name) for name in _special_names(kind)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (
            ids[n] if ids[n] is not None else default
            for n, default in zip(
                _special_names(kind), (PAD_ID, BOS_ID, EOS_ID, UNK_ID), strict=True
            )
        )

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    def _encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], **kwargs: bool) -> list[list[int]]:
        encodings = self.tk.encode_batch(list(texts), add_special_tokens=False)
        bos, eos = kwargs.get("add_bos", False), kwargs.get("add_eos", False)
        return [[self.bos_id] * bos + e.ids + [self.eos_id] * eos for e in encodings]

    def _decode(self, ids: list[int]) -> str:
        return self.tk.decode(ids, skip_special_tokens=False)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        return self.tk.decode(ids, skip_special_tokens=skip_special)

    def to_json(self) -> str:
        return self.tk.to_str()


def _special_names(kind: str) -> tuple[str, str, str, str]:
    if kind == "wordpiece":
        return ("[PAD]", "[CLS]", "[SEP]", "[UNK]")
    return SPECIALS


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ValueError(
            "BPE and WordPiece need the `tokenizers` package: pip install 'glassformer[data]'"
        ) from None
    return tokenizers


def _train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    tk = _require_tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return HFTokenizer(tokenizer, "bpe")


def _train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool) -> HFTokenizer:
    tk = _require_tokenizers()
    tokenizer = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = tk.normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tk.decoders.WordPiece()
    trainer = tk.trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=[*_special_names("wordpiece"), "[MASK]"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return HFTokenizer(tokenizer, "wordpiece")


def train_tokenizer(
    kind: str, texts: Iterable[str], *, vocab_size: int | None = None, lowercase: bool = False
) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("char", "bpe", "wordpiece") on ``texts``.

    ``vocab_size`` applies to BPE and WordPiece (default 8000); a character vocabulary is
    whatever characters occur. ``lowercase`` applies to WordPiece.
    """
    if kind not in KINDS:
        raise ValueError(f"tokenizer must be one of {list(KINDS)}, got {kind!r}")
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("cannot train a tokenizer on empty text")
    if kind == "char":
        return CharTokenizer.train(texts)
    size = vocab_size or 8000
    if size <= len(SPECIALS) + 1:
        raise ValueError(f"vocab_size must be larger than {len(SPECIALS) + 1}, got {size}")
    if kind == "bpe":
        return _train_bpe(texts, size)
    return _train_wordpiece(texts, size, lowercase)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a ``tokenizer.json`` (glassformer's, or a `tokenizers` BPE/WordPiece one), a
    BERT ``vocab.txt``, or a directory holding one of them."""
    path = Path(path)
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                return load_tokenizer(path / name)
        raise ValueError(f"{path} holds no tokenizer.json or vocab.txt")
    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist")
    if path.name.endswith(".txt"):
        return _wordpiece_from_vocab(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a tokenizer file: {e}") from None
    if isinstance(spec, dict) and spec.get("type") == "glassformer-char":
        return CharTokenizer(spec["chars"])
    model_type = spec.get("model", {}).get("type") if isinstance(spec, dict) else None
    if model_type not in ("BPE", "WordPiece"):
        raise ValueError(f"{path} is not a tokenizer glassformer can read (model {model_type!r})")
    tk = _require_tokenizers()
    return HFTokenizer(
        tk.Tokenizer.from_file(str(path)), "bpe" if model_type == "BPE" else "wordpiece"
    )


def _wordpiece_from_vocab(path: Path) -> HFTokenizer:
    """A BERT tokenizer from its ``vocab.txt`` (one token per line, line number = id)."""
    tk = _require_tokenizers()
    vocab = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        vocab.setdefault(line.strip(), i)
    if "[UNK]" not in vocab:
        raise ValueError(f"{path} is not a BERT vocab.txt: it has no [UNK] token")
    tokenizer = tk.Tokenizer(tk.models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tk.decoders.WordPiece()
    return HFTokenizer(tokenizer, "wordpiece")
