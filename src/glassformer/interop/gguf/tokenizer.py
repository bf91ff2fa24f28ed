"""The tokenizer a GGUF file describes, rebuilt with `tokenizers`: byte-level BPE from
``tokenizer.ggml.tokens`` and ``tokenizer.ggml.merges``, split the way
``tokenizer.ggml.pre`` names, with the special ids and chat template the file gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from glassformer.data.tokenizers import BPETokenizer
from glassformer.data.tokenizers.subword import require_tokenizers
from glassformer.errors import CheckpointError, one_line, shown
from glassformer.interop.gguf.metadata import Metadata

# llama.cpp's token types (llama_token_type): control tokens such as <|im_start|> are
# matched whole and are special; user-defined ones are matched whole but are text.
CONTROL, USER_DEFINED = 3, 4


class GGUFTokenizer(BPETokenizer):
    """A byte-level BPE tokenizer whose special ids and chat template come from a GGUF file.

    Attributes:
        chat_template: the Jinja template ``tokenizer.chat_template`` (None if the file has
            none), for formatting a conversation as the model was trained to see it.
    """

    def __init__(
        self, backend: Any, *, special_ids: dict[str, int | None], chat_template: str | None
    ):
        super().__init__(backend)
        for name, token_id in special_ids.items():
            if token_id is not None:
                if not 0 <= token_id < self.vocab_size:
                    raise CheckpointError(f"{name} {token_id} is outside the vocabulary")
                setattr(self, name, token_id)
        self.chat_template = chat_template


def _gpt2_split(tk: Any) -> Any:
    """GPT-2's regex, then bytes → printable characters."""
    return tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_split(tk: Any) -> Any:
    """SmolLM's: every digit on its own (llama.cpp's ``\\p{N}``), then GPT-2's."""
    return tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), _gpt2_split(tk)]
    )


# tokenizer.ggml.pre → the pre-tokenizer llama.cpp applies for it (llama-vocab.cpp).
PRE_TOKENIZERS: dict[str, Callable[[Any], Any]] = {
    "default": _gpt2_split,
    "gpt-2": _gpt2_split,
    "smollm": _smollm_split,
}


def build_tokenizer(meta: Metadata) -> GGUFTokenizer:
    """The tokenizer from a GGUF file's ``tokenizer.*`` metadata. Its lists hold no more
    items than their bytes in the file allow (``read_header`` checked each length).

    Raises:
        CheckpointError: a tokenizer model or pre-tokenizer this does not rebuild, or
            tokens and merges that do not make a BPE vocabulary.
    """
    model = meta("tokenizer.ggml.model", str, ...)
    if model != "gpt2":
        raise CheckpointError(
            f"tokenizer model {shown(model)} is not supported; glassformer reads byte-level BPE "
            "('gpt2')"
        )
    pre = meta("tokenizer.ggml.pre", str, "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"pre-tokenizer {shown(pre)} is not supported; glassformer knows "
            f"{sorted(PRE_TOKENIZERS)}"
        )
    tokens: list[str] = meta.strings("tokenizer.ggml.tokens", ...)
    if not tokens:
        raise CheckpointError("tokenizer.ggml.tokens is empty")
    merges: list[str] = meta.strings("tokenizer.ggml.merges", [])
    types: list[int] = meta("tokenizer.ggml.token_type", list, [])
    if not all(isinstance(t, int) for t in types):
        raise CheckpointError("tokenizer.ggml.token_type is not an array of integers")
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    pairs = [tuple(m.split(" ")) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise CheckpointError("tokenizer.ggml.merges holds an entry that is not two tokens")
    tk = require_tokenizers()
    try:
        bpe = tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # the library raises a bare Exception
        raise CheckpointError(  # the library's message may be lines long and quote a token
            f"the GGUF tokens and merges are not a BPE vocabulary: {one_line(e, 300)}"
        ) from None
    backend = tk.Tokenizer(bpe)
    backend.pre_tokenizer = PRE_TOKENIZERS[pre](tk)
    backend.decoder = tk.decoders.ByteLevel()
    whole = [
        (tokens[i], t) for i, t in enumerate(types[: len(tokens)]) if t in (CONTROL, USER_DEFINED)
    ]
    backend.add_special_tokens(
        [tk.AddedToken(tok, special=True, normalized=False) for tok, t in whole if t == CONTROL]
    )
    backend.add_tokens(
        [
            tk.AddedToken(tok, special=False, normalized=False)
            for tok, t in whole
            if t == USER_DEFINED
        ]
    )
    tokenizer = GGUFTokenizer(
        backend,
        special_ids={
            "bos_id": meta("tokenizer.ggml.bos_token_id", int, None),
            "eos_id": meta("tokenizer.ggml.eos_token_id", int, None),
            "pad_id": meta("tokenizer.ggml.padding_token_id", int, None),
            "unk_id": meta("tokenizer.ggml.unknown_token_id", int, None),
        },
        chat_template=meta("tokenizer.chat_template", str, None),
    )
    tokenizer.chat_template_source = f"{meta.path} (tokenizer.chat_template)"
    return tokenizer
