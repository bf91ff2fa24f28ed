"""Making a tokenizer: ``train_tokenizer`` trains one of a kind (``KINDS``) on text;
``load_tokenizer`` reads one from a ``tokenizer.json`` or a BERT ``vocab.txt``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from glassformer.data.tokenizers.base import (
    DEFAULT_VOCAB_SIZE,
    TOKENIZER_CONFIG,
    WORDPIECE_SPECIALS,
    Tokenizer,
)
from glassformer.data.tokenizers.char import CharTokenizer
from glassformer.data.tokenizers.subword import (
    BPETokenizer,
    WordPieceTokenizer,
    _TokenizersBacked,
    require_tokenizers,
)
from glassformer.errors import shown
from glassformer.jsonfile import parse_json, read_json, read_text

KINDS = ("char", "bpe", "wordpiece")
CHAT_TEMPLATE_FILE = "chat_template.jinja"
MAX_CONFIG_BYTES = 1 << 26  # 64 MiB: a tokenizer_config.json listing every token is ~2 MB

_TRAINERS: dict[str, Any] = {
    "char": CharTokenizer,
    "bpe": BPETokenizer,
    "wordpiece": WordPieceTokenizer,
}


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
            WordPiece one, such as a Hugging Face BERT, GPT-2 or Llama ``tokenizer.json``), a
            BERT ``vocab.txt``, or a directory holding one of them. The special tokens and
            chat template of a ``tokenizer_config.json`` beside it are taken too.

    Raises:
        ValueError: no such file, or one glassformer cannot read (the message names it).
    """
    path = Path(path)
    if path.is_dir() and (path / "source.spm").is_file():  # a Marian translator's
        from glassformer.data.tokenizers.marian import MarianTokenizer

        return MarianTokenizer(path)
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                return load_tokenizer(path / name)
        raise ValueError(f"{path} holds no tokenizer.json or vocab.txt")
    if not path.is_file():  # a FIFO is not read: it would wait forever
        problem = "is not a regular file" if path.exists() else "does not exist"
        raise ValueError(f"tokenizer file {path} {problem}")
    tokenizer = _load_file(path)
    if isinstance(tokenizer, _TokenizersBacked):
        _configure(tokenizer, path.parent)
    return tokenizer


def _configure(tokenizer: _TokenizersBacked, folder: Path) -> None:
    """Apply the ``tokenizer_config.json`` (and ``chat_template.jinja``) beside the file."""
    config_file = folder / TOKENIZER_CONFIG
    config: Any = {}
    if config_file.is_file():
        config = read_json(config_file, "a tokenizer config", MAX_CONFIG_BYTES)
        if not isinstance(config, dict):
            raise ValueError(f"{config_file} is not a tokenizer config: expected a JSON object")
    template_file = folder / CHAT_TEMPLATE_FILE
    apart = template_file.is_file()  # newer Hugging Face directories keep it apart
    if apart:
        text = read_text(template_file, "a chat template", MAX_CONFIG_BYTES)
        config = {**config, "chat_template": "\n".join(text.splitlines())}
    tokenizer.configure(config, config_file)
    if tokenizer.chat_template is not None:  # named when it does not render
        tokenizer.chat_template_source = str(template_file if apart else config_file)


def _load_file(path: Path) -> Tokenizer:
    if path.suffix == ".txt":
        return WordPieceTokenizer.from_vocab(path)
    text = read_text(path, "a tokenizer file")
    spec = parse_json(path, text, "a tokenizer file")
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
    tk = require_tokenizers()
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
    for i, char in enumerate(chars):
        if not isinstance(char, str) or len(char) != 1:
            raise ValueError(f"{path}: chars[{i}] is {shown(char)}, expected one character")
    lowercase = spec.get("lowercase", False)
    if not isinstance(lowercase, bool):
        raise ValueError(f"{path}: lowercase is {shown(lowercase)}, expected true or false")
    return CharTokenizer(chars, lowercase=lowercase)
