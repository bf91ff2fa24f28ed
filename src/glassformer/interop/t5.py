"""Hugging Face T5 checkpoints (T5, T5 v1.1, Flan-T5) read into ``Seq2SeqTransformer``.

T5 is a pre-norm encoder-decoder with these parts (``Seq2SeqConfig``'s fields): no position
vectors but a learned bias on every self-attention score for each bucket of query–key
distances (``positional="relative"``; the encoder's buckets tell before from after, the
decoder's look back only; the first layer of each stack owns the table), RMSNorm without
biases (``norm="rms"``, ``bias=False``), scores not divided by √Dh (``attention_scale=1``),
a ReLU MLP (T5) or a gated GELU one (v1.1, Flan-T5: ``geglu_tanh``), heads whose total
width may differ from d_model (``head_dim`` = ``d_kv``), one table for source and target,
and where the head is tied to it, the decoder's states × d_model^-½ first
(``scale_output``). Its decoder starts from the pad id.

    T5 (T5ForConditionalGeneration)                  glassformer Seq2SeqTransformer
    shared                                           encoder.embed, decoder.embed
    {enc,dec}oder.block.0.layer.0.SelfAttention
        .relative_attention_bias                     {enc,dec}oder.relative_bias.embedding
    …block.N.layer.0.SelfAttention.q/k/v/o           …blocks.N.attn.qkv_proj / out_proj
    …block.N.layer.0.layer_norm                      …blocks.N.ln1
    decoder.block.N.layer.1.EncDecAttention.q/k/v/o  decoder.blocks.N.cross_attn.…
    decoder.block.N.layer.1.layer_norm               decoder.blocks.N.ln_cross
    …block.N.layer.-1.DenseReluDense.wi / wo         …blocks.N.mlp.linear1 / linear2
    …DenseReluDense.wi_0 / wi_1 / wo (gated)         …blocks.N.mlp.gate_proj / up_proj / down_proj
    …block.N.layer.-1.layer_norm                     …blocks.N.ln2
    {enc,dec}oder.final_layer_norm                   {enc,dec}oder.ln_final
    lm_head (or shared, tied)                        output_proj (its bias zero)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.errors import shown
from glassformer.interop._hf import (
    build_config,
    converted,
    model_holding,
    naming,
    read_config,
    read_weights,
    taker,
)
from glassformer.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

FEED_FORWARD = {"relu": "relu", "gated-gelu": "geglu_tanh"}
_MLP = {
    "relu": (("linear1", "wi"), ("linear2", "wo")),
    "geglu_tanh": (("gate_proj", "wi_0"), ("up_proj", "wi_1"), ("down_proj", "wo")),
}


def t5_config(hf: dict[str, Any]) -> Seq2SeqConfig:
    """A ``Seq2SeqConfig`` equal to a T5 ``config.json``; refuses what it cannot express."""
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in FEED_FORWARD:
        raise CheckpointError(
            f"T5 feed_forward_proj={shown(proj)} is not supported {sorted(FEED_FORWARD)}"
        )
    if hf.get("is_decoder") or hf.get("is_encoder_decoder") is False:
        raise CheckpointError("T5 is_encoder_decoder=False (one stack) is not supported")
    d_model, heads, d_kv = hf["d_model"], hf["num_heads"], hf["d_kv"]
    tied = hf.get("tie_word_embeddings", True) is not False
    # transformers 5 writes tie_word_embeddings true for every T5 and keeps whether the
    # states are scaled (the file's first tie) in scale_decoder_outputs.
    scaled = bool(hf.get("scale_decoder_outputs", tied))
    pad = hf.get("pad_token_id", 0)
    return Seq2SeqConfig(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=d_model,
        num_heads=heads,
        head_dim=None if heads * d_kv == d_model else d_kv,
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        d_ff=hf["d_ff"],
        max_len=hf.get("n_positions", 512),
        dropout=0.0,
        attention_dropout=0.0,
        activation=FEED_FORWARD[proj],  # type: ignore[arg-type]
        norm_first=True,
        norm="rms",
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        bias=False,
        positional="relative",  # type: ignore[arg-type]
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        attention_scale=1.0,
        scale_embeddings=False,
        share_embeddings=True,
        tie_output=tied,
        scale_output=scaled,
        pad_id=pad,
        bos_id=hf.get("decoder_start_token_id", pad),
        eos_id=hf.get("eos_token_id", 1),
    )


def from_t5_state(state: dict[str, Tensor], config: Seq2SeqConfig) -> dict[str, Tensor]:
    """T5 weights under Hugging Face's names → a ``Seq2SeqTransformer`` state dict."""
    take = taker(state, "T5")
    shared = take("shared.weight")
    out = {"encoder.embed.weight": shared, "decoder.embed.weight": shared}
    mlp = _MLP[config.activation]
    for side in ("encoder", "decoder"):
        layers = config.num_encoder_layers if side == "encoder" else config.num_decoder_layers
        first = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out[f"{side}.relative_bias.embedding.weight"] = take(first)
        out[f"{side}.ln_final.weight"] = take(f"{side}.final_layer_norm.weight")
        for i in range(layers):
            theirs, ours = f"{side}.block.{i}.layer.", f"{side}.blocks.{i}."
            attentions = [("0.SelfAttention", "attn", "ln1")]
            if side == "decoder":
                attentions.append(("1.EncDecAttention", "cross_attn", "ln_cross"))
            for their_attn, our_attn, norm in attentions:
                out[f"{ours}{our_attn}.qkv_proj.weight"] = torch.cat(
                    [take(f"{theirs}{their_attn}.{p}.weight") for p in "qkv"]
                )
                out[f"{ours}{our_attn}.out_proj.weight"] = take(f"{theirs}{their_attn}.o.weight")
                out[f"{ours}{norm}.weight"] = take(f"{theirs}{their_attn[0]}.layer_norm.weight")
            ff = len(attentions)  # the feed-forward is the block's last layer
            for our_name, their_name in mlp:
                out[f"{ours}mlp.{our_name}.weight"] = take(
                    f"{theirs}{ff}.DenseReluDense.{their_name}.weight"
                )
            out[f"{ours}ln2.weight"] = take(f"{theirs}{ff}.layer_norm.weight")
    head = shared if config.tie_output else take("lm_head.weight")
    out["output_proj.weight"] = head
    out["output_proj.bias"] = torch.zeros(head.size(0), dtype=head.dtype)  # T5 has none
    return out


def load_t5(path: str | Path) -> Seq2SeqTransformer:
    """A ``Seq2SeqTransformer`` with the weights of the Hugging Face T5 directory ``path``.

    A file holding an ``lm_head`` unlike its ``shared`` table has an untied head, whatever
    its config says (transformers 5 writes ``tie_word_embeddings: true`` for every T5, and
    then does not tie such a head either)."""
    path = Path(path)
    hf = read_config(path, "t5")
    with naming(path):
        state = read_weights(path)
    head, shared = state.get("lm_head.weight"), state.get("shared.weight")
    if head is not None and shared is not None and not torch.equal(head, shared):
        hf = {**hf, "tie_word_embeddings": False}
    config = build_config(t5_config, hf, path)
    with naming(path):
        return model_holding(Seq2SeqTransformer, config, converted(from_t5_state, state, config))


register_format("t5", "seq2seq", load_t5)
