"""Builders: the textbook models' parts chosen from their config.

A model is a ``Backbone`` (embeddings, blocks, a final norm) with a head, and a block is
whatever attention, MLP and norms it is given (``modules.block.Block``). The functions here
choose those parts for the models whose config names them field by field (the paper's
translator and classifier, BERT, the encoder LM, the ViT and the textbook ``GPT``); each
returns the keyword arguments of ``Backbone``:

    decoder_only(c)     GPT: causal blocks; learned positions or rotary (the modern decoder)
    encoder_only(c)     the classifier's and the encoder LM's bidirectional blocks
    bert(c)             BERT: + token types and a norm on the embeddings, post-norm, no final norm
    translator(c, side) the encoder-decoder's two stacks, the decoder's blocks with cross-attention

Pretrained families with parts of their own (Llama, Qwen, Gemma, GPT-NeoX, OPT, T5,
Marian) are one file each in ``models/families/``, which build from the same modules.

The same config fields mean the same part in every model: ``norm`` ("layer" or "rms"),
``activation`` (which MLP), ``positional`` (a table added to the embeddings, or rotary
angles inside attention), ``bias``; ``attention_window`` and ``global_tokens`` where a
model has them.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from glassformer.models.base import Activation, Norm
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import feed_forward
from glassformer.modules.local_attention import window_of
from glassformer.modules.norms import make_norm
from glassformer.modules.position import TokenEmbedding, positional_encoding
from glassformer.modules.rotary import RotaryEmbedding


class BlockConfig(Protocol):
    """The fields a config names its blocks by (``ModelConfig``'s, ``ViTConfig``'s)."""

    d_model: int
    num_heads: int
    head_dim: int | None
    d_ff: int
    dropout: float
    attention_dropout: float
    activation: Activation
    norm_first: bool
    qkv_bias: bool
    bias: bool
    norm: Norm
    layer_norm_eps: float


def attention(
    c: BlockConfig,
    *,
    causal: bool,
    cross: bool = False,
    rotary: bool = False,
    window: int | None = None,
    global_tokens: int = 0,
    num_kv_heads: int | None = None,
) -> MultiHeadAttention:
    """Self-attention (causal or not; turning q and k by the model's rotary angles where
    ``rotary``; sliding over ``window`` keys each side where given) or cross-attention."""
    span = None if cross else window_of(window, causal)
    return MultiHeadAttention(
        d_model=c.d_model,
        num_heads=c.num_heads,
        head_dim=c.head_dim,
        dropout=c.attention_dropout,
        qkv_bias=c.qkv_bias and c.bias,
        out_bias=c.bias,
        causal=causal and not cross,
        num_kv_heads=None if cross else num_kv_heads,
        rotary=rotary and not cross,  # True: the angles the model computes once for every layer
        window=span,
        global_tokens=0 if span is None else global_tokens,
    )


def mlp(c: BlockConfig) -> nn.Module:
    """The feed-forward network ``activation`` names: plain, or gated ("swiglu")."""
    return feed_forward(
        d_model=c.d_model, d_ff=c.d_ff, dropout=c.dropout, activation=c.activation, bias=c.bias
    )


def norm(c: BlockConfig) -> nn.Module:
    """The norm ``norm`` names, with its epsilon (and a bias where the config has them)."""
    return make_norm(c.norm, c.d_model, eps=c.layer_norm_eps, bias=c.bias)


def block(c: BlockConfig, *, cross: bool = False, **attending: Any) -> Block:
    """One block: self-attention (``attending``: ``attention``'s keywords), cross-attention
    too when ``cross``, the MLP and their norms."""
    crossing = dict(causal=attending["causal"], cross=True)
    return Block(
        attn=attention(c, **attending),
        cross_attn=attention(c, **crossing) if cross else None,
        mlp=mlp(c),
        ln1=norm(c),
        ln_cross=norm(c) if cross else None,
        ln2=norm(c),
        norm_first=c.norm_first,
        dropout=c.dropout,
    )


def blocks(c: BlockConfig, num_layers: int, **options: Any) -> list[Block]:
    """``num_layers`` blocks alike (``block``'s keywords)."""
    return [block(c, **options) for _ in range(num_layers)]


def embeddings(c: Any, vocab_size: int) -> dict[str, Any]:
    """The token embedding (× √d_model where ``scale_embeddings``) and what carries
    positions: a table added to it, or rotary angles that attention applies
    (``positional="rope"``)."""
    parts: dict[str, Any] = dict(
        embed=TokenEmbedding(vocab_size=vocab_size, d_model=c.d_model, scale=c.scale_embeddings),
        max_len=c.max_len,
        dropout=c.dropout,
    )
    if c.positional == "rope":
        parts["rotary"] = RotaryEmbedding(c.head_dim or c.d_model // c.num_heads, c.rope_theta)
    else:
        parts["pos_embed"] = positional_encoding(c.positional, d_model=c.d_model, max_len=c.max_len)
    return parts


def _windowed(c: Any) -> dict[str, Any]:
    return dict(window=c.attention_window, global_tokens=c.global_tokens)


def decoder_only(c: Any) -> dict[str, Any]:
    """GPT's parts: causal blocks (grouped-query where ``num_kv_heads``) and a final norm."""
    return dict(
        **embeddings(c, c.vocab_size),
        blocks=blocks(
            c,
            c.num_layers,
            causal=True,
            rotary=c.positional == "rope",
            num_kv_heads=c.num_kv_heads,
            **_windowed(c),
        ),  # fmt: skip
        ln_final=norm(c),
    )


def encoder_only(c: Any) -> dict[str, Any]:
    """A bidirectional stack's parts (the classifier's, the encoder LM's); a final norm
    under pre-norm only."""
    return dict(
        **embeddings(c, c.vocab_size),
        blocks=blocks(c, c.num_layers, causal=False, **_windowed(c)),
        ln_final=norm(c) if c.norm_first else None,
    )


def bert(c: Any) -> dict[str, Any]:
    """BERT's parts: word + position + token-type embeddings and a LayerNorm on their sum,
    then post-norm GELU blocks, no final norm."""
    return dict(
        **embeddings(c, c.vocab_size),
        token_type=nn.Embedding(c.type_vocab_size, c.d_model),
        ln_embed=make_norm("layer", c.d_model, eps=c.layer_norm_eps),
        blocks=blocks(c, c.num_layers, causal=False, **_windowed(c)),
    )


def translator(c: Any, side: str) -> dict[str, Any]:
    """One of the encoder-decoder's two stacks: ``side`` "encoder" (bidirectional) or
    "decoder" (causal, with cross-attention to the encoder's output)."""
    decoder = side == "decoder"
    layers = c.num_decoder_layers if decoder else c.num_encoder_layers
    vocab_size = c.tgt_vocab_size if decoder else c.src_vocab_size
    return dict(
        **embeddings(c, vocab_size),
        blocks=blocks(c, layers, causal=decoder, cross=decoder, **_windowed(c)),  # fmt: skip
        ln_final=norm(c) if c.norm_first else None,
    )


def layer_options(c: Any) -> dict[str, Any]:
    """The keyword arguments of ``EncoderLayer`` that build ``c``'s blocks (the Keras twin
    builds its layers from them)."""
    return dict(
        d_model=c.d_model,
        num_heads=c.num_heads,
        d_ff=c.d_ff,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation=c.activation,
        norm_first=c.norm_first,
        head_dim=c.head_dim,
        qkv_bias=c.qkv_bias and c.bias,
        bias=c.bias,
        attention_window=c.attention_window,
        global_tokens=c.global_tokens,
    )
