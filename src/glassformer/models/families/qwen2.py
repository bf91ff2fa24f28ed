"""Qwen2 and Qwen2.5: Llama with biases on the q, k and v projections only.

They can also slide a window over the later layers (``use_sliding_window``: layer i slides
iff i ≥ ``max_window_layers``, or as ``layer_types`` says); the earlier ones are this
config's ``full_attention_layers``. Qwen3 (``families.qwen3``) keeps the windows and trades
the biases for QK-norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.models.checks import check_window
from glassformer.models.families.decoder import check_layers, layer_windows, refuse
from glassformer.models.families.llama import LLAMA_READS, LlamaConfig

WINDOW_READS = frozenset(
    ["sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "use_mrope"]
)


@dataclass(frozen=True, kw_only=True)
class Qwen2Config(LlamaConfig):
    """A Llama with q/k/v biases (and sliding layers where the config has them)."""

    family: ClassVar[str] = "qwen2"
    title: ClassVar[str] = "Qwen2"
    HF_READS: ClassVar[frozenset[str]] = LLAMA_READS | WINDOW_READS

    attention_window: int | None = None  # keys before each query a sliding layer sees
    full_attention_layers: tuple[int, ...] = ()  # the layers that do not slide

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "full_attention_layers", tuple(self.full_attention_layers))
        check_layers("full_attention_layers", self.full_attention_layers, self.num_layers)
        check_window(self.attention_window)

    def window(self, layer: int) -> int | None:
        return None if layer in self.full_attention_layers else self.attention_window

    @property
    def qkv_bias(self) -> bool:
        return True

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Qwen2Config:
        cls.check_hf_fields(hf)
        check_text_rope(cls.title, hf)
        fields = cls.llama_fields({**hf, "attention_bias": False, "mlp_bias": False})
        return cls(**fields, **sliding_layers(cls.title, hf))


def check_text_rope(family: str, hf: dict[str, Any]) -> None:
    """Refuse the multimodal rotary (``use_mrope``: positions along time, height, width)."""
    if hf.get("use_mrope", False):
        raise refuse(family, "use_mrope", True, "false: text positions only")


def sliding_layers(family: str, hf: dict[str, Any]) -> dict[str, Any]:
    """The window fields of the layers ``use_sliding_window`` and ``max_window_layers`` (or
    ``layer_types``) slide: layer i slides iff i ≥ ``max_window_layers``."""
    sliding = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
    first = hf.get("max_window_layers", 28)
    default = ["sliding_attention" if sliding and i >= first else "full_attention"
               for i in range(hf["num_hidden_layers"])]  # fmt: skip
    return layer_windows(family, hf, default)
