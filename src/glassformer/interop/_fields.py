"""What each Hugging Face config field glassformer reads must hold, checked in one place.

A ``config.json`` is someone else's file. Its numbers decide how many layers are listed and
how large the tables are before any weight is read, and a value no family's reader expects
(heads 0, Gemma's window pattern 0, ``rope_scaling`` as a list, ``Infinity`` in
``rotary_pct``) would end in a ZeroDivisionError or an AttributeError deep inside it.
``check_fields`` holds every field any family reads against this one table, before the
family's reader sees the config (a GGUF file's metadata, read as a config, too), and refuses
the first bad one in one line naming the field, its value and what it must be. A field that
is absent or null is the reader's to default; fields no reader uses are not looked at.

The limits are sanity bounds, far above any released model (Llama 3.1 405B: 126 layers,
width 16384; Gemma 3: a vocabulary of 262144), low enough that a list or a loop per layer
cannot take the machine. Whether the sizes fit the weights is checked against the weights
themselves (``_hf.model_holding``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from glassformer.errors import shown
from glassformer.models.base import MAX_LAYERS

MAX_WIDTH = 1 << 20  # widths and head counts
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 26
MAX_EXPERTS = 1 << 12  # DeepSeek-V3 has 256 routed experts

Rule = tuple[Callable[[Any], bool], str]  # (does the value fit, what it must be)


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(low: int, high: int) -> Rule:
    """An integer in [low, high] (not a bool, not a float)."""
    return (lambda v: _is_integer(v) and low <= v <= high), f"an integer in [{low}, {high}]"


def number(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Rule:
    """A finite number between ``low`` and ``high`` (each excluded where ``open_*``)."""

    def fits(v: Any) -> bool:
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
            return False
        x = float(v)
        return (x > low if open_low else x >= low) and (x < high if open_high else x <= high)

    if high == math.inf:
        return fits, f"a finite number {'>' if open_low else '>='} {low:g}"
    bounds = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    return fits, f"a finite number in {bounds}"


POSITIVE = number(0.0, math.inf, open_low=True, open_high=True)
EPSILON = number(0.0, 1.0)
FRACTION = number(0.0, 1.0, open_low=True)  # of each head's features: (0, 1]
PROBABILITY = number(0.0, 1.0, open_high=True)  # dropout: [0, 1)
FLAG: Rule = (lambda v: isinstance(v, bool), "true or false")
NAME: Rule = (lambda v: isinstance(v, str), "a string")
MAPPING: Rule = (lambda v: isinstance(v, dict), "a JSON object")
NAMES: Rule = (
    lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a list of strings",
)


def _fields(names: str, rule: Rule) -> dict[str, Rule]:
    return dict.fromkeys(names.split(), rule)


FIELDS: dict[str, Rule] = {
    **_fields("num_hidden_layers n_layer num_layers num_decoder_layers encoder_layers "
              "decoder_layers sliding_window_pattern _sliding_window_pattern",
              integer(1, MAX_LAYERS)),
    "max_window_layers": integer(0, MAX_LAYERS),
    **_fields("num_attention_heads num_key_value_heads n_head num_heads "
              "encoder_attention_heads decoder_attention_heads pretraining_tp",
              integer(1, MAX_WIDTH)),
    **_fields("hidden_size n_embd d_model intermediate_size n_inner d_ff ffn_dim "
              "encoder_ffn_dim decoder_ffn_dim head_dim d_kv word_embed_proj_dim "
              "relative_attention_num_buckets relative_attention_max_distance",
              integer(1, MAX_WIDTH)),
    **_fields("moe_intermediate_size shared_expert_intermediate_size rotary_dim",
              integer(1, MAX_WIDTH)),
    **_fields("num_local_experts num_experts num_experts_per_tok", integer(1, MAX_EXPERTS)),
    "decoder_sparse_step": integer(1, MAX_LAYERS),
    "mlp_only_layers": (lambda v: isinstance(v, list) and all(_is_integer(x) for x in v),
                        "a list of layer indices"),
    **_fields("vocab_size decoder_vocab_size type_vocab_size", integer(1, MAX_VOCAB)),
    **_fields("max_position_embeddings n_positions", integer(1, MAX_POSITIONS)),
    **_fields("pad_token_id decoder_start_token_id", integer(0, MAX_VOCAB)),
    **_fields("rope_theta rotary_emb_base rope_local_base_freq query_pre_attn_scalar "
              "final_logit_softcapping attn_logit_softcapping clip_qkv", POSITIVE),
    "original_max_position_embeddings": integer(1, MAX_POSITIONS),
    **_fields("rms_norm_eps layer_norm_eps layer_norm_epsilon", EPSILON),
    **_fields("rotary_pct partial_rotary_factor", FRACTION),
    **_fields("resid_pdrop attn_pdrop hidden_dropout_prob attention_probs_dropout_prob "
              "attention_dropout", PROBABILITY),
    **_fields("model_type hidden_act hidden_activation activation_function "
              "feed_forward_proj position_embedding_type rope_type", NAME),
    **_fields("tie_word_embeddings attention_bias mlp_bias use_parallel_residual "
              "use_sliding_window scale_embedding share_encoder_decoder_embeddings "
              "do_layer_norm_before _remove_final_layer_norm enable_bias "
              "layer_norm_elementwise_affine is_decoder is_encoder_decoder "
              "scale_attn_by_inverse_layer_idx reorder_and_upcast_attn scale_attn_weights "
              "use_bidirectional_attention scale_decoder_outputs qk_layernorm norm_topk_prob "
              "qkv_bias", FLAG),
    # rope_parameters may hold one table per kind of layer (Gemma 3's)
    **_fields("rope_scaling rope_parameters full_attention sliding_attention", MAPPING),
    "layer_types": NAMES,
}  # fmt: skip
NESTED = ("rope_scaling", "rope_parameters", "full_attention", "sliding_attention")
# (width, heads, head width): the width must split evenly into the heads where the config
# does not give each head's width itself (and where it does not, the family needs it to)
DIVIDES = (
    ("n_embd", "n_head", None),
    ("hidden_size", "num_attention_heads", "head_dim"),
    ("d_model", "encoder_attention_heads", None),
    ("d_model", "decoder_attention_heads", None),
)


def check_fields(config: dict[str, Any], prefix: str = "") -> None:
    """Refuse the first field of ``config`` that ``FIELDS`` knows and its value does not
    fit, in one ``ValueError`` naming it (``rope_parameters.full_attention.rope_theta`` for
    a nested one); the rope tables are looked into."""
    for name, value in config.items():
        rule = FIELDS.get(name)
        if value is None or rule is None:
            continue
        fits, words = rule
        if not fits(value):
            raise ValueError(f"{prefix}{name} is {_shown(value)}; it must be {words}")
        if name in NESTED:
            check_fields(value, f"{prefix}{name}.")
    for width, heads, head_width in DIVIDES:
        w, h = config.get(width), config.get(heads)
        if w is not None and h is not None and config.get(head_width or "") is None and w % h:
            raise ValueError(f"{width} is {_shown(w)}, not a multiple of {heads} ({_shown(h)})")


def _shown(value: Any) -> str:
    """The value as it is in config.json (NaN and Infinity as JSON spells them), cut short
    (``shown``): a field may hold a whole document."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return shown(value, 60)
