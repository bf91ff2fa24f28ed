"""Hugging Face BERT checkpoints (and sentence-transformers' MiniLM) into ``BertEncoder``.

    BERT (BertModel)                               glassformer BertEncoder
    embeddings.word/position/token_type_embeddings embed / pos_embed / token_type
    embeddings.LayerNorm                           ln_embed
    encoder.layer.N.attention.self.query/key/value blocks.N.attn.qkv_proj
                                                   (the three stacked as rows [q; k; v])
    encoder.layer.N.attention.output.dense         blocks.N.attn.out_proj
    encoder.layer.N.attention.output.LayerNorm     blocks.N.ln1
    encoder.layer.N.intermediate.dense             blocks.N.mlp.linear1
    encoder.layer.N.output.dense                   blocks.N.mlp.linear2
    encoder.layer.N.output.LayerNorm               blocks.N.ln2
    pooler.dense                                   pooler

BERT is post-norm with GELU (erf) and LayerNorm eps 1e-12: glassformer's post-norm block
(``models.parts.bert``) is the same computation. The released checkpoints (bert-base-uncased
and its kin) keep the original TensorFlow port's names: a ``bert.`` prefix and LayerNorm
``gamma``/``beta`` for ``weight``/``bias``; both are read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.interop._hf import (
    build_config,
    converted,
    load_weights,
    naming,
    read_config,
    read_weights,
)
from glassformer.models.bert import BertConfig, BertEncoder

_LAYER = (
    ("attn.out_proj", "attention.output.dense"),
    ("ln1", "attention.output.LayerNorm"),
    ("mlp.linear1", "intermediate.dense"),
    ("mlp.linear2", "output.dense"),
    ("ln2", "output.LayerNorm"),
)
_TOP = (
    ("embed", "embeddings.word_embeddings"),
    ("pos_embed", "embeddings.position_embeddings"),
    ("token_type", "embeddings.token_type_embeddings"),
    ("ln_embed", "embeddings.LayerNorm"),
)


def from_bert_state(state: dict[str, Tensor], config: BertConfig) -> dict[str, Tensor]:
    state = {_current_name(k.removeprefix("bert.")): v for k, v in state.items()}

    def take(name: str) -> Tensor:
        if name not in state:
            raise CheckpointError(f"BERT weights have no {name!r}")
        return state[name]

    out: dict[str, Tensor] = {}
    for ours, theirs in _TOP:
        out[f"{ours}.weight"] = take(f"{theirs}.weight")
        if ours == "ln_embed":
            out[f"{ours}.bias"] = take(f"{theirs}.bias")
    for i in range(config.num_layers):
        ours, theirs = f"blocks.{i}.", f"encoder.layer.{i}."
        for part in ("weight", "bias"):
            out[f"{ours}attn.qkv_proj.{part}"] = torch.cat(
                [take(f"{theirs}attention.self.{x}.{part}") for x in ("query", "key", "value")]
            )
            for mine, hf_name in _LAYER:
                out[f"{ours}{mine}.{part}"] = take(f"{theirs}{hf_name}.{part}")
    if config.pooler:
        out["pooler.weight"] = take("pooler.dense.weight")
        out["pooler.bias"] = take("pooler.dense.bias")
    return out


def _current_name(key: str) -> str:
    """``LayerNorm.gamma``/``.beta``, the released checkpoints' names → ``.weight``/``.bias``."""
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if "LayerNorm" in key and key.endswith(old):
            return key.removesuffix(old) + new
    return key


def load_bert(path: str | Path) -> BertEncoder:
    """A ``BertEncoder`` with the weights of a Hugging Face BERT directory, in eval mode.

    Checkpoints without a pooler (sentence-transformers') give a model without one.
    """
    path = Path(path)
    hf = read_config(path, "bert")
    with naming(path):
        state = read_weights(path)
    pooler = any(k.removeprefix("bert.").startswith("pooler.") for k in state)
    config = build_config(lambda values: BertConfig.from_hf(values, pooler=pooler), hf, path)
    with naming(path):
        return load_weights(BertEncoder, config, converted(from_bert_state, state, config))


register_format("bert", "bert", load_bert)
