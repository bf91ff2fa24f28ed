"""Phi-3, Phi-3.5 and Phi-4-mini (Microsoft): Mistral's parts with rotary on part of each
head and LongRoPE.

    ids → embed_tokens → L × [x + attn(rms(x)); x + swiglu(rms(x))] → rms → lm_head

The checkpoint fuses what glassformer keeps apart or already fuses: q, k and v are one
``qkv_proj`` (as glassformer's), the MLP's gate and up one ``gate_up_proj`` (split on load).
Rotary turns the first ``rotary_dim`` features of each head (Phi-4-mini: 3/4 of them,
``partial_rotary_factor``), and the long-context models scale it by LongRoPE: one set of
per-frequency factors for sequences up to ``original_max_position_embeddings`` and another
beyond (``RopeScaling("longrope")``; Phi-3's earlier spellings "su" and "yarn" are LongRoPE
too). A ``sliding_window`` applies to every layer, as Mistral's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.models.checks import check_rotary_dim
from glassformer.models.families.decoder import partial_rotary, refuse, window_from_sliding
from glassformer.models.families.llama import LLAMA_READS
from glassformer.models.families.mistral import MistralConfig
from glassformer.modules.attention import check_heads

PHI3_READS = LLAMA_READS | {"sliding_window"}
LONGROPE_SPELLINGS = ("su", "yarn")  # Phi-3's names for LongRoPE before it had one


@dataclass(frozen=True, kw_only=True)
class Phi3Config(MistralConfig):
    """A Mistral whose rotary turns the first ``rotary_dim`` features of each head."""

    family: ClassVar[str] = "phi3"
    title: ClassVar[str] = "Phi-3"
    HF_READS: ClassVar[frozenset[str]] = PHI3_READS

    norm_eps: float = 1e-5
    rotary_dim: int | None = None  # features of each head turned; None: all of them

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.num_heads, self.head_dim)  # before the width is read
        check_rotary_dim(self.rotary_dim, self.width)
        super().__post_init__()

    @property
    def rotary_width(self) -> int:
        return self.rotary_dim or self.width

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Phi3Config:
        cls.check_hf_fields(hf)
        # transformers' Phi-3 has no biases whatever the config says, and trained on 4096
        # positions where it does not say (the top-level field wins over the rope table's)
        hf = {k: v for k, v in hf.items() if k not in ("attention_bias", "mlp_bias")}
        hf = {"original_max_position_embeddings": 4096, **hf, **_longrope_spelled(hf)}
        factor = partial_rotary(hf)
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        rotary_dim = int(round(head_dim * factor, 6))  # as transformers' int(), 0.1 ulp spared
        if not 0 < factor <= 1 or rotary_dim < 2:
            raise refuse(cls.title, "partial_rotary_factor", factor, "in (0, 1]")
        plain = {k: v for k, v in hf.items() if k != "partial_rotary_factor"}
        for field in ("rope_scaling", "rope_parameters"):  # (read here, refused by Llama's)
            if isinstance(hf.get(field), dict):
                plain[field] = {k: v for k, v in hf[field].items() if k != "partial_rotary_factor"}
        window = window_from_sliding(cls.title, hf.get("sliding_window"))
        fields = cls.llama_fields(plain, norm_eps=1e-5)
        return cls(
            **fields,
            attention_window=window,
            rotary_dim=None if rotary_dim == head_dim else rotary_dim,
        )


def _longrope_spelled(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf``'s rope fields with Phi-3's older names for LongRoPE ("su", "yarn") as
    "longrope", as transformers reads them."""
    changed = {}
    for field in ("rope_scaling", "rope_parameters"):
        spec = hf.get(field)
        if not isinstance(spec, dict):
            continue
        for key in ("type", "rope_type"):
            if spec.get(key) in LONGROPE_SPELLINGS:
                spec = {**spec, key: "longrope"}
        changed[field] = spec
    return changed
