"""The live page's carried parts: what its JavaScript needs to run the model on a typed text.

``tokenizer_spec(tokenizer)`` is the model's tokenizer as ``html/live-tokenize.js`` reads
it: a character vocabulary, or the parts of a ``tokenizers`` file that WordPiece (BERT's
normaliser and pre-tokeniser) and byte-level BPE (GPT-2's) use. A tokenizer built any other
way is refused in one line naming what the page cannot follow: the page must give the ids
Python gives, or say it cannot.
"""

from __future__ import annotations

import json
from typing import Any

from glassformer.data.tokenizers.base import CHAR_SPECIALS, UNK_ID
from glassformer.data.tokenizers.char import CharTokenizer


class LiveError(ValueError):
    """The model or its tokenizer is not one the live page can run."""


def tokenizer_spec(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer as the page's JavaScript reads it (see ``html/live-tokenize.js``)."""
    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", "chars": tokenizer.chars, "offset": len(CHAR_SPECIALS),
                "unk": UNK_ID, "lowercase": tokenizer.lowercase}  # fmt: skip
    kind = getattr(tokenizer, "kind", None)
    if kind not in ("wordpiece", "bpe"):
        name = kind or type(tokenizer).__name__
        raise LiveError(f"the live page tokenizes with char, WordPiece or byte-level BPE "
                        f"tokenizers; this one is {name!r}")  # fmt: skip
    spec = json.loads(tokenizer.to_json())
    model = spec.get("model") or {}
    vocab = model.get("vocab") or {}
    by_id = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise LiveError("the tokenizer's vocabulary does not number its tokens 0, 1, 2, ...")
    added = [_added(token) for token in spec.get("added_tokens") or []]
    if kind == "wordpiece":
        return {"type": "wordpiece", "vocab": by_id, "added": added, **_wordpiece(spec, model)}
    return {"type": "bpe", "vocab": by_id, "added": added, **_bpe(spec, model)}


def _added(token: dict[str, Any]) -> dict[str, Any]:
    """A special token the page finds in the raw text; the kinds it cannot follow refused."""
    flags = [f for f in ("normalized", "lstrip", "rstrip", "single_word") if token.get(f)]
    if flags:
        raise LiveError(f"the added token {token.get('content')!r} is {', '.join(flags)}: "
                        "the live page matches added tokens in the raw text only")  # fmt: skip
    return {"content": token["content"], "id": token["id"]}


def _wordpiece(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    normalizer, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    if normalizer.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
        raise LiveError(f"the live page follows WordPiece after BERT's normaliser and "
                        f"pre-tokeniser; this one has {normalizer.get('type')} and "
                        f"{pre.get('type')}")  # fmt: skip
    lowercase = bool(normalizer.get("lowercase"))
    strip = normalizer.get("strip_accents")
    return {"unk": model.get("unk_token", "[UNK]"),
            "prefix": model.get("continuing_subword_prefix", "##"),
            "maxChars": model.get("max_input_chars_per_word", 100), "lowercase": lowercase,
            "stripAccents": lowercase if strip is None else bool(strip),
            "cleanText": bool(normalizer.get("clean_text")),
            "chinese": bool(normalizer.get("handle_chinese_chars"))}  # fmt: skip


def _bpe(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    byte_level = pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
    if not byte_level or pre.get("use_regex") is False:
        raise LiveError(f"the live page follows GPT-2's byte-level BPE (its regex, no prefix "
                        f"space); this one pre-tokenizes with {pre}")  # fmt: skip
    if normalizer not in (None, {"type": "Lowercase"}):
        raise LiveError(f"the live page lower-cases or leaves the text; this BPE normalises "
                        f"with {normalizer.get('type')}")  # fmt: skip
    odd = [k for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix")
           if model.get(k)]  # fmt: skip
    if odd or model.get("byte_fallback"):
        raise LiveError(f"the live page's BPE has no {', '.join(odd) or 'byte fallback'}")
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model.get("merges", [])]
    return {"merges": merges, "unk": model.get("unk_token"), "lowercase": normalizer is not None,
            "ignoreMerges": bool(model.get("ignore_merges"))}  # fmt: skip
