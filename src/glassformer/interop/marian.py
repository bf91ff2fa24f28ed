"""Hugging Face MarianMT checkpoints (Helsinki-NLP's opus-mt translators) read into
``Seq2SeqTransformer``: the encoder-decoder of "Attention Is All You Need".

Marian's config and parts are ``models.families.marian``'s (the paper's post-norm
translator, sines then cosines); this file maps its weights, ``final_logits_bias`` being the
output projection's bias.

    Marian (MarianMTModel)                                    glassformer Seq2SeqTransformer
    model.shared / model.encoder.embed_tokens                 encoder.embed
    model.decoder.embed_tokens                                decoder.embed
    model.{encoder,decoder}.layers.N.self_attn.q/k/v_proj     …blocks.N.attn.qkv_proj (stacked)
    model.{encoder,decoder}.layers.N.self_attn.out_proj       …blocks.N.attn.out_proj
    model.{encoder,decoder}.layers.N.self_attn_layer_norm     …blocks.N.ln1
    model.decoder.layers.N.encoder_attn.q/k/v_proj / out_proj decoder.blocks.N.cross_attn.…
    model.decoder.layers.N.encoder_attn_layer_norm            decoder.blocks.N.ln_cross
    model.{encoder,decoder}.layers.N.fc1 / fc2                …blocks.N.mlp.linear1 / linear2
    model.{encoder,decoder}.layers.N.final_layer_norm         …blocks.N.ln2
    lm_head, final_logits_bias                                output_proj.weight, .bias
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import MarianConfig
from glassformer.models.seq2seq import Seq2SeqTransformer

_LAYER = (
    ("ln1", "self_attn_layer_norm"),
    ("attn.out_proj", "self_attn.out_proj"),
    ("ln2", "final_layer_norm"),
    ("mlp.linear1", "fc1"),
    ("mlp.linear2", "fc2"),
)
_CROSS = (("ln_cross", "encoder_attn_layer_norm"), ("cross_attn.out_proj", "encoder_attn.out_proj"))


def from_marian_state(state: dict[str, Tensor], config: MarianConfig) -> dict[str, Tensor]:
    """Marian weights under Hugging Face's names → a ``Seq2SeqTransformer`` state dict."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, "Marian")
    out: dict[str, Tensor] = {}
    for side in ("encoder", "decoder"):
        name = f"{side}.embed_tokens.weight"  # the shared table where the file has one only
        out[f"{side}.embed.weight"] = take(name if name in state else "shared.weight")
        layers = config.num_encoder_layers if side == "encoder" else config.num_decoder_layers
        for i in range(layers):
            theirs, ours = f"{side}.layers.{i}.", f"{side}.blocks.{i}."
            names = _LAYER + (_CROSS if side == "decoder" else ())
            attentions = (
                ("self_attn", "attn"),
                *([("encoder_attn", "cross_attn")] * (side == "decoder")),
            )
            for part in ("weight", "bias"):
                for name, their_name in names:
                    out[f"{ours}{name}.{part}"] = take(f"{theirs}{their_name}.{part}")
                for their_attn, our_attn in attentions:
                    out[f"{ours}{our_attn}.qkv_proj.{part}"] = torch.cat(
                        [take(f"{theirs}{their_attn}.{p}_proj.{part}") for p in "qkv"]
                    )
    head = state.get("lm_head.weight")
    out["output_proj.weight"] = out["decoder.embed.weight"] if head is None else head
    out["output_proj.bias"] = take("final_logits_bias").reshape(-1)
    return out


def load_marian(path: str | Path) -> Seq2SeqTransformer:
    """A ``Seq2SeqTransformer`` with the weights of the Hugging Face Marian directory ``path``."""
    return load_directory(
        Seq2SeqTransformer, path, "marian", MarianConfig.from_hf, from_marian_state
    )


register_format("marian", "seq2seq", load_marian)
