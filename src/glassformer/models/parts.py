"""Builders: a model family's parts chosen from its config.

A model is a ``Backbone`` (embeddings, blocks, a final norm) with a head, and a block is
whatever attention, MLP and norms it is given (``modules.block.Block``). The functions here
read a config and choose those parts; each model family is one builder that returns the
keyword arguments of ``Backbone``:

    decoder_only(c)     GPT: causal pre-norm blocks; learned positions or rotary (Llama)
    encoder_only(c)     the classifier's and the encoder LM's bidirectional blocks
    bert(c)             BERT: + token types and a norm on the embeddings, post-norm, no final norm
    translator(c, side) the encoder-decoder's two stacks, the decoder's blocks with cross-attention

The same config fields mean the same part in every family: ``norm`` ("layer" or "rms"),
``activation`` (which MLP), ``positional`` (a table added to the embeddings, or rotary
angles inside attention), ``num_kv_heads``, ``attention_window``, ``bias``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block, window_of
from glassformer.modules.feedforward import feed_forward
from glassformer.modules.norms import make_norm
from glassformer.modules.position import TokenEmbedding, positional_encoding
from glassformer.modules.relative import RelativePositionBias
from glassformer.modules.rotary import RotaryEmbedding


def _bias(c: Any) -> bool:
    """Whether the linear layers and norms have biases (``bias="qkv"``: q, k, v only)."""
    return getattr(c, "bias", True) is True


def _qkv_bias(c: Any) -> bool:
    return bool(c.qkv_bias) and getattr(c, "bias", True) in (True, "qkv")


def attention(c: Any, *, causal: bool, cross: bool = False, layer: int = 0) -> MultiHeadAttention:
    """Self-attention (causal or not, windowed where the config says) or cross-attention.
    ``layer`` is its index: a config can leave some layers unwindowed, and give the
    windowed ones a rotary base of their own (Gemma)."""
    sliding = not cross and layer not in getattr(c, "full_attention_layers", ())
    window = window_of(getattr(c, "attention_window", None), causal) if sliding else None
    rotary: RotaryEmbedding | bool = not cross and getattr(c, "positional", None) == "rope"
    local_theta = getattr(c, "rope_local_theta", None)
    if rotary and window is not None and local_theta is not None:
        rotary = RotaryEmbedding(_rotary_width(c), local_theta)  # this layer's own angles
    return MultiHeadAttention(
        d_model=c.d_model,
        num_heads=c.num_heads,
        head_dim=c.head_dim,
        dropout=c.attention_dropout,
        qkv_bias=_qkv_bias(c),
        out_bias=_bias(c),
        causal=causal and not cross,
        num_kv_heads=None if cross else getattr(c, "num_kv_heads", None),
        rotary=rotary,  # True: the angles the model computes once for every layer
        window=window,
        global_tokens=0 if window is None else getattr(c, "global_tokens", 0),
        scale=getattr(c, "attention_scale", None),
        softcap=getattr(c, "attention_softcap", None),
        **(_qk_norms(c) if getattr(c, "qk_norm", False) and not cross else {}),
    )


def _rotary_width(c: Any) -> int:
    """The features of each head that rotary positions turn (all, or ``rotary_dim``)."""
    return getattr(c, "rotary_dim", None) or c.head_dim or c.d_model // c.num_heads


def _qk_norms(c: Any) -> dict[str, nn.Module]:
    """QK-norm: an RMSNorm (Gemma's where the model's are) over each head's Dh features,
    for the queries and the keys."""
    head_dim = c.head_dim or c.d_model // c.num_heads
    kind = "gemma_rms" if getattr(c, "norm", "rms") == "gemma_rms" else "rms"
    return {name: make_norm(kind, head_dim, eps=c.layer_norm_eps) for name in ("q_norm", "k_norm")}


def mlp(c: Any) -> nn.Module:
    """The feed-forward network ``activation`` names: plain, or gated ("swiglu")."""
    return feed_forward(
        d_model=c.d_model, d_ff=c.d_ff, dropout=c.dropout, activation=c.activation, bias=_bias(c)
    )


def norm(c: Any) -> nn.Module:
    """The norm ``norm`` names (LayerNorm unless the config has "rms"), with its epsilon."""
    eps = getattr(c, "layer_norm_eps", 1e-5)
    return make_norm(getattr(c, "norm", "layer"), c.d_model, eps=eps, bias=_bias(c))


def block(c: Any, *, causal: bool, cross: bool = False, layer: int = 0) -> Block:
    """One block: self-attention, cross-attention too when ``cross``, the MLP, their norms
    (and a norm after each sub-layer, where the config has ``sandwich_norms``)."""
    sandwich = getattr(c, "sandwich_norms", False)
    return Block(
        attn=attention(c, causal=causal, layer=layer),
        cross_attn=attention(c, causal=causal, cross=True) if cross else None,
        mlp=mlp(c),
        ln1=norm(c),
        ln_cross=norm(c) if cross else None,
        ln2=norm(c),
        norm_first=c.norm_first,
        parallel=getattr(c, "parallel", False),
        dropout=c.dropout,
        ln1_post=norm(c) if sandwich else None,
        ln2_post=norm(c) if sandwich else None,
    )


def blocks(c: Any, num_layers: int, *, causal: bool, cross: bool = False) -> list[Block]:
    return [block(c, causal=causal, cross=cross, layer=i) for i in range(num_layers)]


def embeddings(
    c: Any, vocab_size: int, *, scale: bool = False, causal: bool = False
) -> dict[str, Any]:
    """The token embedding and what carries positions: a table added to it, rotary angles
    that attention applies (``positional="rope"``), or T5's bias on the scores for each
    query–key distance (``positional="relative"``; bidirectional unless ``causal``)."""
    width = getattr(c, "embed_dim", None) or c.d_model  # narrower tables are projected in
    parts: dict[str, Any] = dict(
        embed=TokenEmbedding(vocab_size=vocab_size, d_model=width, scale=scale),
        max_len=c.max_len,
        dropout=c.dropout,
    )
    if width != c.d_model:
        parts["project_in"] = nn.Linear(width, c.d_model, bias=False)
    if c.positional == "rope":
        parts["rotary"] = RotaryEmbedding(_rotary_width(c), c.rope_theta)
    elif c.positional == "relative":
        parts["relative_bias"] = RelativePositionBias(
            c.num_heads, num_buckets=c.relative_buckets, max_distance=c.relative_max_distance,
            bidirectional=not causal,
        )  # fmt: skip
    else:
        parts["pos_embed"] = positional_encoding(c.positional, d_model=c.d_model, max_len=c.max_len)
    return parts


def decoder_only(c: Any) -> dict[str, Any]:
    """GPT's parts: causal pre-norm blocks and a final norm (GPT-2's or Llama's, by config)."""
    return dict(
        **embeddings(c, c.vocab_size, scale=getattr(c, "scale_embeddings", False)),
        blocks=blocks(c, c.num_layers, causal=True),
        ln_final=norm(c) if getattr(c, "final_norm", True) else None,
    )


def encoder_only(c: Any) -> dict[str, Any]:
    """A bidirectional stack's parts (the classifier's, the encoder LM's); a final norm
    under pre-norm only."""
    return dict(
        **embeddings(c, c.vocab_size, scale=getattr(c, "scale_embeddings", False)),
        blocks=blocks(c, c.num_layers, causal=False),
        ln_final=norm(c) if c.norm_first else None,
    )


def bert(c: Any) -> dict[str, Any]:
    """BERT's parts: word + position + token-type embeddings and a LayerNorm on their sum,
    then post-norm GELU blocks, no final norm."""
    return dict(
        **embeddings(c, c.vocab_size),
        token_type=nn.Embedding(c.type_vocab_size, c.d_model),
        ln_embed=make_norm("layer", c.d_model, eps=c.layer_norm_eps),
        blocks=blocks(c, c.num_layers, causal=False),
    )


def translator(c: Any, side: str) -> dict[str, Any]:
    """One of the encoder-decoder's two stacks: ``side`` "encoder" (bidirectional) or
    "decoder" (causal, with cross-attention to the encoder's output)."""
    decoder = side == "decoder"
    layers = c.num_decoder_layers if decoder else c.num_encoder_layers
    vocab_size = c.tgt_vocab_size if decoder else c.src_vocab_size
    return dict(
        **embeddings(c, vocab_size, scale=c.scale_embeddings, causal=decoder),
        blocks=blocks(c, layers, causal=decoder, cross=decoder),
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
        qkv_bias=_qkv_bias(c),
        bias=_bias(c),
        attention_window=getattr(c, "attention_window", None),
        global_tokens=getattr(c, "global_tokens", 0),
    )
