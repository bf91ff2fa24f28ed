"""Phi-1, Phi-1.5 and Phi-2 (Microsoft, ``model_type`` "phi"): GPT-J's block (one norm,
attention and MLP side by side) with biases and Llama's rotary pairing.

    x + attn(ln(x)) + mlp(ln(x))        one LayerNorm read by both sub-layers

The MLP is GPT-2's (fc1, the tanh GELU, fc2, with biases), q, k, v and the output
projection have biases, rotary turns the first ``rotary_dim`` features of each head
(``partial_rotary_factor``: Phi-2's 0.4 of 80), and the vocabulary head has a bias of its
own. ``qk_layernorm`` adds a LayerNorm over each head's q and k before the rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.models.checks import check_finite
from glassformer.models.families.decoder import (
    partial_rotary,
    refuse,
    rope,
    scaling_field,
    turned_features,
)
from glassformer.models.families.gpt_neox import ACTIVATIONS
from glassformer.models.families.gptj import GPTJConfig
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.norms import LayerNorm
from glassformer.modules.rope_scaling import RopeScaling
from glassformer.modules.rotary import RotaryEmbedding

PHI_READS = frozenset(
    [
        "vocab_size",
        "max_position_embeddings",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "num_hidden_layers",
        "intermediate_size",
        "hidden_act",
        "layer_norm_eps",
        "partial_rotary_factor",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "qk_layernorm",
        "tie_word_embeddings",
    ]
)


@dataclass(frozen=True, kw_only=True)
class PhiConfig(GPTJConfig):
    """A Phi-1/1.5/2 decoder: GPT-J's block with biases on q, k, v and the output, rotary
    in Llama's pairing with its own base (and scaling), and an optional per-head QK-norm."""

    family: ClassVar[str] = "phi"
    title: ClassVar[str] = "Phi"
    HF_READS: ClassVar[frozenset[str]] = PHI_READS

    rope_theta: float = 10000.0  # the rotary base
    rope_scaling: RopeScaling | None = None
    qk_norm: bool = False  # a LayerNorm over each head's q and k before the rotation

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite("rope_theta", self.rope_theta, minimum=0.0, above=True)
        scaling = scaling_field(self.rope_scaling, self.rope_theta, self.rotary_dim or self.width)
        object.__setattr__(self, "rope_scaling", scaling)

    def attention(self) -> MultiHeadAttention:
        head_norms: dict[str, Any] = {"q_norm": self.head_norm(), "k_norm": self.head_norm()}
        return MultiHeadAttention(
            d_model=self.d_model, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, dropout=self.attention_dropout, causal=True, rotary=True,
            **(head_norms if self.qk_norm else {}),
        )  # fmt: skip

    def head_norm(self) -> LayerNorm:
        return LayerNorm(self.width, eps=self.norm_eps)

    def rotary(self) -> RotaryEmbedding:
        return RotaryEmbedding(self.rotary_dim or self.width, self.rope_theta, self.rope_scaling)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> PhiConfig:
        """The config of a Phi ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        act = hf.get("hidden_act", "gelu_new")
        if act not in ACTIVATIONS:
            raise refuse(cls.title, "hidden_act", act, str(sorted(ACTIVATIONS)))
        d_model, num_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = d_model // num_heads
        fraction = partial_rotary(hf, 0.5)
        rotary_dim = turned_features(cls.title, "partial_rotary_factor", fraction, head_dim)
        theta, scaling = rope(hf, cls.title)
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf.get("max_position_embeddings", 2048),
            d_model=d_model,
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            activation=ACTIVATIONS[act],  # type: ignore[arg-type]
            rope_theta=theta,
            rope_scaling=scaling,
            rotary_dim=rotary_dim,
            qk_norm=bool(hf.get("qk_layernorm", False)),
            norm_eps=hf.get("layer_norm_eps", 1e-5),
            tie_weights=hf.get("tie_word_embeddings", False),
        )
