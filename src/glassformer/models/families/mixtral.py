"""Mixtral (Mistral AI's mixtures of experts): Mistral with its MLP as eight experts, two
chosen for each token.

    x + attn(rms(x));  x + Σ over the 2 chosen e of  w_e · swiglu_e(rms(x))

The router's softmax over the experts is taken at the ``top_k`` largest and renormalised to
sum to 1 (``modules.experts.MixtureOfExperts``); each expert runs on the tokens that chose
it and no others. Everything else is Mistral's (``families.mistral``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.models.checks import is_integer
from glassformer.models.families.decoder import refuse, window_from_sliding
from glassformer.models.families.llama import LLAMA_READS
from glassformer.models.families.mistral import MistralConfig
from glassformer.modules.experts import MixtureOfExperts

# the router's training-time fields (its auxiliary loss, its noise) read and left: inference
MOE_TRAINING = frozenset(["router_aux_loss_coef", "router_jitter_noise", "output_router_logits"])
MIXTRAL_READS = LLAMA_READS | MOE_TRAINING | {
    "sliding_window", "num_local_experts", "num_experts_per_tok"
}  # fmt: skip


MAX_EXPERTS = 1 << 12  # a bound far above any released model's (DeepSeek-V3: 256)


def check_experts(num_experts: Any, top_k: Any) -> None:
    """``num_experts`` experts (1..``MAX_EXPERTS``), ``top_k`` of them chosen for each token."""
    if not is_integer(num_experts) or not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts must be an integer in 1..{MAX_EXPERTS}, got {num_experts!r}")
    if not is_integer(top_k) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be an integer in 1..{num_experts}, got {top_k!r}")


@dataclass(frozen=True, kw_only=True)
class MixtralConfig(MistralConfig):
    """A Mistral whose MLP is ``num_experts`` experts, ``top_k`` chosen for each token."""

    family: ClassVar[str] = "mixtral"
    title: ClassVar[str] = "Mixtral"
    HF_READS: ClassVar[frozenset[str]] = MIXTRAL_READS

    norm_eps: float = 1e-5
    num_experts: int = 8
    top_k: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_experts(self.num_experts, self.top_k)

    def mlp(self, layer: int) -> nn.Module:
        return MixtureOfExperts(d_model=self.d_model, d_ff=self.d_ff, num_experts=self.num_experts,
                                top_k=self.top_k)  # fmt: skip

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> MixtralConfig:
        cls.check_hf_fields(hf)
        if hf.get("layer_types") is not None:
            raise refuse(cls.title, "layer_types", hf["layer_types"], "only None")
        plain = {**hf, "attention_bias": False, "mlp_bias": False}  # transformers builds none
        return cls(
            **cls.llama_fields(plain, norm_eps=1e-5),
            attention_window=window_from_sliding(cls.title, hf.get("sliding_window")),
            num_experts=hf.get("num_local_experts", 8),
            top_k=hf.get("num_experts_per_tok", 2),
        )
