"""A BERT-style encoder, built from glassformer's blocks, for pretrained checkpoints.

ids (B, T) (+ token types) → word + position + token-type embeddings → LayerNorm →
post-norm encoder layers (GELU) → hidden states (B, T, D); the pooler turns the first
([CLS]) position into a sentence vector through Linear + tanh.

This is the architecture of BERT and of the sentence-transformers MiniLM models; the
weights come from Hugging Face directories through ``glassformer.interop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from glassformer.models.base import (
    Activation,
    ModelConfig,
    ModelOutput,
    Pooling,
    Positional,
    PretrainedModel,
    cross_entropy,
)
from glassformer.models.common import key_mask, layer_options, pool
from glassformer.modules.hooks import HookPoint
from glassformer.modules.layers import Encoder
from glassformer.modules.norms import make_norm
from glassformer.modules.position import LearnedPositionalEmbedding, TokenEmbedding


@dataclass(kw_only=True)
class BertConfig(ModelConfig):
    """Configuration of ``BertEncoder``; the defaults are BERT-base's."""

    vocab_size: int = 30522
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    attention_dropout: float = 0.1
    activation: Activation = "gelu"
    positional: Positional = "learned"
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_id: int = 0
    pooler: bool = True

    PRESETS: ClassVar[dict] = {
        "tiny": dict(d_model=64, num_heads=4, num_layers=2, d_ff=256),
        # all-MiniLM-L6-v2's shape
        "minilm": dict(d_model=384, num_heads=12, num_layers=6, d_ff=1536),
        "base": dict(),
    }

    def __post_init__(self) -> None:
        self._check()
        if self.positional != "learned":
            raise ValueError(f"BERT learns its positions, got positional={self.positional!r}")
        if self.type_vocab_size <= 0:
            raise ValueError(f"type_vocab_size must be positive, got {self.type_vocab_size}")


class BertOutput(NamedTuple):
    hidden: Tensor  # (B, T, D), the last layer's states
    pooled: Tensor | None  # (B, D), tanh(Linear(hidden[:, 0])), if the model has a pooler
    attentions: tuple[Tensor, ...] | None  # per layer (B, H, T, T), when asked for


class BertEmbeddings(nn.Module):
    """word + position + token type, then LayerNorm and dropout (BERT normalises here)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.token = TokenEmbedding(vocab_size=c.vocab_size, d_model=c.d_model)
        self.position = LearnedPositionalEmbedding(max_len=c.max_len, d_model=c.d_model)
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model)
        self.norm = make_norm("layer", c.d_model, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.hook_embed = HookPoint()  # the token embeddings, (B, T, D)

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        x = self.position(self.hook_embed(self.token(ids))) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class BertEncoder(PretrainedModel):
    """BERT's encoder (post-norm, GELU) with its pooler."""

    kind = "bert"
    config_class = BertConfig

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = BertEmbeddings(c)
        self.encoder = Encoder(
            num_layers=c.num_layers, **layer_options(c), layer_norm_eps=c.layer_norm_eps
        )
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        ids: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> BertOutput:
        """Hidden states and the pooled first position.

        Args:
            ids: token ids (B, T).
            token_type_ids: segment ids (B, T); all 0 if None.
            mask: key mask (B, 1, 1, T), True = real token; built from ``pad_id`` if None
                (and no ``attention_mask`` is given).
            attention_mask: Hugging Face's (B, T) of 1 (real token) / 0 (padding), instead
                of ``mask``.
            need_weights: return every layer's attention weights.
        """
        mask = key_mask(ids, self.config.pad_id, mask, attention_mask)
        x = self.embed(ids, token_type_ids)
        hidden, attentions, _ = self.encoder(x, mask, need_weights=need_weights)
        pooled = None if self.pooler is None else torch.tanh(self.pooler(hidden[:, 0]))
        return BertOutput(hidden, pooled, attentions)


@dataclass(kw_only=True)
class BertClassifierConfig(BertConfig):
    """Configuration of ``BertClassifier``: a BERT-style encoder and a classification head
    on its pooled states (``pooling``: "mean" over real tokens, as all-MiniLM-L6-v2 pools,
    "cls" or "max"). No pooler by default."""

    num_classes: int = 2
    pooling: Pooling = "mean"
    pooler: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {self.num_classes}")


class BertClassifier(BertEncoder):
    """A BERT-style encoder (pretrained: all-MiniLM-L6-v2, a BERT directory) fine-tuned to
    classify: ids (B, T) → hidden (B, T, D) → pooled (B, D) → dropout → Linear → (B, C)."""

    kind = "bert_classifier"
    config_class = BertClassifierConfig
    config: BertClassifierConfig

    def __init__(self, config: BertClassifierConfig) -> None:
        super().__init__(config)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self._init_weights(self.head)
        self.hook_logits = HookPoint()  # (B, C)

    def forward(  # type: ignore[override]
        self,
        ids: Tensor,
        *,
        labels: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """Class logits (B, C), and their cross-entropy with ``labels`` (B,) when given; the
        other arguments are ``BertEncoder.forward``'s."""
        mask = key_mask(ids, self.config.pad_id, mask, attention_mask)
        hidden, _, attentions = super().forward(
            ids, token_type_ids=token_type_ids, mask=mask, need_weights=need_weights
        )
        logits = self.hook_logits(self.head(self.dropout(pool(hidden, mask, self.config.pooling))))
        loss = None if labels is None else cross_entropy(logits, labels, None)
        return ModelOutput(logits, loss, encoder_attentions=attentions)
