"""Gemma 2 and Gemma 3 (text): a Llama-shaped decoder with parts of its own.

    RMSNorm scaling by 1 + weight, in float32       GemmaRMS (``RMSNorm(unit_offset=True)``)
    embeddings × √d_model                           ``TokenEmbedding(scale=True)``
    a norm after each sub-layer too (four a block)  ``ln1_post``, ``ln2_post``
    scores × query_pre_attn_scalar^-½               ``attention_scale``
    gated GELU (tanh approximation)                 ``GatedFeedForward("geglu_tanh")``
    sliding layers between global ones              ``attention_window``, ``full_attention_layers``
    Gemma 3: QK-norm, its own rotary base for the   ``q_norm``/``k_norm``, ``rope_local_theta``
      sliding layers, a soft cap on the logits      ``final_softcap``
    Gemma 2: soft caps on the scores and logits     ``attention_softcap``, ``final_softcap``

Gemma 3 stores ``attn_logit_softcapping`` but does not use it; neither does glassformer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import nn

from glassformer.models.checks import check_finite, check_window
from glassformer.models.families.decoder import (
    DecoderConfig,
    Readout,
    check_layers,
    layer_windows,
    refuse,
    rope,
    rope_theta,
    scaling_field,
)
from glassformer.modules.attention import MultiHeadAttention, Scores, Window
from glassformer.modules.block import Block
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.rope_scaling import RopeScaling
from glassformer.modules.rotary import RotaryEmbedding

ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # GELU's tanh approximation


@dataclass(frozen=True, kw_only=True)
class GemmaConfig(DecoderConfig):
    """A Gemma 2 or 3 text decoder."""

    family: ClassVar[str] = "gemma"
    title: ClassVar[str] = "Gemma"
    HF_READS: ClassVar[frozenset[str]] = frozenset(
        [
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_hidden_layers",
            "intermediate_size",
            "hidden_activation",
            "hidden_act",
            "rms_norm_eps",
            "rope_theta",
            "rope_local_base_freq",
            "rope_scaling",
            "rope_parameters",
            "tie_word_embeddings",
            "attention_bias",
            "use_bidirectional_attention",
            "sliding_window",
            "sliding_window_pattern",
            "_sliding_window_pattern",
            "layer_types",
            "query_pre_attn_scalar",
            "final_logit_softcapping",
            "attn_logit_softcapping",
        ]
    )

    version: Literal[2, 3] = 3  # 3: QK-norm and a rotary base for the sliding layers
    max_len: int = 8192
    head_dim: int | None = 256
    tie_weights: bool = True
    rope_theta: float = 1e6  # the global layers' rotary base
    rope_scaling: RopeScaling | None = None  # the global layers' scaling (Gemma 3 from 4B)
    rope_local_theta: float | None = None  # the sliding layers' (Gemma 3); None: rope_theta
    attention_window: int | None = None  # keys before each query a sliding layer sees
    full_attention_layers: tuple[int, ...] = ()  # the layers that do not slide
    attention_scale: float = 256**-0.5  # the scores' factor, query_pre_attn_scalar^-½
    attention_softcap: float | None = None  # scores = c·tanh(scores / c) (Gemma 2)
    final_softcap: float | None = None  # logits = c·tanh(logits / c)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.version not in (2, 3):
            raise ValueError(f"version must be 2 or 3, got {self.version!r}")
        object.__setattr__(self, "full_attention_layers", tuple(self.full_attention_layers))
        check_layers("full_attention_layers", self.full_attention_layers, self.num_layers)
        check_window(self.attention_window)
        for name in ("rope_theta", "rope_local_theta", "attention_scale", "attention_softcap",
                     "final_softcap"):  # fmt: skip
            check_finite(name, getattr(self, name), minimum=0.0, above=True)  # None passes
        scaling = scaling_field(self.rope_scaling, self.rope_theta, self.width)
        object.__setattr__(self, "rope_scaling", scaling)

    def norm(self, width: int | None = None) -> nn.Module:
        return RMSNorm(width or self.d_model, eps=self.norm_eps, unit_offset=True)

    def attention(self, layer: int) -> MultiHeadAttention:
        sliding = self.attention_window is not None and layer not in self.full_attention_layers
        rotary: RotaryEmbedding | bool = True  # the angles the model computes for every layer
        if sliding and self.rope_local_theta is not None:
            rotary = RotaryEmbedding(self.width, self.rope_local_theta)  # this layer's own
        qk_norm = self.version == 3  # Gemma 3 normalises each head's queries and keys
        return MultiHeadAttention(
            d_model=self.d_model,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dropout=self.attention_dropout,
            qkv_bias=False,
            out_bias=False,
            causal=True,
            rotary=rotary,
            window=Window(self.attention_window, 0) if sliding else None,  # type: ignore[arg-type]
            scores=Scores(self.attention_scale, self.attention_softcap),
            q_norm=self.norm(self.width) if qk_norm else None,
            k_norm=self.norm(self.width) if qk_norm else None,
        )

    def block(self, layer: int) -> Block:
        return Block(
            attn=self.attention(layer),
            mlp=GatedFeedForward(
                d_model=self.d_model,
                d_ff=self.d_ff,
                dropout=self.dropout,
                activation="geglu_tanh",
                bias=False,
            ),  # fmt: skip
            ln1=self.norm(),
            ln1_post=self.norm(),
            ln2=self.norm(),
            ln2_post=self.norm(),
            dropout=self.dropout,
        )

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model, scale=True),
            rotary=RotaryEmbedding(self.width, self.rope_theta, self.rope_scaling),
            blocks=[self.block(i) for i in range(self.num_layers)],
            ln_final=self.norm(),
            max_len=self.max_len,
            dropout=self.dropout,
        )

    def readout(self) -> Readout:
        return Readout(softcap=self.final_softcap)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], version: int = 3) -> GemmaConfig:
        """The config of a Gemma 3 text (``version`` 3) or Gemma 2 ``config.json``."""
        family = f"Gemma {version}"
        cls.check_hf_fields(hf)
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ACTIVATIONS:
            raise refuse(family, "hidden_activation", act, ", ".join(ACTIVATIONS))
        for option in ("attention_bias", "use_bidirectional_attention"):
            if hf.get(option):
                raise refuse(family, option, hf[option])
        windows = _windows(hf, family, version)
        theta, scaling, local = _thetas(hf, family, version)
        return cls(
            version=version,  # type: ignore[arg-type]
            vocab_size=hf["vocab_size"],
            max_len=hf.get("max_position_embeddings", 8192),
            d_model=hf["hidden_size"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim", 256),
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            rope_theta=theta,
            rope_scaling=scaling,
            rope_local_theta=local if windows["attention_window"] is not None else None,
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            attention_scale=hf.get("query_pre_attn_scalar", 256) ** -0.5,
            **windows,
            final_softcap=hf.get("final_logit_softcapping"),
            attention_softcap=None if version == 3 else hf.get("attn_logit_softcapping"),
            tie_weights=hf.get("tie_word_embeddings", True),
        )


def _windows(hf: dict[str, Any], family: str, version: int) -> dict[str, Any]:
    """The window fields of ``layer_types`` or the family's own pattern (Gemma 3: every sixth
    layer global; Gemma 2: every other)."""
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
    every = pattern if version == 3 else 2
    default = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
               for i in range(hf["num_hidden_layers"])]  # fmt: skip
    return layer_windows(family, hf, default)


def _thetas(
    hf: dict[str, Any], family: str, version: int
) -> tuple[float, RopeScaling | None, float | None]:
    """(the global layers' rotary base, their scaling, the sliding layers' base or None): a
    table per kind of layer (transformers 5's ``rope_parameters.full_attention`` and
    ``sliding_attention``) or one for all with ``rope_local_base_freq`` (transformers 4's,
    whose ``rope_scaling`` is the global layers'; Gemma 2 has no scaling)."""
    if version != 3:
        return rope_theta(hf, family, 1e4), None, None
    params = hf.get("rope_parameters") or {}
    nested = "full_attention" in params or "sliding_attention" in params
    full = hf
    if nested:  # a rope_scaling beside the table is the global layers' (as transformers reads)
        legacy = hf.get("rope_scaling") or {}
        if not isinstance(legacy, dict):
            raise refuse(family, "rope_scaling", legacy, "a dict")
        legacy = dict(legacy)
        if "type" in legacy:
            legacy.setdefault("rope_type", legacy.pop("type"))
        table = {**(params.get("full_attention") or {}), **legacy}
        full = {
            "rope_parameters": table,
            "max_position_embeddings": hf.get("max_position_embeddings"),
        }
    theta, scaling = rope(full, family, hf.get("rope_theta") or 1e6)
    local = {"rope_parameters": (params.get("sliding_attention") or {}) if nested else {}}
    return theta, scaling, rope_theta(local, family, hf.get("rope_local_base_freq", 1e4))
