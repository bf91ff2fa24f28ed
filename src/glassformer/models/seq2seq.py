"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

src (B, S) → encoder → memory (B, S, D)
tgt (B, T) → decoder (masked self-attention, cross-attention to memory) → (B, T, V)

The encoder and the decoder are each a ``Backbone`` (their embeddings, blocks and final
norm), built by ``models.parts.translator``; their activations are named as a one-stack
model's, under ``encoder.`` and ``decoder.`` (``decoder.blocks.0.cross_attn.hook_pattern``).

Training is teacher forcing: the decoder reads the target shifted right (starting with
``bos_id``) and is scored on the target shifted left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from glassformer.generation import GenerationConfig, seq2seq_generate
from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import (
    ModelConfig,
    ModelOutput,
    PretrainedModel,
)
from glassformer.models.common import cross_entropy
from glassformer.models.families import legacy
from glassformer.models.families.translator import TranslatorConfig, check_vocabularies
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block, StackOutput
from glassformer.modules.cache import DecoderCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.sdpa import key_mask


@dataclass(kw_only=True)
class Seq2SeqConfig(ModelConfig):
    """Configuration of ``Seq2SeqTransformer``; the defaults are the paper's base model.

    ``share_embeddings`` makes source and target one embedding matrix (needs equal
    vocabularies); ``tie_output`` makes the output projection reuse the target embedding.

    ``norm`` ("layer" or "rms") with ``layer_norm_eps`` and ``bias=False`` (no biases in
    the linear layers or norms) name other parts. The pretrained translators (T5, Marian)
    have configs of their own in ``models/families/``; ``Seq2SeqTransformer`` runs any of
    them, and ``from_dict`` reads a saved one back by its ``family``.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    max_len: int = 5000
    scale_embeddings: bool = True
    share_embeddings: bool = False
    tie_output: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    family: ClassVar[str] = "translator"

    PRESETS: ClassVar[dict] = {
        "tiny": dict(d_model=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=256),
        "small": dict(
            d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, d_ff=1024
        ),
        "base": dict(),  # the paper's base model
    }

    def __post_init__(self) -> None:
        self._check()
        check_vocabularies(self)

    def parts(self, side: str) -> dict[str, Any]:
        """The keyword arguments of the ``side`` ``Backbone`` (``models.parts.translator``)."""
        return parts.translator(self, side)

    @property
    def output_scale(self) -> float | None:
        return None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Any:
        """The config ``values`` describe: this class's, or (``"family"`` "t5", "marian")
        that family's; a T5 saved before the families had files of their own (its parts as
        this config's fields) as a T5."""
        family = values.get("family", "translator")
        if family != "translator":
            return TranslatorConfig.from_dict(values)
        upgraded = legacy.upgrade_translator({k: v for k, v in values.items() if k != "family"})
        if isinstance(upgraded, TranslatorConfig):
            return upgraded
        return super().from_dict(upgraded)


class Seq2SeqTransformer(PretrainedModel):
    """Encoder-decoder Transformer for translation and other sequence-to-sequence tasks."""

    kind = "seq2seq"
    config_class = Seq2SeqConfig

    def __init__(self, config: Seq2SeqConfig | TranslatorConfig) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = Backbone(c, **c.parts("encoder"))
        self.decoder = Backbone(c, **c.parts("decoder"))
        self.output_scale = c.output_scale  # T5's tied head reads the states × d_model^-½
        self.output_proj = nn.Linear(c.d_model, c.tgt_vocab_size)
        self.hook_logits = HookPoint()  # (B, T, V)
        self._init_weights()
        source: Any = self.encoder.embed  # TokenEmbeddings: their tables are ``weight``
        target: Any = self.decoder.embed
        if c.share_embeddings:
            target.weight = source.weight
        if c.tie_output:
            self.output_proj.weight = target.weight

    def _init_weights(self) -> None:
        """Xavier-uniform for every matrix, as in the reference implementations."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> StackOutput:
        """src (B, S) → StackOutput(hidden=memory (B, S, D), self_attn_weights)."""
        return self.encoder(src, src_mask, need_weights=need_weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> StackOutput:
        """tgt (B, T), memory (B, S, D) → StackOutput(hidden (B, T, D), self, cross weights).

        ``tgt_mask`` restricts the decoder's self-attention on top of causality (usually
        the target padding mask (B, 1, 1, T)); ``src_mask`` masks padded source keys.
        With a ``cache`` from ``new_cache()``, ``tgt`` continues the tokens already decoded
        (their keys and values, and the memory's, are not computed again).
        """
        return self.decoder(
            tgt, tgt_mask, memory=memory, memory_mask=src_mask, need_weights=need_weights,
            cache=cache,
        )  # fmt: skip

    def unembed(self, hidden: Tensor) -> Tensor:
        """The decoder's final states (…, D) → logits (…, V): the output projection, after
        scaling the states by d_model^-½ where the config says (T5's tied head)."""
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return self.output_proj(hidden)

    def new_cache(self) -> DecoderCache:
        """An empty decoder cache (self- and cross-attention) for ``decode(..., cache=)``."""
        attn = cast(MultiHeadAttention, cast(Block, self.decoder.blocks[0]).attn)
        return DecoderCache(
            len(self.decoder.blocks),
            cross_attention=True,
            window=None if attn.window is None else attn.window[0],
            global_tokens=attn.global_tokens,
        )

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        labels: Tensor | None = None,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """Teacher-forced forward pass.

        Args:
            src: source ids (B, S).
            tgt: decoder input ids (B, T), starting with ``bos_id``.
            labels: the ids each position should predict (B, T); ``pad_id`` is ignored.
            src_mask: the source key mask (B, 1, 1, S), True = real token; built from
                ``pad_id`` when None (and no 1/0 mask below is given). It also masks the
                cross-attention keys.
            tgt_mask: the target key mask (B, 1, 1, T), likewise.
            attention_mask: Hugging Face's source mask (B, S) of 1 (real token) / 0
                (padding), instead of ``src_mask``.
            decoder_attention_mask: Hugging Face's target mask (B, T) of 1/0, instead of
                ``tgt_mask``; causality is applied on top.
            need_weights: return encoder, decoder and cross-attention weights.
        """
        pad = self.config.pad_id
        src_mask = key_mask(
            src, pad, src_mask, attention_mask, names=("src_mask", "attention_mask")
        )
        tgt_mask = key_mask(
            tgt, pad, tgt_mask, decoder_attention_mask, names=("tgt_mask", "decoder_attention_mask")
        )
        if tgt_mask is not None and self.config.bos_id == pad:  # Marian starts with the pad id
            tgt_mask = tgt_mask.clone()
            tgt_mask[..., 0] = True  # the first target token is the start, never padding
        memory, enc_w, _ = self.encode(src, src_mask, need_weights=need_weights)
        hidden, dec_w, cross_w = self.decode(
            tgt, memory, src_mask, tgt_mask, need_weights=need_weights
        )
        logits = self.hook_logits(self.unembed(hidden))  # (B, T, V)
        loss = None if labels is None else cross_entropy(logits, labels, pad)
        return ModelOutput(logits, loss, enc_w, dec_w, cross_w)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        max_new_tokens: int,
        *,
        generation_config: GenerationConfig | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """Translate ``src`` (B, S); returns target ids (B, T) starting with ``bos_id``.

        The options come as a ``GenerationConfig`` and/or keywords that override its
        fields (``beam_size=4``, ``length_penalty=0.6``, ...), beside the per-call
        ``src_mask``, ``generator`` and ``streamer``. See
        ``glassformer.generation.seq2seq_generate``.
        """
        return seq2seq_generate(
            self, src, max_new_tokens, generation_config=generation_config, **kwargs
        )
