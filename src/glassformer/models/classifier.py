"""Sequence classifiers: a backbone, a pooling of its states, and a class head.

ids (B, T) → backbone → hidden (B, T, D) → pool over T → linear → logits (B, C)

Every classifier is this, with another backbone: ``TransformerClassifier`` (Bloem's
encoder, mean pooling), ``GPTClassifier`` (a GPT's causal blocks, the last real token's
state) and ``BertClassifier`` (``models.bert``). They are siblings of the language
models on the same backbones, so one starts from the other's weights
(``backbone_state_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from glassformer.errors import shown
from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import (
    ModelConfig,
    ModelOutput,
    Pooling,
    Positional,
)
from glassformer.models.common import POOLING, cross_entropy, pool
from glassformer.models.gpt import GPTClassifierConfig, init_gpt_weights
from glassformer.modules.hooks import HookPoint
from glassformer.modules.sdpa import key_mask


class SequenceClassifier(Backbone):
    """A backbone with a class head on its pooled states: ids (B, T) → logits (B, C).

    Subclasses build the backbone's parts; the config gives ``num_classes`` and
    ``pooling``. ``head_dropout`` is applied to the pooled vector (BERT's classifier has one).
    """

    HEADS = ("head",)
    causal: ClassVar[bool] = False  # whose attention maps a forward returns: the decoder's

    def __init__(self, config, head_dropout: float = 0.0, **backbone) -> None:
        super().__init__(config, **backbone)
        self.head_dropout = nn.Dropout(head_dropout)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self.hook_pooled = HookPoint()  # the vector the head reads, (B, D)
        self.hook_logits = HookPoint()  # (B, C)

    def forward(  # type: ignore[override]
        self,
        ids: Tensor,
        *,
        labels: Tensor | None = None,
        mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """Classify a batch.

        Args:
            ids: token ids, (B, T); ``pad_id`` marks padding.
            labels: class indices (B,); when given, ``loss`` is their cross-entropy.
            mask: key mask (B, 1, 1, T), True = real token; built from ``pad_id`` if None
                (and no ``attention_mask`` is given). Pooling ignores the masked positions.
            attention_mask: Hugging Face's (B, T) of 1 (real token) / 0 (padding), instead
                of ``mask``.
            token_type_ids: segment ids (B, T) where the backbone has them (BERT).
            need_weights: return every layer's attention weights.
        """
        mask = key_mask(ids, self.config.pad_id, mask, attention_mask)
        x = self.embed_tokens(ids, token_type_ids=token_type_ids)  # (B, T, D)
        x, attentions, _ = self.run_stack(x, mask, need_weights=need_weights)
        pooled = self.head_dropout(self.hook_pooled(self.pool(x, mask)))  # (B, D)
        logits = self.hook_logits(self.head(pooled))  # (B, C)
        loss = None if labels is None else cross_entropy(logits, labels, None)
        if self.causal:
            return ModelOutput(logits, loss, decoder_attentions=attentions)
        return ModelOutput(logits, loss, encoder_attentions=attentions)

    def pool(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """(B, T, D) → (B, D) by the config's ``pooling``, ignoring padded positions."""
        return pool(x, mask, self.config.pooling)


@dataclass(kw_only=True)
class ClassifierConfig(ModelConfig):
    """Configuration of ``TransformerClassifier``.

    ``pooling``: "mean" over real tokens (Bloem), "cls" (the first token), or "max".
    """

    vocab_size: int
    num_classes: int
    d_model: int = 128
    num_layers: int = 6
    d_ff: int = 512
    positional: Positional = "learned"
    pooling: Pooling = "mean"

    PRESETS: ClassVar[dict] = {
        # Bloem's classifier: k=128, 8 wide heads (each k wide), depth 6, 4k ReLU FF,
        # no q/k/v bias, learned positions for 100 tokens.
        "bloem": dict(
            vocab_size=1000,
            num_classes=10,
            max_len=100,
            d_model=128,
            num_heads=8,
            head_dim=128,
            num_layers=6,
            d_ff=512,
            qkv_bias=False,
        ),
        "tiny": dict(d_model=64, num_heads=4, num_layers=2, d_ff=256),
        # One layer: on IMDb within CPU minutes, depth costs more steps than it gives back
        # (0.84 test accuracy after 4 minutes; four layers, cased, lr 5e-4: 0.81 after 20).
        "small": dict(d_model=128, num_heads=8, num_layers=1, d_ff=512),
        "base": dict(d_model=256, num_heads=8, num_layers=6, d_ff=1024),
    }

    def __post_init__(self) -> None:
        self._check()
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {list(POOLING)}, got {shown(self.pooling)}")


class TransformerClassifier(SequenceClassifier):
    """Classify a token sequence into one of ``num_classes`` (Bloem's "Transformers from
    scratch"): bidirectional blocks, their states pooled."""

    kind = "classifier"
    config_class = ClassifierConfig
    config: ClassifierConfig

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__(config, **parts.encoder_only(config))


class GPTClassifier(SequenceClassifier):
    """A GPT's causal blocks (a pretrained ``lm`` run, SmolLM2) with a class head on the last
    real token's state (or the mean of the states): (B, T) → (B, C). Texts are
    right-padded, so every real token reads only real tokens before it."""

    kind = "gpt_classifier"
    config_class = GPTClassifierConfig
    config: GPTClassifierConfig
    causal = True

    def __init__(self, config: GPTClassifierConfig) -> None:
        super().__init__(config, **config.parts())
        init_gpt_weights(self, config.num_layers)  # the backbone as a GPT's is initialised
        self.head.reset_parameters()  # the head as nn.Linear initialises itself
