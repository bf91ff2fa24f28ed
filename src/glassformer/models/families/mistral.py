"""Mistral: Llama with a sliding window on every layer.

Each query attends its ``attention_window`` latest keys before it, and itself: Hugging
Face's ``sliding_window`` W counts the query too, so W − 1 here. Everything else is
Llama's (``families.llama``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.models.checks import check_window
from glassformer.models.families.decoder import refuse, window_from_sliding
from glassformer.models.families.llama import LLAMA_READS, LlamaConfig


@dataclass(frozen=True, kw_only=True)
class MistralConfig(LlamaConfig):
    """A Llama whose every layer slides a window."""

    family: ClassVar[str] = "mistral"
    title: ClassVar[str] = "Mistral"
    HF_READS: ClassVar[frozenset[str]] = LLAMA_READS | {"sliding_window", "layer_types"}

    attention_window: int | None = None  # keys before each query it sees; None: all

    def __post_init__(self) -> None:
        super().__post_init__()
        check_window(self.attention_window)

    def window(self, layer: int) -> int | None:
        return self.attention_window

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> MistralConfig:
        cls.check_hf_fields(hf)
        if hf.get("layer_types") is not None:
            raise refuse(cls.title, "layer_types", hf["layer_types"], "only None")
        window = window_from_sliding(cls.title, hf.get("sliding_window"))
        return cls(**cls.llama_fields(hf), attention_window=window)
