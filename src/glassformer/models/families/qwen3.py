"""Qwen3: Qwen2's windows, no biases, and QK-norm.

An RMSNorm over each head's queries and keys before the rotation (``attn.q_norm``,
``attn.k_norm``), and ``head_dim`` a field of its own (128 by default, not hidden / heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.models.families.decoder import refuse
from glassformer.models.families.qwen2 import Qwen2Config, check_text_rope, sliding_layers
from glassformer.modules.norms import RMSNorm


@dataclass(frozen=True, kw_only=True)
class Qwen3Config(Qwen2Config):
    """Qwen2 without the biases, with QK-norm."""

    family: ClassVar[str] = "qwen3"
    title: ClassVar[str] = "Qwen3"

    @property
    def qkv_bias(self) -> bool:
        return self.bias

    def qk_norm(self) -> nn.Module | None:
        return RMSNorm(self.width, eps=self.norm_eps)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Qwen3Config:
        cls.check_hf_fields(hf)
        check_text_rope(cls.title, hf)
        if hf.get("attention_bias", False):
            raise refuse(cls.title, "attention_bias", True,
                         "biases on q, k, v and o without the MLP's are not built")  # fmt: skip
        fields = cls.llama_fields({**hf, "head_dim": hf.get("head_dim", 128)})
        return cls(**fields, **sliding_layers(cls.title, hf))
