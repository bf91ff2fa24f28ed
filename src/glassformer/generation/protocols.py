"""What decoding needs of a model, said as ``typing.Protocol``s: the generation room sits
below ``models/`` and cannot name ``GPT``, so it names what it reads of one instead.

    CausalLM     a decoder-only language model (``GPT``): its config, blocks, token table,
                 a forward taking a cache, and a fresh cache
    Seq2SeqLM    an encoder-decoder (``Seq2SeqTransformer``): encode once, decode step by step
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor, nn

from glassformer.modules.cache import DecoderCache


class CausalLM(Protocol):
    """A decoder-only language model, as decoding uses it (``GPT`` is one)."""

    @property
    def config(self) -> Any: ...  # its dataclass config: vocab_size, max_len, pad_id, ...

    @property
    def blocks(self) -> nn.ModuleList: ...  # each with its ``attn``

    @property
    def embed(self) -> nn.Module: ...  # the token table

    @property
    def num_layers(self) -> int: ...

    training: bool

    def __call__(self, ids: Tensor, *args: Any, **kwargs: Any) -> Any: ...  # → .logits

    def new_cache(self) -> DecoderCache: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


class Seq2SeqLM(Protocol):
    """An encoder-decoder, as translation and beam search use it (``Seq2SeqTransformer``)."""

    @property
    def config(self) -> Any: ...  # bos_id, eos_id, pad_id, max_len, ...

    training: bool

    def encode(self, src: Tensor, *args: Any, **kwargs: Any) -> Any: ...

    def decode(self, tgt: Tensor, *args: Any, **kwargs: Any) -> Any: ...

    def unembed(self, hidden: Tensor) -> Tensor: ...

    def new_cache(self) -> DecoderCache: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...
