"""T5 (T5, T5 v1.1, Flan-T5): a pre-norm encoder-decoder with positions as a bias.

    ids → shared table → L × [x + attn(rms(x)) (+ cross-attn(rms(x))); x + mlp(rms(x))] → rms

No position vectors: every self-attention score gets a learned bias per head for its bucket
of query–key distances (the encoder's buckets tell before from after, the decoder's look back
only). RMSNorms without biases, no biases anywhere, scores not divided by √Dh (``Scores(1)``),
a ReLU MLP (T5) or a gated GELU one (v1.1, Flan-T5), heads whose total width may differ from
d_model (``head_dim``, T5's ``d_kv``), one table for source and target, and where the head is
tied to it, the decoder's states × d_model^-½ first (``scale_output``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from glassformer.checkpoint import CheckpointError
from glassformer.models.base import is_integer
from glassformer.models.families.decoder import refuse
from glassformer.models.families.translator import TranslatorConfig
from glassformer.modules.attention import MultiHeadAttention, Scores
from glassformer.modules.block import Block
from glassformer.modules.feedforward import feed_forward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.relative import RelativePositionBias

FEED_FORWARD = {"relu": "relu", "gated-gelu": "geglu_tanh"}


@dataclass(frozen=True, kw_only=True)
class T5Config(TranslatorConfig):
    """A T5 encoder-decoder."""

    family: ClassVar[str] = "t5"
    title: ClassVar[str] = "T5"
    HF_READS: ClassVar[frozenset[str]] = frozenset(
        ["vocab_size", "d_model", "num_heads", "d_kv", "num_layers", "num_decoder_layers",
         "d_ff", "n_positions", "feed_forward_proj", "layer_norm_epsilon",
         "relative_attention_num_buckets", "relative_attention_max_distance",
         "tie_word_embeddings", "scale_decoder_outputs", "dropout_rate", "is_gated_act",
         "dense_act_fn"]
    )  # fmt: skip

    activation: Literal["relu", "geglu_tanh"] = "relu"  # the MLP's: T5's, or v1.1's gated
    norm_eps: float = 1e-6
    relative_buckets: int = 32  # distance buckets of the position bias
    relative_max_distance: int = 128  # past it, one bucket
    scale_output: bool = True  # the decoder's states × d_model^-½ before the output

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.activation not in ("relu", "geglu_tanh"):
            raise ValueError(f"activation must be relu or geglu_tanh, got {self.activation!r}")
        for name in ("relative_buckets", "relative_max_distance"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def output_scale(self) -> float | None:
        return self.d_model**-0.5 if self.scale_output else None

    def attention(self, *, causal: bool) -> MultiHeadAttention:
        return MultiHeadAttention(
            d_model=self.d_model, num_heads=self.num_heads, head_dim=self.head_dim,
            dropout=self.attention_dropout, qkv_bias=False, out_bias=False, causal=causal,
            scores=Scores(scale=1.0),  # T5 does not divide its scores by √Dh
        )  # fmt: skip

    def block(self, decoder: bool) -> Block:
        return Block(
            attn=self.attention(causal=decoder),
            cross_attn=self.attention(causal=False) if decoder else None,
            mlp=feed_forward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation=self.activation,
                bias=False,
            ),  # fmt: skip
            ln1=RMSNorm(self.d_model, eps=self.norm_eps),
            ln_cross=RMSNorm(self.d_model, eps=self.norm_eps) if decoder else None,
            ln2=RMSNorm(self.d_model, eps=self.norm_eps),
            dropout=self.dropout,
        )

    def parts(self, side: str) -> dict[str, Any]:
        decoder = side == "decoder"
        layers = self.num_decoder_layers if decoder else self.num_encoder_layers
        vocab_size = self.tgt_vocab_size if decoder else self.src_vocab_size
        return dict(
            embed=TokenEmbedding(vocab_size=vocab_size, d_model=self.d_model),
            relative_bias=RelativePositionBias(
                self.num_heads,
                num_buckets=self.relative_buckets,
                max_distance=self.relative_max_distance,
                bidirectional=not decoder,
            ),  # fmt: skip
            blocks=[self.block(decoder) for _ in range(layers)],
            ln_final=RMSNorm(self.d_model, eps=self.norm_eps),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> T5Config:
        """The config of a T5 ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        proj = hf.get("feed_forward_proj", "relu")
        if proj not in FEED_FORWARD:
            raise refuse("T5", "feed_forward_proj", proj, str(sorted(FEED_FORWARD)))
        if hf.get("is_decoder") or hf.get("is_encoder_decoder") is False:
            raise CheckpointError("T5 is_encoder_decoder=False (one stack) is not supported")
        d_model, heads, d_kv = hf["d_model"], hf["num_heads"], hf["d_kv"]
        tied = hf.get("tie_word_embeddings", True) is not False
        # transformers 5 writes tie_word_embeddings true for every T5 and keeps whether the
        # states are scaled (the file's first tie) in scale_decoder_outputs.
        pad = hf.get("pad_token_id", 0)
        return cls(
            src_vocab_size=hf["vocab_size"],
            tgt_vocab_size=hf["vocab_size"],
            d_model=d_model,
            num_heads=heads,
            head_dim=None if heads * d_kv == d_model else d_kv,
            num_encoder_layers=hf["num_layers"],
            num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
            d_ff=hf["d_ff"],
            max_len=hf.get("n_positions", 512),
            activation=FEED_FORWARD[proj],  # type: ignore[arg-type]
            norm_eps=hf.get("layer_norm_epsilon", 1e-6),
            relative_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_max_distance=hf.get("relative_attention_max_distance", 128),
            tie_output=tied,
            scale_output=bool(hf.get("scale_decoder_outputs", tied)),
            pad_id=pad,
            bos_id=hf.get("decoder_start_token_id", pad),
            eos_id=hf.get("eos_token_id", 1),
        )
