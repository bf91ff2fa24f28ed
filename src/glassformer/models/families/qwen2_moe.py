"""Qwen2-MoE and Qwen1.5-MoE: Qwen2 with its MLP as many small experts and a shared one.

    x + Σ over the k chosen e of  w_e · swiglu_e(x)  +  sigmoid(g · x) · swiglu_shared(x)

The router's softmax is taken at the ``top_k`` largest experts (renormalised only where
``norm_topk_prob`` says; Qwen1.5-MoE's are not), and every token also goes to a shared
expert of its own width, scaled by a sigmoid gate (``modules.experts``). The layers
``mlp_only_layers`` names (and those ``decoder_sparse_step`` skips) keep a dense SwiGLU of
``intermediate_size``; the experts are ``moe_intermediate_size`` wide. The attention is
Qwen2's (``families.qwen2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from glassformer.models.checks import is_integer
from glassformer.models.families.decoder import check_layers, layer_windows, refuse
from glassformer.models.families.llama import LLAMA_READS
from glassformer.models.families.mixtral import MOE_TRAINING, check_experts
from glassformer.models.families.qwen2 import WINDOW_READS, Qwen2Config, check_text_rope
from glassformer.modules.experts import MixtureOfExperts

QWEN2_MOE_READS = LLAMA_READS | WINDOW_READS | MOE_TRAINING | {
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "qkv_bias",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Qwen2MoeConfig(Qwen2Config):
    """A Qwen2 whose MLPs (but those of ``dense_layers``) are mixtures of experts."""

    family: ClassVar[str] = "qwen2_moe"
    title: ClassVar[str] = "Qwen2-MoE"
    HF_READS: ClassVar[frozenset[str]] = QWEN2_MOE_READS

    num_experts: int = 60
    top_k: int = 4
    expert_d_ff: int = 1408  # each routed expert's inner width
    shared_d_ff: int | None = 5632  # the shared expert's; None: none
    normalize: bool = False  # the chosen weights renormalised to sum to 1
    dense_layers: tuple[int, ...] = ()  # the layers with a dense MLP of d_ff

    def __post_init__(self) -> None:
        super().__post_init__()
        check_experts(self.num_experts, self.top_k)
        for name in ("expert_d_ff", "shared_d_ff"):
            width = getattr(self, name)
            if (width is not None or name == "expert_d_ff") and not (
                is_integer(width) and width > 0
            ):
                raise ValueError(f"{name} must be a positive integer, got {width!r}")
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        check_layers("dense_layers", self.dense_layers, self.num_layers)

    def mlp(self, layer: int) -> nn.Module:
        if layer in self.dense_layers:
            return super().mlp(layer)
        return MixtureOfExperts(
            d_model=self.d_model, d_ff=self.expert_d_ff, num_experts=self.num_experts,
            top_k=self.top_k, normalize=self.normalize, shared_d_ff=self.shared_d_ff,
        )  # fmt: skip

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Qwen2MoeConfig:
        cls.check_hf_fields(hf)
        check_text_rope(cls.title, hf)
        if not hf.get("qkv_bias", True):
            raise refuse(cls.title, "qkv_bias", False, "true: Qwen2's q, k and v have biases")
        layers, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
        if not isinstance(step, int) or step < 1:
            raise refuse(cls.title, "decoder_sparse_step", step, "a positive integer")
        only = hf.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise refuse(cls.title, "mlp_only_layers", only, "a list of layer indices")
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
        sliding = hf.get("use_sliding_window", False)
        first = hf.get("max_window_layers", 28)
        default = ["sliding_attention" if sliding and (i + 1) % 2 and i < first
                   else "full_attention" for i in range(layers)]  # fmt: skip
        fields = cls.llama_fields({**hf, "attention_bias": False, "mlp_bias": False})
        return cls(
            **fields,
            **layer_windows(cls.title, hf, default),
            num_experts=hf.get("num_experts", 60),
            top_k=hf.get("num_experts_per_tok", 4),
            expert_d_ff=hf.get("moe_intermediate_size", 1408),
            shared_d_ff=hf.get("shared_expert_intermediate_size", 5632),  # transformers' default
            normalize=bool(hf.get("norm_topk_prob", False)),
            dense_layers=dense,
        )
