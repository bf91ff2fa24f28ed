"""MarianMT (Helsinki-NLP's opus-mt translators): the paper's post-norm translator.

What it sets its own way: sinusoids laid out as all sines then all cosines (never stored),
embeddings × √d_model where ``scale_embeddings``, one table for source, target and output
where the config shares them, a SiLU ("swish") or GELU MLP, no final norm, and an output
bias (``final_logits_bias``). Its decoder starts from the pad id, so ``bos_id`` is the pad id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from glassformer.checkpoint import CheckpointError
from glassformer.models.families.decoder import refuse
from glassformer.models.families.translator import TranslatorConfig
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import TokenEmbedding, positional_encoding

# fields older opus-mt files carry from BART's config, and the value Marian's parts have
FIXED = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
         "static_position_embeddings": True, "add_bias_logits": False}  # fmt: skip
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu",
               "gelu_new": "gelu_tanh"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MarianConfig(TranslatorConfig):
    """A Marian encoder-decoder."""

    family: ClassVar[str] = "marian"
    title: ClassVar[str] = "Marian"
    HF_READS: ClassVar[frozenset[str]] = frozenset(
        ["vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers",
         "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
         "decoder_ffn_dim", "max_position_embeddings", "activation_function",
         "scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings",
         "encoder_layerdrop", "decoder_layerdrop", "extra_pos_embeddings",
         "num_hidden_layers", *FIXED]
    )  # fmt: skip

    activation: Literal["silu", "gelu", "relu", "gelu_tanh"] = "silu"
    scale_embeddings: bool = False  # token embeddings × √d_model
    norm_eps: float = 1e-5

    def attention(self, *, causal: bool) -> MultiHeadAttention:
        return MultiHeadAttention(d_model=self.d_model, num_heads=self.num_heads,
                                  dropout=self.attention_dropout, causal=causal)  # fmt: skip

    def block(self, decoder: bool) -> Block:
        return Block(
            attn=self.attention(causal=decoder),
            cross_attn=self.attention(causal=False) if decoder else None,
            mlp=FeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation=self.activation,
            ),  # fmt: skip
            ln1=LayerNorm(self.d_model, eps=self.norm_eps),
            ln_cross=LayerNorm(self.d_model, eps=self.norm_eps) if decoder else None,
            ln2=LayerNorm(self.d_model, eps=self.norm_eps),
            norm_first=False,  # the paper's post-norm
            dropout=self.dropout,
        )

    def parts(self, side: str) -> dict[str, Any]:
        decoder = side == "decoder"
        layers = self.num_decoder_layers if decoder else self.num_encoder_layers
        vocab_size = self.tgt_vocab_size if decoder else self.src_vocab_size
        return dict(
            embed=TokenEmbedding(
                vocab_size=vocab_size, d_model=self.d_model, scale=self.scale_embeddings
            ),  # fmt: skip
            pos_embed=positional_encoding(
                "sinusoidal_halves", d_model=self.d_model, max_len=self.max_len
            ),
            blocks=[self.block(decoder) for _ in range(layers)],
            max_len=self.max_len,
            dropout=self.dropout,
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> MarianConfig:
        """The config of a Marian ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        for field, value in FIXED.items():
            if hf.get(field, value) != value:
                raise refuse("Marian", field, hf[field], str(value).lower())
        act = hf.get("activation_function", "gelu")
        if act not in ACTIVATIONS:
            raise refuse("Marian", "activation_function", act, str(sorted(ACTIVATIONS)))
        shapes = {(hf[f"{side}_attention_heads"], hf[f"{side}_ffn_dim"])
                  for side in ("encoder", "decoder")}  # fmt: skip
        if len(shapes) != 1:
            raise CheckpointError(
                f"Marian with encoder and decoder of different heads or widths "
                f"{sorted(shapes)} is not supported"
            )
        heads, d_ff = shapes.pop()
        shared = hf.get("share_encoder_decoder_embeddings", True)
        vocab = hf["vocab_size"]
        pad = hf.get("pad_token_id", vocab - 1)
        return cls(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab if shared else hf.get("decoder_vocab_size") or vocab,
            d_model=hf["d_model"],
            num_heads=heads,
            num_encoder_layers=hf["encoder_layers"],
            num_decoder_layers=hf["decoder_layers"],
            d_ff=d_ff,
            max_len=hf.get("max_position_embeddings", 1024),
            activation=ACTIVATIONS[act],  # type: ignore[arg-type]
            scale_embeddings=bool(hf.get("scale_embedding", False)),
            share_embeddings=bool(shared),
            tie_output=bool(hf.get("tie_word_embeddings", True)),
            pad_id=pad,
            bos_id=hf.get("decoder_start_token_id", pad),
            eos_id=hf.get("eos_token_id", 0),
        )
