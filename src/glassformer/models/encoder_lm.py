"""An encoder with a vocabulary head: a per-token language model (BERT-like, bidirectional).

ids (B, T) → token + position embeddings → encoder layers → Linear(D, V) → (B, T, V).
Trained as a masked language model: labels mark the positions to predict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import ModelConfig, ModelOutput, Positional
from glassformer.models.common import cross_entropy
from glassformer.modules.hooks import HookPoint
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.sdpa import key_mask


@dataclass(kw_only=True)
class EncoderLMConfig(ModelConfig):
    """Configuration of ``EncoderLM``; the defaults are the source material's model
    (vocabulary 10,000, width 128, 4 heads, 2 layers, FF 256, 500 learned positions)."""

    vocab_size: int = 10000
    max_len: int = 500
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    positional: Positional = "learned"
    tie_weights: bool = False

    PRESETS: ClassVar[dict] = {
        "tiny": dict(d_model=64, num_heads=4, num_layers=2, d_ff=256),
        "small": dict(d_model=128, num_heads=4, num_layers=2, d_ff=256),
        "base": dict(d_model=256, num_heads=8, num_layers=6, d_ff=1024),
    }

    def __post_init__(self) -> None:
        self._check()


class EncoderLM(Backbone):
    """Bidirectional encoder that predicts a token at every position."""

    kind = "encoder_lm"
    config_class = EncoderLMConfig
    config: EncoderLMConfig
    embed: TokenEmbedding
    HEADS = ("lm_head",)

    def __init__(self, config: EncoderLMConfig) -> None:
        super().__init__(config, **parts.encoder_only(config))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)
        self.hook_logits = HookPoint()  # (B, T, V)
        if config.tie_weights:
            self.lm_head.weight = self.embed.weight

    def forward(  # type: ignore[override]
        self,
        ids: Tensor,
        *,
        labels: Tensor | None = None,
        mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
        labelled_only: bool = False,
    ) -> ModelOutput:
        """Vocabulary logits at every position.

        Args:
            ids: token ids (B, T), possibly with some replaced by a mask token.
            labels: (B, T) target ids; -100 marks positions not to score.
            labelled_only: with ``labels``, the logits of the scored positions only, as
                (N, V) in row-major order: masked-LM training scores 15% of the tokens, so
                this spares 85% of the vocabulary head's work.
            mask: key mask (B, 1, 1, T), True = real token; built from ``pad_id`` if None
                (and no ``attention_mask`` is given).
            attention_mask: Hugging Face's (B, T) of 1 (real token) / 0 (padding), instead
                of ``mask``.
            need_weights: return every layer's attention weights.
        """
        mask = key_mask(ids, self.config.pad_id, mask, attention_mask)
        x, attentions, _ = super().forward(ids, mask, need_weights=need_weights)  # (B, T, D)
        if labelled_only:
            if labels is None:
                raise ValueError("labelled_only needs labels")
            scored = labels != -100  # (B, T)
            logits = self.hook_logits(self.lm_head(x[scored]))  # (N, V)
            labels = labels[scored]  # (N,)
        else:
            logits = self.hook_logits(self.lm_head(x))  # (B, T, V)
        loss = None if labels is None else cross_entropy(logits, labels, None)
        return ModelOutput(logits, loss, encoder_attentions=attentions)
