"""Llama (Llama 2, SmolLM2, TinyLlama, ...): the modern decoder block.

    ids → embed_tokens → L × [x + attn(rms(x)); x + swiglu(rms(x))] → rms → lm_head

Rotary positions turn q and k in every layer (one table of angles, made once per forward),
attention is grouped-query (``num_kv_heads`` key/value heads shared by the query heads),
the MLP is SwiGLU, every norm an RMSNorm, and no layer has a bias unless the config says so
(``attention_bias`` and ``mlp_bias`` together). Mistral, Qwen2 and Qwen3 are this family
with a part changed; each says which in its own file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.checkpoint import CheckpointError
from glassformer.models.base import check_finite
from glassformer.models.families.decoder import DecoderConfig, refuse, rope, scaling_field
from glassformer.modules.attention import MultiHeadAttention, Window
from glassformer.modules.block import Block
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.rope_scaling import RopeScaling
from glassformer.modules.rotary import RotaryEmbedding

# the config.json fields every Llama-shaped family reads
LLAMA_READS = frozenset(
    [
        "vocab_size",
        "max_position_embeddings",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_hidden_layers",
        "intermediate_size",
        "hidden_act",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "original_max_position_embeddings",
        "partial_rotary_factor",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "pretraining_tp",
        "rope_interleaved",
    ]
)


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    """A Llama: the shared decoder fields, its rotary base, and whether its layers have
    biases."""

    family: ClassVar[str] = "llama"
    title: ClassVar[str] = "Llama"
    HF_READS: ClassVar[frozenset[str]] = LLAMA_READS

    rope_theta: float = 10000.0  # the rotary base (> 0)
    rope_scaling: RopeScaling | None = None  # Llama 3's, YaRN, ... (modules.rope_scaling)
    bias: bool = False  # biases on q, k, v, o and the MLP's three layers

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.width % 2:
            raise ValueError(f"rotary positions need an even head width, got {self.width}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be true or false, got {self.bias!r}")
        check_finite("rope_theta", self.rope_theta, minimum=0.0, above=True)
        scaling = scaling_field(self.rope_scaling, self.rope_theta, self.rotary_width)
        object.__setattr__(self, "rope_scaling", scaling)

    # ---- what the Llama-shaped families vary ------------------------------------------

    def window(self, layer: int) -> int | None:
        """The keys before each query that layer ``layer`` attends (None: all of them)."""
        return None

    @property
    def rotary_width(self) -> int:
        """The features of each head rotary turns (its first; all of them in Llama)."""
        return self.width

    @property
    def qkv_bias(self) -> bool:
        """Biases on the q, k and v projections."""
        return self.bias

    def qk_norm(self) -> nn.Module | None:
        """A norm over each head's queries (and one over its keys) before the rotation;
        none in Llama."""
        return None

    # ---- the parts ----------------------------------------------------------------------

    def attention(self, layer: int, **more: Any) -> MultiHeadAttention:
        """Layer ``layer``'s attention; ``more`` replaces or adds its keyword arguments (a
        family's own parts)."""
        window = self.window(layer)
        return MultiHeadAttention(**{
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dropout": self.attention_dropout,
            "qkv_bias": self.qkv_bias,
            "out_bias": self.bias,
            "causal": True,
            "rotary": True,  # the angles the model computes once for every layer
            "window": None if window is None else Window(window, 0),
            "q_norm": self.qk_norm(),
            "k_norm": self.qk_norm(),
            **more,
        })  # fmt: skip

    def norm(self) -> nn.Module:
        """Every norm of the stream (an RMSNorm)."""
        return RMSNorm(self.d_model, eps=self.norm_eps)

    def mlp(self, layer: int) -> nn.Module:
        """Layer ``layer``'s MLP: SwiGLU (a mixture of experts in the MoE families)."""
        return GatedFeedForward(
            d_model=self.d_model, d_ff=self.d_ff, dropout=self.dropout, activation="swiglu",
            bias=self.bias,
        )  # fmt: skip

    def block(self, layer: int) -> Block:
        return Block(
            attn=self.attention(layer),
            mlp=self.mlp(layer),
            dropout=self.dropout,
            **self.block_norms(),
        )

    def block_norms(self) -> dict[str, Any]:
        """A block's norms, by ``Block``'s names: one before each sub-layer."""
        return {"ln1": self.norm(), "ln2": self.norm()}

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model),
            rotary=RotaryEmbedding(self.rotary_width, self.rope_theta, self.rope_scaling),
            blocks=[self.block(i) for i in range(self.num_layers)],
            ln_final=self.norm(),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    # ---- from a Hugging Face config -----------------------------------------------------

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LlamaConfig:
        """The config of a Llama ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        return cls(**cls.llama_fields(hf))

    @classmethod
    def llama_fields(cls, hf: dict[str, Any], norm_eps: float = 1e-6) -> dict[str, Any]:
        """The shared fields of a Llama-shaped ``config.json`` (its subclasses' too);
        ``norm_eps`` where it gives no ``rms_norm_eps`` (the family's default)."""
        family = cls.title
        if hf.get("hidden_act", "silu") != "silu":
            raise refuse(family, "hidden_act", hf["hidden_act"], "silu")
        attention_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
        if attention_bias != mlp_bias:
            raise CheckpointError(
                f"{family} attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                "supported (one bias covers both)"
            )
        if hf.get("pretraining_tp", 1) != 1:
            raise refuse(family, "pretraining_tp", hf["pretraining_tp"], "1")
        if hf.get("rope_interleaved", False):  # pairs (0, 1), (2, 3): not rotate_half's
            raise refuse(family, "rope_interleaved", True, "false")
        d_model, num_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or d_model // num_heads
        partial = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)
        if hf.get("partial_rotary_factor", partial) != 1.0:  # every feature is turned
            raise refuse(family, "partial_rotary_factor", hf.get("partial_rotary_factor", partial))
        theta, scaling = rope(hf, family)
        max_len = hf.get("max_position_embeddings", 2048)
        if scaling is not None and scaling.rope_type == "dynamic":  # reads s times further
            max_len = int(max_len * (scaling.factor or 1.0))
        return dict(
            vocab_size=hf["vocab_size"],
            max_len=max_len,
            d_model=d_model,
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=None if head_dim * num_heads == d_model else head_dim,
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            attention_dropout=hf.get("attention_dropout", 0.0),
            rope_theta=theta,
            rope_scaling=scaling,
            norm_eps=hf.get("rms_norm_eps", norm_eps),
            bias=bool(attention_bias),
            tie_weights=hf.get("tie_word_embeddings", False),
        )
