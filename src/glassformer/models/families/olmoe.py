"""OLMoE (AI2's open mixture of experts): OLMo 2's QK-norm in a Llama block whose MLP is 64
experts, 8 chosen for each token.

    x + attn(rms(x));  x + Σ over the k chosen e of  w_e · swiglu_e(rms(x))

q and k are normalised over every head at once, before the rotation, as OLMo 2's
(``AllHeadsRMSNorm``); the norms sit before the sub-layers, as Llama's. The router's
softmax at the ``top_k`` largest experts is renormalised only where ``norm_topk_prob``
says (OLMoE-1B-7B's is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.models.families.decoder import refuse
from glassformer.models.families.llama import LLAMA_READS, LlamaConfig
from glassformer.models.families.mixtral import MOE_TRAINING, check_experts
from glassformer.models.families.olmo import all_heads_qk_norms
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.experts import MixtureOfExperts

OLMOE_READS = (LLAMA_READS - {"mlp_bias"}) | MOE_TRAINING | {
    "num_experts", "num_experts_per_tok", "norm_topk_prob", "clip_qkv"
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class OlmoeConfig(LlamaConfig):
    """A Llama with OLMo 2's QK-norm and a mixture of experts for its MLP."""

    family: ClassVar[str] = "olmoe"
    title: ClassVar[str] = "OLMoE"
    HF_READS: ClassVar[frozenset[str]] = OLMOE_READS

    norm_eps: float = 1e-5
    num_experts: int = 64
    top_k: int = 8
    normalize: bool = False  # the chosen weights renormalised to sum to 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_experts(self.num_experts, self.top_k)

    def attention(self, layer: int, **more: Any) -> MultiHeadAttention:
        # (OLMoE's norms cast, then scale, as Llama's: not OLMo 2's float32 weight)
        return super().attention(layer, **all_heads_qk_norms(self, float_weight=False), **more)

    def mlp(self, layer: int) -> nn.Module:
        return MixtureOfExperts(d_model=self.d_model, d_ff=self.d_ff, num_experts=self.num_experts,
                                top_k=self.top_k, normalize=self.normalize)  # fmt: skip

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> OlmoeConfig:
        cls.check_hf_fields(hf)
        if hf.get("clip_qkv") is not None:  # OLMoE clamps after its QK-norm, OLMo before
            raise refuse(cls.title, "clip_qkv", hf["clip_qkv"], "null: none released sets it")
        if hf.get("attention_bias", False):
            raise refuse(cls.title, "attention_bias", True, "false: no released OLMoE has one")
        fields = cls.llama_fields(hf, norm_eps=1e-5)
        return cls(
            **fields,
            num_experts=hf.get("num_experts", 64),
            top_k=hf.get("num_experts_per_tok", 8),
            normalize=bool(hf.get("norm_topk_prob", False)),
        )
