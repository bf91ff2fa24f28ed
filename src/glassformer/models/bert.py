"""A BERT-style encoder, built from glassformer's blocks, for pretrained checkpoints.

ids (B, T) (+ token types) → word + position + token-type embeddings → LayerNorm →
post-norm blocks (GELU) → hidden states (B, T, D); the pooler turns the first ([CLS])
position into a sentence vector through Linear + tanh. The builder is
``models.parts.bert``.

This is the architecture of BERT and of the sentence-transformers MiniLM models; the
weights come from Hugging Face directories through ``glassformer.interop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from glassformer.checkpoint import CheckpointError
from glassformer.errors import shown
from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import Activation, ModelConfig, Pooling, Positional
from glassformer.models.classifier import SequenceClassifier
from glassformer.models.families.decoder import check_known_fields
from glassformer.modules.sdpa import key_mask

# Hugging Face's activation names → glassformer's
BERT_ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
}  # fmt: skip
# the config.json fields BertConfig.from_hf reads (besides those known to change nothing)
BERT_READS = frozenset(
    ["vocab_size", "max_position_embeddings", "hidden_size", "num_attention_heads",
     "num_hidden_layers", "intermediate_size", "hidden_act", "hidden_dropout_prob",
     "attention_probs_dropout_prob", "type_vocab_size", "layer_norm_eps", "pad_token_id",
     "position_embedding_type", "is_decoder", "add_cross_attention", "tie_word_embeddings"]
)  # fmt: skip


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

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, pooler: bool = True) -> BertConfig:
        """The config of a Hugging Face BERT ``config.json`` (``pooler``: whether the weights
        have one); refuses what BERT's parts here do not build, and any field not known."""
        check_known_fields("BERT", hf, BERT_READS)
        act = hf.get("hidden_act", "gelu")
        if act not in BERT_ACTIVATIONS:
            raise CheckpointError(f"BERT hidden_act {shown(act)} has no glassformer equivalent")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            position = shown(hf["position_embedding_type"])
            raise CheckpointError(f"BERT position_embedding_type {position} is not supported")
        for option in ("is_decoder", "add_cross_attention"):  # a causal or crossing BERT
            if hf.get(option):
                raise CheckpointError(f"BERT {option}=True is not supported (an encoder only)")
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf["max_position_embeddings"],
            d_model=hf["hidden_size"],
            num_heads=hf["num_attention_heads"],
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            dropout=hf.get("hidden_dropout_prob", 0.1),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
            activation=BERT_ACTIVATIONS[act],
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            pad_id=hf.get("pad_token_id", 0) or 0,
            pooler=pooler,
        )

    def __post_init__(self) -> None:
        self._check()
        if self.positional != "learned":
            raise ValueError(f"BERT learns its positions, got positional={self.positional!r}")
        if self.type_vocab_size <= 0:
            raise ValueError(f"type_vocab_size must be positive, got {shown(self.type_vocab_size)}")


class BertOutput(NamedTuple):
    hidden: Tensor  # (B, T, D), the last layer's states
    pooled: Tensor | None  # (B, D), tanh(Linear(hidden[:, 0])), if the model has a pooler
    attentions: tuple[Tensor, ...] | None  # per layer (B, H, T, T), when asked for


class BertEncoder(Backbone):
    """BERT's encoder (post-norm, GELU) with its pooler."""

    kind = "bert"
    config_class = BertConfig
    config: BertConfig
    HEADS = ("pooler",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, **parts.bert(config))
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooler else None
        init_bert_weights(self)

    def forward(  # type: ignore[override]
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
        x = self.embed_tokens(ids, token_type_ids=token_type_ids)
        hidden, attentions, _ = self.run_stack(x, mask, need_weights=need_weights)
        pooled = None if self.pooler is None else torch.tanh(self.pooler(hidden[:, 0]))
        return BertOutput(hidden, pooled, attentions)


def init_bert_weights(model: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) for every matrix and embedding, zero biases."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


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


class BertClassifier(SequenceClassifier):
    """A BERT-style encoder (pretrained: all-MiniLM-L6-v2, a BERT directory) fine-tuned to
    classify: ids (B, T) → hidden (B, T, D) → pooled (B, D) → dropout → Linear → (B, C)."""

    kind = "bert_classifier"
    config_class = BertClassifierConfig
    config: BertClassifierConfig

    def __init__(self, config: BertClassifierConfig) -> None:
        super().__init__(config, head_dropout=config.dropout, **parts.bert(config))
        if config.pooler:  # a pooler the classifier does not read, kept for its weights
            self.pooler = nn.Linear(config.d_model, config.d_model)
        init_bert_weights(self)
