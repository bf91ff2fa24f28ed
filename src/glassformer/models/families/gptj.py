"""GPT-J (EleutherAI's GPT-J-6B, and the models trained as it): one norm, attention and MLP
side by side, rotary positions on neighbouring pairs of features.

    x + attn(ln(x)) + mlp(ln(x))        one LayerNorm read by both sub-layers

Rotary turns the first ``rotary_dim`` features of each head (64 of GPT-J-6B's 256),
pairing each feature with its neighbour, (2i, 2i + 1), as the RoPE paper writes it, where
Llama pairs i with i + Dh/2 (``RotaryEmbedding(interleaved=True)``). q, k, v and the output
projection have no biases; the MLP (fc_in, the tanh GELU, fc_out) and the vocabulary head
have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from glassformer.models.checks import check_rotary_dim
from glassformer.models.families.decoder import SUMMARY_HEAD, DecoderConfig, Readout, refuse
from glassformer.models.families.gpt_neox import ACTIVATIONS
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.rotary import RotaryEmbedding

GPTJ_READS = SUMMARY_HEAD | {
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "rotary_dim", "n_inner",
    "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
    "rotary", "scale_attn_weights",  # GPT-J-6B's config.json has them; transformers reads neither
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class GPTJConfig(DecoderConfig):
    """A GPT-J decoder."""

    family: ClassVar[str] = "gptj"
    title: ClassVar[str] = "GPT-J"
    HF_READS: ClassVar[frozenset[str]] = GPTJ_READS

    norm_eps: float = 1e-5
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu_tanh"
    rotary_dim: int | None = None  # features of each head turned; None: all of them

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rotary_dim(self.rotary_dim, self.width)
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation must be gelu, gelu_tanh or relu, got {self.activation!r}")

    def attention(self) -> MultiHeadAttention:
        """A layer's attention: no biases, turned by the model's rotary angles."""
        return MultiHeadAttention(
            d_model=self.d_model, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, dropout=self.attention_dropout, qkv_bias=False,
            out_bias=False, causal=True, rotary=True,
        )  # fmt: skip

    def rotary(self) -> RotaryEmbedding:
        """The rotation of the first ``rotary_dim`` features, in neighbouring pairs."""
        return RotaryEmbedding(self.rotary_dim or self.width, interleaved=True)

    def block(self) -> Block:
        return Block(
            attn=self.attention(),
            mlp=FeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation=self.activation,
            ),  # fmt: skip
            ln1=LayerNorm(self.d_model, eps=self.norm_eps),
            ln2=None,  # the MLP reads ln1's output
            parallel=True,
            dropout=self.dropout,
        )

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model),
            rotary=self.rotary(),
            blocks=[self.block() for _ in range(self.num_layers)],
            ln_final=LayerNorm(self.d_model, eps=self.norm_eps),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    def readout(self) -> Readout:
        return Readout(bias=True)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> GPTJConfig:
        """The config of a GPT-J ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        act = hf.get("activation_function", "gelu_new")
        if act not in ACTIVATIONS:
            raise refuse(cls.title, "activation_function", act, str(sorted(ACTIVATIONS)))
        d_model, num_heads = hf["n_embd"], hf["n_head"]
        rotary_dim = hf.get("rotary_dim", 64)
        if rotary_dim is None:  # transformers then turns n_embd features of each head: fails
            raise refuse(cls.title, "rotary_dim", None, "a number of each head's features")
        head_dim = d_model // num_heads
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf.get("n_positions", 2048),
            d_model=d_model,
            num_heads=num_heads,
            num_layers=hf["n_layer"],
            d_ff=hf.get("n_inner") or 4 * d_model,
            activation=ACTIVATIONS[act],  # type: ignore[arg-type]
            rotary_dim=None if rotary_dim == head_dim else rotary_dim,
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            tie_weights=hf.get("tie_word_embeddings", False),
        )
