"""Checkpoints written before the blocks were built from parts, read by today's models.

Until glassformer 0.1.0 (commit 7a7e08c) a model's weights had other names: the blocks sat
in a stack (``blocks.layers.3``, ``encoder.layers.3``) and a block's parts were named as
``nn.TransformerEncoderLayer`` names them. Today every model names them alike:

    before                                    today
    embed.token.embedding.                    embed.
    embed.position.embedding.                 pos_embed.
    embed.token_type. / embed.norm. (BERT)    token_type. / ln_embed.
    patches. / position.embedding. (ViT)      embed. / pos_embed.
    {blocks|encoder}.layers.N.                blocks.N.         (one-stack models)
    {blocks|encoder}.norm.                    ln_final.
    src_embed. / tgt_embed. (translator)      encoder. / decoder. (+ the embed renames)
    {encoder|decoder}.layers.N. / .norm.      {encoder|decoder}.blocks.N. / .ln_final.
      self_attn. / feed_forward. / norm1.       attn. / mlp. / ln1.
      norm2.                                    ln2. (ln_cross. in a translator's decoder)
      norm3. (decoder)                          ln2.

``upgrade_state_dict`` renames an old state dict; checkpoints and run directories load
through it. A run's optimizer state lists its parameters in the order the model had them
then; ``legacy_parameter_order`` gives today's names in that order, so a run resumes
exactly where it stopped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_ONE_STACK = (  # one-stack models: the stack's parts moved up to the model
    (r"^embed\.token\.embedding\.", "embed."),
    (r"^embed\.position\.embedding\.", "pos_embed."),
    (r"^embed\.token_type\.", "token_type."),
    (r"^embed\.norm\.", "ln_embed."),
    (r"^patches\.", "embed."),
    (r"^position\.embedding\.", "pos_embed."),
    (r"^(?:blocks|encoder)\.layers\.(\d+)\.", r"blocks.\1."),
    (r"^(?:blocks|encoder)\.norm\.", "ln_final."),
)
_TRANSLATOR = (  # the translator: each side's embeddings moved into its stack
    (r"^src_embed\.token\.embedding\.", "encoder.embed."),
    (r"^src_embed\.position\.embedding\.", "encoder.pos_embed."),
    (r"^tgt_embed\.token\.embedding\.", "decoder.embed."),
    (r"^tgt_embed\.position\.embedding\.", "decoder.pos_embed."),
    (r"^(encoder|decoder)\.layers\.(\d+)\.", r"\1.blocks.\2."),
    (r"^(encoder|decoder)\.norm\.", r"\1.ln_final."),
)
_PARTS = ((r"\.self_attn\.", ".attn."), (r"\.feed_forward\.", ".mlp."), (r"\.norm1\.", ".ln1."))
_ENCODER_NORMS = ((r"\.norm2\.", ".ln2."),)
_DECODER_NORMS = ((r"\.norm2\.", ".ln_cross."), (r"\.norm3\.", ".ln2."))
_OLD_BLOCK = re.compile(r"(^|\.)layers\.\d+\.")
_OLD_TOP = ("embed.token.", "src_embed.", "patches.")

# The translator's top-level attributes as they were, in the order they were created: its
# parameters came in this order (the other kinds' still come in the order they came).
_TRANSLATOR_ORDER = ("src_embed", "tgt_embed", "encoder", "decoder", "output_proj")


def is_legacy(keys: Any) -> bool:
    """Whether state-dict keys use the names from before the blocks took parts."""
    return any(_OLD_BLOCK.search(k) or k.startswith(_OLD_TOP) for k in keys)


def legacy_name(kind: str, name: str) -> str:
    """Today's name of an old parameter ``name`` of a model of ``kind``."""
    in_block = _OLD_BLOCK.search(name) is not None
    in_decoder_block = kind == "seq2seq" and name.startswith("decoder.layers.")
    for pattern, replacement in _TRANSLATOR if kind == "seq2seq" else _ONE_STACK:
        name = re.sub(pattern, replacement, name)
    if in_block:
        for pattern, replacement in (
            *_PARTS,
            *(_DECODER_NORMS if in_decoder_block else _ENCODER_NORMS),
        ):
            name = re.sub(pattern, replacement, name)
    return name


def upgrade_state_dict(kind: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with old names renamed to today's (a current state dict comes back as it is)."""
    if not is_legacy(state):
        return dict(state)
    return {legacy_name(kind, k): v for k, v in state.items()}


def legacy_parameter_order(model: Any) -> list[str]:
    """The model's parameter names (today's) in the order the model had its parameters
    before the blocks took parts: how an old run's optimizer state lists them."""
    names = [name for name, _ in model.named_parameters()]
    if model.kind != "seq2seq":
        return names
    return sorted(names, key=lambda name: _TRANSLATOR_ORDER.index(_translator_top(name)))


def _translator_top(name: str) -> str:
    """The translator's attribute that held parameter ``name`` (today's) before."""
    side, _, rest = name.partition(".")
    if side in ("encoder", "decoder") and rest.startswith(("embed.", "pos_embed.")):
        return "src_embed" if side == "encoder" else "tgt_embed"
    return side
