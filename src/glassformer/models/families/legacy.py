"""Configs saved before the families had files of their own, read as the family they describe.

Until then ``GPTConfig`` carried every family's parts as fields (``qk_norm``,
``sandwich_norms``, ``parallel``, ``embed_dim``, ``bias="qkv"``, ...). A checkpoint or run
saved that way names no family; its fields say which it is:

    sandwich_norms                      Gemma (3 with qk_norm, else 2)
    qk_norm                             Qwen3
    bias="qkv"                          Qwen2
    parallel or rotary_dim              GPT-NeoX
    embed_dim or final_norm=False       OPT

A config with none of them, its family fields at their old defaults, is the textbook GPT's
(Llama and Mistral were written that way too, and still are).

``Seq2SeqConfig`` gave up T5's parts (``positional="relative"``, ``relative_buckets``,
``relative_max_distance``, ``attention_scale``, ``scale_output``): a translator saved with
them reads as a T5 (``upgrade_translator``); Marian's were always the paper's translator's
own fields, and still are.
"""

from __future__ import annotations

from typing import Any

from glassformer.errors import shown
from glassformer.models.families.decoder import DecoderConfig
from glassformer.models.families.gemma import GemmaConfig
from glassformer.models.families.gpt_neox import GPTNeoXConfig
from glassformer.models.families.opt import OPTConfig
from glassformer.models.families.qwen2 import Qwen2Config
from glassformer.models.families.qwen3 import Qwen3Config
from glassformer.models.families.t5 import T5Config
from glassformer.models.families.translator import TranslatorConfig

# the fields GPTConfig gave up, at the values that meant "not this part"
REMOVED: dict[str, Any] = {
    "qk_norm": False, "rotary_dim": None, "parallel": False, "attention_scale": None,
    "sandwich_norms": False, "full_attention_layers": [], "rope_local_theta": None,
    "final_softcap": None, "attention_softcap": None, "embed_dim": None, "final_norm": True,
}  # fmt: skip
# GPTConfig's defaults for the fields a saved config may leave out
OLD_DEFAULTS: dict[str, Any] = dict(
    max_len=256, d_model=384, num_heads=6, num_layers=6, activation="gelu", norm_first=True,
    positional="learned", bias=True, tie_weights=True, layer_norm_eps=1e-5, norm="layer",
    rope_theta=10000.0, dropout=0.1, attention_dropout=0.0, qkv_bias=True, pad_id=0,
    attention_window=None, global_tokens=0, scale_embeddings=False,
)  # fmt: skip
SHARED = (
    "vocab_size", "max_len", "d_model", "num_heads", "num_kv_heads", "head_dim", "num_layers",
    "d_ff", "tie_weights", "dropout", "attention_dropout", "pad_id",
)  # fmt: skip
MODERN = dict(positional="rope", norm="rms", activation="swiglu", norm_first=True,
              scale_embeddings=False, global_tokens=0)  # fmt: skip
PLAIN = dict(norm="layer", bias=True, qkv_bias=True, scale_embeddings=False,
             attention_window=None, global_tokens=0)  # fmt: skip
# each family: the GPTConfig values its fixed parts were, and the removed fields it uses
EXPECTED: dict[type[DecoderConfig], tuple[dict[str, Any], set[str]]] = {
    GemmaConfig: (
        dict(positional="rope", norm="gemma_rms", activation="geglu_tanh", norm_first=True,
             bias=False, scale_embeddings=True, global_tokens=0),
        {"sandwich_norms", "qk_norm", "attention_scale", "full_attention_layers",
         "rope_local_theta", "final_softcap", "attention_softcap"},
    ),
    Qwen3Config: (
        {**MODERN, "bias": False, "qkv_bias": False}, {"qk_norm", "full_attention_layers"}
    ),
    Qwen2Config: ({**MODERN, "bias": "qkv", "qkv_bias": True}, {"full_attention_layers"}),
    GPTNeoXConfig: (
        {**PLAIN, "positional": "rope", "norm_first": True}, {"rotary_dim", "parallel"}
    ),
    OPTConfig: ({**PLAIN, "positional": "learned"}, {"embed_dim", "final_norm"}),
}  # fmt: skip


def upgrade(values: dict[str, Any]) -> dict[str, Any] | DecoderConfig:
    """``values`` of an old ``GPTConfig``: the family config they describe, or (no family
    part set) the same values without the fields GPTConfig gave up."""
    old = {**REMOVED, **{k: values[k] for k in REMOVED if k in values}}
    plain = {k: v for k, v in values.items() if k not in REMOVED}
    if old == REMOVED and plain.get("bias", True) != "qkv":
        return plain
    plain = {**OLD_DEFAULTS, **plain}
    family = _family(old, plain)
    expected, uses = EXPECTED[family]
    clash = {k: plain[k] for k, v in expected.items() if plain[k] != v}
    clash.update({k: old[k] for k in REMOVED if old[k] != REMOVED[k] and k not in uses})
    if clash:
        raise ValueError(
            f"this saved GPT config reads as {family.title} (its {_cause(old, plain)}) but "
            f"has {shown(clash)}, which {family.title} does not build; expected {expected}"
        )
    shared = {k: plain[k] for k in SHARED if k in plain}
    shared["d_ff"] = plain.get("d_ff") or 4 * plain["d_model"]
    shared["norm_eps"] = plain.get("norm_eps") or plain["layer_norm_eps"]
    return family(**shared, **_own(family, old, plain))


def _family(old: dict[str, Any], plain: dict[str, Any]) -> type[DecoderConfig]:
    if old["sandwich_norms"]:
        return GemmaConfig
    if old["qk_norm"]:
        return Qwen3Config
    if plain.get("bias") == "qkv":
        return Qwen2Config
    if old["parallel"] or old["rotary_dim"] is not None:
        return GPTNeoXConfig
    if old["embed_dim"] is not None or not old["final_norm"]:
        return OPTConfig
    set_ = sorted(k for k, v in old.items() if v != REMOVED[k])
    raise ValueError(f"this saved GPT config sets {set_}, which no family builds alone")


def _cause(old: dict[str, Any], plain: dict[str, Any]) -> str:
    set_ = [f"{k}={old[k]!r}" for k in REMOVED if old[k] != REMOVED[k]]
    return ", ".join(set_ or [f"bias={plain.get('bias')!r}"])


def _own(family: type[DecoderConfig], old: dict[str, Any], plain: dict[str, Any]) -> dict:
    """The family's own fields from the old ones."""
    windows = dict(attention_window=plain.get("attention_window"),
                   full_attention_layers=tuple(old["full_attention_layers"]))  # fmt: skip
    theta = plain.get("rope_theta", 10000.0)
    if family is GemmaConfig:
        return dict(version=3 if old["qk_norm"] else 2, rope_theta=theta,
                    rope_local_theta=old["rope_local_theta"], **windows,
                    attention_scale=old["attention_scale"] or _width(plain) ** -0.5,
                    attention_softcap=old["attention_softcap"],
                    final_softcap=old["final_softcap"])  # fmt: skip
    if family in (Qwen2Config, Qwen3Config):
        return dict(rope_theta=theta, bias=plain.get("bias") is True, **windows)
    if family is GPTNeoXConfig:
        return dict(activation=plain.get("activation", "gelu"), rope_theta=theta,
                    rotary_dim=old["rotary_dim"], parallel=old["parallel"])  # fmt: skip
    return dict(activation=plain.get("activation", "relu"),
                norm_first=plain.get("norm_first", True), final_norm=old["final_norm"],
                embed_dim=old["embed_dim"])  # fmt: skip


def _width(plain: dict[str, Any]) -> int:
    return int(plain.get("head_dim") or plain["d_model"] // plain["num_heads"])


# the fields Seq2SeqConfig gave up (T5's), at the values that meant "not this part"
T5_REMOVED: dict[str, Any] = {"relative_buckets": 32, "relative_max_distance": 128,
                              "attention_scale": None, "scale_output": False}  # fmt: skip
# what T5's fixed parts were as Seq2SeqConfig fields
T5_EXPECTED: dict[str, Any] = dict(positional="relative", norm="rms", bias=False,
                                   norm_first=True, attention_scale=1.0, scale_embeddings=False,
                                   share_embeddings=True, attention_window=None)  # fmt: skip
T5_SHARED = ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "head_dim",
             "num_encoder_layers", "num_decoder_layers", "d_ff", "max_len", "dropout",
             "attention_dropout", "pad_id", "bos_id", "eos_id", "tie_output")  # fmt: skip
# Seq2SeqConfig's defaults for the fields a saved config may leave out
SEQ2SEQ_DEFAULTS: dict[str, Any] = dict(
    num_encoder_layers=6, num_decoder_layers=6, max_len=5000, d_model=512, num_heads=8,
    d_ff=2048, dropout=0.1, attention_dropout=0.0, activation="relu", norm_first=False,
    positional="sinusoidal", scale_embeddings=True, share_embeddings=False, tie_output=False,
    pad_id=0, bos_id=1, eos_id=2, norm="layer", layer_norm_eps=1e-5, bias=True,
    attention_window=None,
)  # fmt: skip


def upgrade_translator(values: dict[str, Any]) -> dict[str, Any] | TranslatorConfig:
    """``values`` of an old ``Seq2SeqConfig``: a T5 where they describe one, else the same
    values without the fields Seq2SeqConfig gave up (each at its old default)."""
    old = {**T5_REMOVED, **{k: values[k] for k in T5_REMOVED if k in values}}
    plain = {k: v for k, v in values.items() if k not in T5_REMOVED}
    if old == T5_REMOVED and plain.get("positional") != "relative":
        return plain
    every = {**SEQ2SEQ_DEFAULTS, **plain, **old}
    clash = {k: every[k] for k, v in T5_EXPECTED.items() if every[k] != v}
    if every["activation"] not in ("relu", "geglu_tanh"):
        clash["activation"] = every["activation"]
    if clash:
        raise ValueError(
            f"this saved translator config reads as T5 (relative positions, T5's fields) but "
            f"has {shown(clash)}, which T5 does not build; expected {T5_EXPECTED}"
        )
    return T5Config(
        **{k: every[k] for k in T5_SHARED}, activation=every["activation"],
        norm_eps=every["layer_norm_eps"], relative_buckets=old["relative_buckets"],
        relative_max_distance=old["relative_max_distance"], scale_output=old["scale_output"],
    )  # fmt: skip
