"""Weights between ``torch.nn``'s Transformer layers and glassformer's blocks.

``nn.MultiheadAttention`` keeps q, k, v in one ``in_proj_weight`` with rows [q; k; v],
each head-major — the layout of glassformer's ``qkv_proj`` — so converting is renaming:

    nn.TransformerEncoderLayer / DecoderLayer      glassformer EncoderLayer / DecoderLayer
    self_attn.in_proj_weight / in_proj_bias        attn.qkv_proj.weight / .bias
    self_attn.out_proj                             attn.out_proj
    multihead_attn.*                               cross_attn.*
    linear1.*, linear2.*                           mlp.linear1.*, mlp.linear2.*
    norm1                                          ln1
    norm2 (encoder) / norm2, norm3 (decoder)       ln2 / ln_cross, ln2
    (stacks) layers.N. / norm.                     blocks.N. / ln_final.

A decoder layer is told apart by its ``multihead_attn`` (``cross_attn``) weights.
"""

from __future__ import annotations

import re

from torch import Tensor

# (torch.nn name pattern, glassformer name), applied in order to every key (a name starts
# with "." so that patterns match whole parts).
_COMMON = (
    (r"\.self_attn\.in_proj_(weight|bias)$", r".attn.qkv_proj.\1"),
    (r"\.self_attn\.", ".attn."),
    (r"\.multihead_attn\.in_proj_(weight|bias)$", r".cross_attn.qkv_proj.\1"),
    (r"\.multihead_attn\.", ".cross_attn."),
    (r"\.in_proj_(weight|bias)$", r".qkv_proj.\1"),  # an attention module's own
    (r"\.linear([12])\.", r".mlp.linear\1."),
    (r"\.layers\.(\d+)\.", r".blocks.\1."),
    (r"^\.norm\.", ".ln_final."),
    (r"\.norm1\.", ".ln1."),
)
_ENCODER = ((r"\.norm2\.", ".ln2."),)
_DECODER = ((r"\.norm2\.", ".ln_cross."), (r"\.norm3\.", ".ln2."))


def from_torch_nn(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ``torch.nn`` Transformer layer/stack state dict, renamed for glassformer."""
    decoder = any("multihead_attn." in key for key in state_dict)
    rules = (*_COMMON, *(_DECODER if decoder else _ENCODER))
    return {_rename(key, rules): value for key, value in state_dict.items()}


def to_torch_nn(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A glassformer layer/stack state dict, renamed for ``torch.nn``."""
    decoder = any("cross_attn." in key for key in state_dict)
    back = (
        (r"\.attn\.qkv_proj\.(weight|bias)$", r".self_attn.in_proj_\1"),
        (r"\.cross_attn\.qkv_proj\.(weight|bias)$", r".multihead_attn.in_proj_\1"),
        (r"\.cross_attn\.", ".multihead_attn."),
        (r"\.attn\.", ".self_attn."),
        (r"^\.qkv_proj\.(weight|bias)$", r".in_proj_\1"),  # an attention module's own
        (r"\.mlp\.linear([12])\.", r".linear\1."),
        (r"\.blocks\.(\d+)\.", r".layers.\1."),
        (r"^\.ln_final\.", ".norm."),
        (r"\.ln1\.", ".norm1."),
        *(((r"\.ln_cross\.", ".norm2."), (r"\.ln2\.", ".norm3.")) if decoder else
          ((r"\.ln2\.", ".norm2."),)),
    )  # fmt: skip
    return {_rename(key, back): value for key, value in state_dict.items()}


def _rename(key: str, rules) -> str:
    key = "." + key
    for pattern, replacement in rules:
        key = re.sub(pattern, replacement, key)
    return key[1:]
