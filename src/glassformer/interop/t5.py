"""Hugging Face T5 checkpoints (T5, T5 v1.1, Flan-T5) read into ``Seq2SeqTransformer``.

T5's config and parts are ``models.families.t5``'s; this file maps its weights (the first
layer of each stack owns the position-bias table). Its decoder starts from the pad id.

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

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import (
    build_config,
    converted,
    model_holding,
    naming,
    read_config,
    read_weights,
    taker,
)
from glassformer.models.families import T5Config
from glassformer.models.seq2seq import Seq2SeqTransformer

_MLP = {
    "relu": (("linear1", "wi"), ("linear2", "wo")),
    "geglu_tanh": (("gate_proj", "wi_0"), ("up_proj", "wi_1"), ("down_proj", "wo")),
}


def from_t5_state(state: dict[str, Tensor], config: T5Config) -> dict[str, Tensor]:
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
    config = build_config(T5Config.from_hf, hf, path)
    with naming(path):
        return model_holding(Seq2SeqTransformer, config, converted(from_t5_state, state, config))


register_format("t5", "seq2seq", load_t5)
