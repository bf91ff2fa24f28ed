"""OPT (Meta's Open Pre-trained Transformers): GPT-2's parts with ReLU, and OPT-350m's own.

Learned positions (the file's table has two leading rows the weight map drops), LayerNorms,
biases everywhere. OPT-350m is post-norm with no final norm (``norm_first=False``,
``final_norm=False``) and its token embeddings are narrower than the stream
(``embed_dim``): projected in after the lookup (``project_in``) and out before the head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import nn

from glassformer.models.families.decoder import DecoderConfig, Readout, refuse
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import LearnedPositionalEmbedding, TokenEmbedding


@dataclass(frozen=True, kw_only=True)
class OPTConfig(DecoderConfig):
    """An OPT decoder."""

    family: ClassVar[str] = "opt"
    title: ClassVar[str] = "OPT"
    HF_READS: ClassVar[frozenset[str]] = frozenset(
        [
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "ffn_dim",
            "activation_function",
            "do_layer_norm_before",
            "_remove_final_layer_norm",
            "word_embed_proj_dim",
            "layer_norm_elementwise_affine",
            "enable_bias",
            "scale_embedding",
            "tie_word_embeddings",
        ]
    )

    norm_eps: float = 1e-5  # OPT's LayerNorms keep torch's default
    tie_weights: bool = True
    activation: Literal["relu", "gelu"] = "relu"
    norm_first: bool = True  # False: OPT-350m's post-norm blocks
    final_norm: bool = True  # a LayerNorm after the last block
    embed_dim: int | None = None  # the token embeddings' width where narrower than d_model

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be relu or gelu, got {self.activation!r}")
        if self.embed_dim is not None and (
            not isinstance(self.embed_dim, int) or self.embed_dim <= 0
        ):
            raise ValueError(
                f"embed_dim must be a positive integer or None, got {self.embed_dim!r}"
            )

    def block(self) -> Block:
        return Block(
            attn=MultiHeadAttention(
                d_model=self.d_model,
                num_heads=self.num_heads,
                dropout=self.attention_dropout,
                causal=True,
            ),  # fmt: skip
            mlp=FeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation=self.activation,
            ),  # fmt: skip
            ln1=LayerNorm(self.d_model, eps=self.norm_eps),
            ln2=LayerNorm(self.d_model, eps=self.norm_eps),
            norm_first=self.norm_first,
            dropout=self.dropout,
        )

    def parts(self) -> dict[str, Any]:
        width = self.embed_dim or self.d_model
        parts: dict[str, Any] = dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=width),
            pos_embed=LearnedPositionalEmbedding(max_len=self.max_len, d_model=self.d_model),
            blocks=[self.block() for _ in range(self.num_layers)],
            ln_final=LayerNorm(self.d_model, eps=self.norm_eps) if self.final_norm else None,
            max_len=self.max_len,
            dropout=self.dropout,
        )
        if self.embed_dim is not None:
            parts["project_in"] = nn.Linear(width, self.d_model, bias=False)
        return parts

    def readout(self) -> Readout:
        return Readout(embed_width=self.embed_dim)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> OPTConfig:
        """The config of an OPT ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        d_model = hf["hidden_size"]
        embed_dim = hf.get("word_embed_proj_dim") or d_model
        pre_norm = bool(hf.get("do_layer_norm_before", True))
        for option in ("layer_norm_elementwise_affine", "enable_bias"):
            if not hf.get(option, True):
                raise refuse(cls.title, option, hf.get(option))
        if hf.get("scale_embedding", False):
            raise refuse(cls.title, "scale_embedding", True)
        act = hf.get("activation_function", "relu")
        if act not in ("relu", "gelu"):
            raise refuse(cls.title, "activation_function", act, "relu, gelu")
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf.get("max_position_embeddings", 2048),
            d_model=d_model,
            num_heads=hf["num_attention_heads"],
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["ffn_dim"],
            activation=act,
            norm_first=pre_norm,
            final_norm=pre_norm and not hf.get("_remove_final_layer_norm", False),
            embed_dim=None if embed_dim == d_model else embed_dim,
            tie_weights=hf.get("tie_word_embeddings", True),
        )
