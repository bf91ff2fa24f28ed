"""Hugging Face MarianMT checkpoints (Helsinki-NLP's opus-mt translators) read into
``Seq2SeqTransformer``: the encoder-decoder of "Attention Is All You Need".

Marian is the paper's post-norm translator with: sinusoids laid out as all sines then all
cosines (``positional="sinusoidal_halves"``, never stored), embeddings × √d_model where
``scale_embedding``, one shared table for source, target and output where the config
shares them, a SiLU ("swish") or GELU MLP, no final norm, and ``final_logits_bias`` (the
output projection's bias). Its decoder starts from the pad id (``decoder_start_token_id``),
so glassformer's ``bos_id`` is the pad id too.

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
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.errors import shown
from glassformer.interop._hf import load_directory, taker
from glassformer.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu",
               "gelu_new": "gelu_tanh"}  # fmt: skip
_LAYER = (
    ("ln1", "self_attn_layer_norm"),
    ("attn.out_proj", "self_attn.out_proj"),
    ("ln2", "final_layer_norm"),
    ("mlp.linear1", "fc1"),
    ("mlp.linear2", "fc2"),
)
_CROSS = (("ln_cross", "encoder_attn_layer_norm"), ("cross_attn.out_proj", "encoder_attn.out_proj"))


def marian_config(hf: dict[str, Any]) -> Seq2SeqConfig:
    """A ``Seq2SeqConfig`` equal to a Marian ``config.json``; refuses what it cannot express."""
    act = hf.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"Marian activation_function={shown(act)} is not supported")
    shapes = {(hf[f"{side}_attention_heads"], hf[f"{side}_ffn_dim"])
              for side in ("encoder", "decoder")}  # fmt: skip
    if len(shapes) != 1:
        raise CheckpointError(
            f"Marian with encoder and decoder of different heads or widths {sorted(shapes)} "
            "is not supported"
        )
    heads, d_ff = shapes.pop()
    shared = hf.get("share_encoder_decoder_embeddings", True)
    vocab = hf["vocab_size"]
    target = vocab if shared else hf.get("decoder_vocab_size") or vocab
    pad = hf.get("pad_token_id", vocab - 1)
    return Seq2SeqConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=target,
        d_model=hf["d_model"],
        num_heads=heads,
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        d_ff=d_ff,
        max_len=hf.get("max_position_embeddings", 1024),
        dropout=0.0,
        attention_dropout=0.0,
        activation=ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_first=False,
        positional="sinusoidal_halves",
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        share_embeddings=bool(shared),
        tie_output=bool(hf.get("tie_word_embeddings", True)),
        pad_id=pad,
        bos_id=hf.get("decoder_start_token_id", pad),
        eos_id=hf.get("eos_token_id", 0),
    )


def from_marian_state(state: dict[str, Tensor], config: Seq2SeqConfig) -> dict[str, Tensor]:
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
    return load_directory(Seq2SeqTransformer, path, "marian", marian_config, from_marian_state)


register_format("marian", "seq2seq", load_marian)
