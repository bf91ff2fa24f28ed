"""GPT-NeoX (Pythia, GPT-NeoX-20B): GPT-2's LayerNorms and MLP, rotary positions on part of
each head, and attention and MLP reading the same stream.

    x + attn(ln1(x)) + mlp(ln2(x))         (``use_parallel_residual``, the default)
    x' = x + attn(ln1(x)); x' + mlp(ln2(x'))   (without it)

Rotary turns only the first ``rotary_dim`` features of each head (``rotary_pct`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from glassformer.models.base import check_finite
from glassformer.models.checks import check_rotary_dim
from glassformer.models.families.decoder import (
    DecoderConfig,
    refuse,
    rope_theta,
    turned_features,
)
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.rotary import RotaryEmbedding

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "relu": "relu"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class GPTNeoXConfig(DecoderConfig):
    """A GPT-NeoX decoder."""

    family: ClassVar[str] = "gpt_neox"
    title: ClassVar[str] = "GPT-NeoX"
    HF_READS: ClassVar[frozenset[str]] = frozenset(
        [
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
            "hidden_act",
            "layer_norm_eps",
            "rotary_pct",
            "partial_rotary_factor",
            "rotary_emb_base",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "use_parallel_residual",
            "attention_bias",
            "tie_word_embeddings",
        ]
    )

    norm_eps: float = 1e-5
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"
    rope_theta: float = 10000.0  # the rotary base
    rotary_dim: int | None = None  # features of each head turned; None: all of them
    parallel: bool = True  # attention and MLP read the same stream

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rotary_dim(self.rotary_dim, self.width)
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation must be gelu, gelu_tanh or relu, got {self.activation!r}")
        check_finite("rope_theta", self.rope_theta, minimum=0.0, above=True)

    def block(self) -> Block:
        return Block(
            attn=MultiHeadAttention(
                d_model=self.d_model,
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                dropout=self.attention_dropout,
                causal=True,
                rotary=True,
            ),  # fmt: skip
            mlp=FeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation=self.activation,
            ),  # fmt: skip
            ln1=LayerNorm(self.d_model, eps=self.norm_eps),
            ln2=LayerNorm(self.d_model, eps=self.norm_eps),
            parallel=self.parallel,
            dropout=self.dropout,
        )

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model),
            rotary=RotaryEmbedding(self.rotary_dim or self.width, self.rope_theta),
            blocks=[self.block() for _ in range(self.num_layers)],
            ln_final=LayerNorm(self.d_model, eps=self.norm_eps),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> GPTNeoXConfig:
        """The config of a GPT-NeoX ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        act = hf.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise refuse(cls.title, "hidden_act", act, str(sorted(ACTIVATIONS)))
        if not hf.get("attention_bias", True):
            raise refuse(cls.title, "attention_bias", False, "its MLP keeps biases")
        d_model, num_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = d_model // num_heads
        params = hf.get("rope_parameters") or {}
        fraction = params.get(
            "partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
        )
        rotary_dim = turned_features(cls.title, "rotary_pct", fraction, head_dim)
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf.get("max_position_embeddings", 2048),
            d_model=d_model,
            num_heads=num_heads,
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            activation=ACTIVATIONS[act],  # type: ignore[arg-type]
            rope_theta=rope_theta(hf, cls.title, hf.get("rotary_emb_base", 10000.0)),
            rotary_dim=rotary_dim,
            parallel=bool(hf.get("use_parallel_residual", True)),
            norm_eps=hf.get("layer_norm_eps", 1e-5),
            tie_weights=hf.get("tie_word_embeddings", False),
        )
