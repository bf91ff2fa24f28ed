"""What every encoder-decoder family shares: the fields, their rules, and what a family adds.

A translator family (``t5.py``, ``marian.py``) subclasses ``TranslatorConfig`` with its own
fields and ``parts(side)``: the keyword arguments of the ``Backbone`` of its ``"encoder"``
or its ``"decoder"`` (whose blocks also attend to the encoder's output).
``Seq2SeqTransformer(config)`` runs any of them, as it runs the paper's own translator
(``Seq2SeqConfig``, which names its parts field by field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glassformer.errors import shown
from glassformer.models.base import is_integer
from glassformer.models.families.decoder import FamilyConfig
from glassformer.modules.attention import check_dropout, check_heads

# translator family name → its config class
TRANSLATORS: dict[str, type[FamilyConfig]] = {}


@dataclass(frozen=True, kw_only=True)
class TranslatorConfig(FamilyConfig):
    """The fields every encoder-decoder family has."""

    REGISTRY: ClassVar[dict[str, type[FamilyConfig]]] = TRANSLATORS

    src_vocab_size: int  # the source's tokens
    tgt_vocab_size: int  # the target's tokens
    d_model: int  # the residual stream's width
    num_heads: int
    head_dim: int | None = None  # each head's width; None: d_model // num_heads
    num_encoder_layers: int
    num_decoder_layers: int
    d_ff: int  # the MLP's hidden width
    max_len: int = 512  # the longest sequence either side reads
    dropout: float = 0.0  # on embeddings and sub-layer outputs (training only)
    attention_dropout: float = 0.0  # on the attention weights (training only)
    pad_id: int = 0  # padding; masked as a key, ignored by the loss
    bos_id: int = 0  # what the decoder starts from
    eos_id: int = 1  # what ends a translation
    share_embeddings: bool = True  # one table for source and target (equal vocabularies)
    tie_output: bool = True  # the output projection reads the target table

    def __post_init__(self) -> None:
        self._check_sizes()
        check_heads(self.d_model, self.num_heads, self.head_dim)
        check_dropout(self.dropout)
        check_dropout(self.attention_dropout, "attention_dropout")
        check_vocabularies(self)

    def parts(self, side: str) -> dict[str, Any]:
        """The keyword arguments of the ``side`` ("encoder" or "decoder") ``Backbone``."""
        raise NotImplementedError(f"{type(self).__name__} builds no parts")

    @property
    def output_scale(self) -> float | None:
        """What the decoder's states are multiplied by before the output projection."""
        return None


def check_vocabularies(config: Any) -> None:
    """A translator's tables and special tokens fit: one shared table needs equal
    vocabularies, and the pad, start and end ids are target tokens."""
    c = config
    if c.share_embeddings and c.src_vocab_size != c.tgt_vocab_size:
        raise ValueError(
            "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
            f"{c.src_vocab_size} and {c.tgt_vocab_size}"
        )
    for name in ("pad_id", "bos_id", "eos_id"):
        value = getattr(c, name)
        if not is_integer(value) or not 0 <= value < c.tgt_vocab_size:
            raise ValueError(
                f"{name}={shown(value)} is outside the target vocabulary [0, {c.tgt_vocab_size})"
            )
