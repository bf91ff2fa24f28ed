"""GPT-Neo (EleutherAI's GPT-Neo 125M–2.7B, and the TinyStories models): GPT-2's block with
global and local layers in turn, and unscaled scores.

    ids → wte + wpe → L × [x + attn(ln(x)); x + mlp(ln(x))] → ln_f → lm_head (tied)

Learned positions, pre-norm LayerNorms, a plain GELU MLP (the tanh approximation), biases on
the output projections and the MLP but not on q, k and v. Two things differ from GPT-2:

- the layers alternate (as ``attention_types`` lists them) between global attention and a
  local window of ``window_size`` keys, the query included (``attention_window`` = W − 1
  keys before it);
- the scores are q·k, not q·k/√Dh (``Scores(1.0)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.models.checks import check_window, is_integer
from glassformer.models.families.decoder import (
    SUMMARY_HEAD,
    DecoderConfig,
    check_layers,
    refuse,
    window_from_sliding,
)
from glassformer.modules.attention import MultiHeadAttention, Scores, Window
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import LearnedPositionalEmbedding, TokenEmbedding


@dataclass(frozen=True, kw_only=True)
class GPTNeoConfig(DecoderConfig):
    """A GPT-Neo decoder."""

    family: ClassVar[str] = "gpt_neo"
    title: ClassVar[str] = "GPT-Neo"
    HF_READS: ClassVar[frozenset[str]] = (
        frozenset(
            [
                "vocab_size",
                "max_position_embeddings",
                "hidden_size",
                "num_heads",
                "num_layers",
                "intermediate_size",
                "attention_types",
                "attention_layers",
                "window_size",
                "activation_function",
                "layer_norm_epsilon",
                "tie_word_embeddings",
                "resid_dropout",  # the dropouts matter to training only
                "embed_dropout",
            ]
        )
        | SUMMARY_HEAD
    )

    norm_eps: float = 1e-5
    tie_weights: bool = True
    attention_window: int | None = None  # keys before each query a local layer sees
    local_layers: tuple[int, ...] = ()  # the layers that attend within the window

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "local_layers", tuple(self.local_layers))
        check_layers("local_layers", self.local_layers, self.num_layers)
        check_window(self.attention_window)
        if self.local_layers and self.attention_window is None:
            raise ValueError("local_layers need an attention_window")

    def block(self, layer: int) -> Block:
        local = layer in self.local_layers
        return Block(
            attn=MultiHeadAttention(
                d_model=self.d_model,
                num_heads=self.num_heads,
                dropout=self.attention_dropout,
                qkv_bias=False,
                causal=True,
                window=Window(self.attention_window, 0) if local else None,  # type: ignore[arg-type]
                scores=Scores(1.0),  # q·k, unscaled
            ),  # fmt: skip
            mlp=FeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation="gelu_tanh",
            ),  # fmt: skip
            ln1=LayerNorm(self.d_model, eps=self.norm_eps),
            ln2=LayerNorm(self.d_model, eps=self.norm_eps),
            dropout=self.dropout,
        )

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model),
            pos_embed=LearnedPositionalEmbedding(max_len=self.max_len, d_model=self.d_model),
            blocks=[self.block(i) for i in range(self.num_layers)],
            ln_final=LayerNorm(self.d_model, eps=self.norm_eps),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> GPTNeoConfig:
        """The config of a GPT-Neo ``config.json``; refuses what this family does not build."""
        cls.check_hf_fields(hf)
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise refuse(cls.title, "activation_function", act, "gelu_new")
        kinds = _layer_kinds(cls.title, hf)
        d_model = hf["hidden_size"]
        local = tuple(i for i, kind in enumerate(kinds) if kind == "local")
        return cls(
            vocab_size=hf["vocab_size"],
            max_len=hf.get("max_position_embeddings", 2048),
            d_model=d_model,
            num_heads=hf["num_heads"],
            num_layers=hf["num_layers"],
            d_ff=hf.get("intermediate_size") or 4 * d_model,
            attention_dropout=hf.get("attention_dropout", 0.0),
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            attention_window=window_from_sliding(cls.title, hf.get("window_size", 256))
            if local
            else None,
            local_layers=local,
            tie_weights=hf.get("tie_word_embeddings", True),
        )


def _layer_kinds(family: str, hf: dict[str, Any]) -> list[str]:
    """Each layer's "global" or "local", from ``attention_types`` ([[kinds, repeats], ...],
    as transformers expands it), checked against ``attention_layers`` where both are given."""
    types = hf.get("attention_types", [[["global", "local"], hf["num_layers"] // 2]])
    kinds: list[str] = []
    try:
        for pattern, repeats in types:
            if not is_integer(repeats) or not 0 <= repeats <= hf["num_layers"]:
                raise refuse(family, "attention_types", types, "[[kinds, repeats], ...]")
            if len(kinds) + len(pattern) * repeats > hf["num_layers"]:  # before it is built
                raise refuse(family, "attention_types", types, f"{hf['num_layers']} layers")
            kinds.extend(list(pattern) * repeats)
    except (TypeError, ValueError):
        raise refuse(family, "attention_types", types, "[[kinds, repeats], ...]") from None
    if len(kinds) != hf["num_layers"] or set(kinds) - {"global", "local"}:
        raise refuse(family, "attention_types", types, f"{hf['num_layers']} global or local")
    listed = hf.get("attention_layers")
    if listed is not None and list(listed) != kinds:
        raise refuse(family, "attention_layers", listed, f"what attention_types gives: {kinds}")
    return kinds
