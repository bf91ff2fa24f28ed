"""Weights between ``torch.nn``'s Transformer layers and glassformer's blocks.

``nn.MultiheadAttention`` keeps q, k, v in one ``in_proj_weight`` with rows [q; k; v],
each head-major — the layout of glassformer's ``qkv_proj`` — so converting is renaming:

    nn.TransformerEncoderLayer / DecoderLayer      glassformer EncoderLayer / DecoderLayer
    self_attn.in_proj_weight / in_proj_bias        self_attn.qkv_proj.weight / .bias
    multihead_attn.*                               cross_attn.*
    linear1.*, linear2.*                           feed_forward.linear1.*, feed_forward.linear2.*
    norm1..3, out_proj                             unchanged

Stacks (``nn.TransformerEncoder``/``Decoder``) keep ``layers.N.`` and ``norm`` as they are.
"""

from __future__ import annotations

from torch import Tensor

# (torch.nn name piece, glassformer name piece), applied to every key.
_RENAMES = (
    ("in_proj_weight", "qkv_proj.weight"),
    ("in_proj_bias", "qkv_proj.bias"),
    ("multihead_attn.", "cross_attn."),
    ("linear1.", "feed_forward.linear1."),
    ("linear2.", "feed_forward.linear2."),
)


def from_torch_nn(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ``torch.nn`` Transformer layer/stack state dict, renamed for glassformer."""
    out = {}
    for key, value in state_dict.items():
        for theirs, ours in _RENAMES:
            key = key.replace(theirs, ours)
        out[key] = value
    return out


def to_torch_nn(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A glassformer layer/stack state dict, renamed for ``torch.nn``."""
    out = {}
    for key, value in state_dict.items():
        for theirs, ours in reversed(_RENAMES):
            key = key.replace(ours, theirs)
        out[key] = value
    return out
