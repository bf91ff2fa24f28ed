"""OLMo (AI2's open models): Llama with other norms.

    OLMo 1:  x = x + attn(ln(x));      x = x + swiglu(ln(x))       ln: LayerNorm, no weight
    OLMo 2:  x = x + rms(attn(x));     x = x + rms(swiglu(x))      norms after, none before

OLMo 1 normalises with a LayerNorm that learns nothing (no weight, no bias; eps 1e-5) and
may clamp q, k and v into [−c, c] as they are projected (``clip_qkv``, the 7B models').
OLMo 2 moves the norms to the sub-layers' outputs (``ln1_post``, ``ln2_post``; the block
has no ``ln1`` or ``ln2``), and normalises q and k over the whole projection, every head's
features together, before the rotation (``AllHeadsRMSNorm``: one weight of H·Dh, where
Qwen3's QK-norm has one of Dh shared by the heads). Everything else is Llama's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.models.checks import check_finite
from glassformer.models.families.decoder import refuse
from glassformer.models.families.llama import LLAMA_READS, LlamaConfig
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.norms import AllHeadsRMSNorm, LayerNorm, RMSNorm

OLMO_READS = LLAMA_READS | {"clip_qkv"}
OLMO2_READS = LLAMA_READS


def _olmo_fields(cls: type[LlamaConfig], hf: dict[str, Any]) -> dict:
    """Llama's fields of an OLMo ``config.json`` (its norms' epsilon 1e-5 where it gives
    none). Its ``attention_bias`` (q, k, v and o only) is refused: every released OLMo has
    none, and glassformer's one bias covers the MLP too. ``mlp_bias`` is not read by
    transformers' OLMo (the MLP has none): it is left."""
    cls.check_hf_fields(hf)
    if hf.get("attention_bias", False):
        raise refuse(cls.title, "attention_bias", True, "false: no released OLMo has one")
    return cls.llama_fields({**hf, "mlp_bias": False}, norm_eps=1e-5)


def all_heads_qk_norms(config: LlamaConfig, *, float_weight: bool) -> dict[str, nn.Module]:
    """``q_norm`` and ``k_norm`` over every head's features at once (OLMo 2's, OLMoE's)."""
    kv_heads = config.num_kv_heads or config.num_heads
    return {
        f"{which}_norm": AllHeadsRMSNorm(heads * config.width, eps=config.norm_eps,
                                         float_weight=float_weight)
        for which, heads in (("q", config.num_heads), ("k", kv_heads))
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class OlmoConfig(LlamaConfig):
    """OLMo 1: a Llama whose norms learn nothing, with q, k and v optionally clamped."""

    family: ClassVar[str] = "olmo"
    title: ClassVar[str] = "OLMo"
    HF_READS: ClassVar[frozenset[str]] = OLMO_READS

    norm_eps: float = 1e-5
    clip_qkv: float | None = None  # q, k and v clamped into [−c, c]; None: not clamped

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_qkv is not None:
            check_finite("clip_qkv", self.clip_qkv, minimum=0.0, above=True)

    def norm(self) -> nn.Module:
        return LayerNorm(self.d_model, eps=self.norm_eps, affine=False)

    def attention(self, layer: int, **more: Any) -> MultiHeadAttention:
        return super().attention(layer, clip=self.clip_qkv, **more)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> OlmoConfig:
        # transformers' OLMo 1 reads no rms_norm_eps: its LayerNorm's epsilon is 1e-5
        plain = {k: v for k, v in hf.items() if k != "rms_norm_eps"}
        return cls(**_olmo_fields(cls, plain), clip_qkv=hf.get("clip_qkv"))


@dataclass(frozen=True, kw_only=True)
class Olmo2Config(LlamaConfig):
    """OLMo 2: a Llama normalising each sub-layer's output, and q and k over all heads."""

    family: ClassVar[str] = "olmo2"
    title: ClassVar[str] = "OLMo 2"
    HF_READS: ClassVar[frozenset[str]] = OLMO2_READS

    norm_eps: float = 1e-5

    def norm(self) -> nn.Module:  # the weight applied in float32, as OLMo 2 rounds it
        return RMSNorm(self.d_model, eps=self.norm_eps, float_weight=True)

    def attention(self, layer: int, **more: Any) -> MultiHeadAttention:
        return super().attention(layer, **all_heads_qk_norms(self, float_weight=True), **more)

    def block_norms(self) -> dict[str, Any]:
        """No norm before a sub-layer, one after each."""
        return {"ln1": None, "ln2": None, "ln1_post": self.norm(), "ln2_post": self.norm()}

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Olmo2Config:
        return cls(**_olmo_fields(cls, hf))
