"""Translation: an encoder-decoder learns sentence pairs with one shared BPE vocabulary.

Training batches are buckets of pairs of similar length; evaluation is the plain
(unsmoothed) loss on validation pairs; the held-out report is sacreBLEU of greedy
translations of the test split; the show is a few validation sentences translated.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inference import translate_texts
from glassformer.models import Seq2SeqConfig, Seq2SeqTransformer
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.evaluation import bleu, mean_loss
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    MappedBatches,
    Task,
    load_splits,
    model_overrides,
    text_tokenizer,
    tokenizer_files,
)

Pair = tuple[list[int], list[int]]  # source ids, target ids
SHOWN = 5  # validation sentences the show translates


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> TranslateTask:
    """A translator of the config's preset with one shared vocabulary (its tokenizer:
    ``tokenizer``, or one trained on both sides of the training pairs) and its pairs."""
    from glassformer.data.batching import BucketBatches, collate_pairs

    train_rows, val_rows, test_rows, description = load_splits(config)
    train_rows = train_rows[: config.max_examples]
    tok = text_tokenizer(config, tokenizer, [s for pair in train_rows for s in pair])
    max_len = filled(config.max_len)
    train_pairs, val_pairs = encode(tok, train_rows, max_len), encode(tok, val_rows, max_len)
    if not train_pairs:
        raise ValueError(f"no training pair fits in max_len={max_len} tokens")
    ids: dict[str, Any] = dict(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    shape = dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, max_len=max_len + 1,
                 share_embeddings=True, tie_output=True, **ids)  # fmt: skip
    overrides = model_overrides(config, ("num_encoder_layers", "num_decoder_layers"))
    model = Seq2SeqTransformer(Seq2SeqConfig.preset(config.preset, **{**shape, **overrides}))
    batch_size = filled(config.batch_size)
    collate = partial(collate_pairs, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    buckets = BucketBatches(
        train_pairs, batch_size, key=_length, seed=config.seed, rank=world.rank,
        world_size=world.world_size,
    )  # fmt: skip
    fixed = BucketBatches(val_pairs[:2000], batch_size, shuffle=False, key=_length, seed=0)
    return TranslateTask(
        config=config,
        tokenizer=tok,
        model=model,
        batches=MappedBatches(buckets, collate),
        loss_fn=loss_for("translate", config.label_smoothing),
        extra_files=tokenizer_files(tok),
        description=description,
        val_rows=val_rows,
        val_batches=[collate(b) for b in fixed],
        test_rows=test_rows,
    )


def encode(tokenizer: Tokenizer, rows: list[tuple[str, str]], max_len: int) -> list[Pair]:
    """Sentence pairs as ids. One position each side is for BOS/EOS; longer pairs are
    dropped, not cut."""
    src = tokenizer.encode_batch([s for s, _ in rows])
    tgt = tokenizer.encode_batch([t for _, t in rows])
    pairs = zip(src, tgt, strict=True)
    return [(s, t) for s, t in pairs if 0 < len(s) <= max_len and 0 < len(t) < max_len]


def _length(pair: Pair) -> int:
    return len(pair[0]) + len(pair[1])


@dataclass(kw_only=True)
class TranslateTask(Task):
    """A translator on sentence pairs."""

    name = "translate"
    tokenizer: Tokenizer
    val_rows: list[tuple[str, str]]
    val_batches: list
    test_rows: list[tuple[str, str]]

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """The plain loss (no label smoothing) on validation pairs."""
        return {"val_loss": mean_loss(model, loss_for("translate"), self.val_batches)}

    def test(self, model: nn.Module) -> dict[str, float]:
        """sacreBLEU of greedy translations of the test split (or validation, if none)."""
        rows = self.test_rows or self.val_rows
        sources = [s for s, _ in rows]
        hyps = translate_texts(model, self.tokenizer, sources, max_len=self.config.max_len)
        name = "test_bleu" if self.test_rows else "val_bleu"
        return {name: bleu(hyps, [t for _, t in rows]), f"{name}_sentences": len(rows)}

    def show(self, model: nn.Module) -> str:
        """A few validation sentences, their references and the model's translations."""
        lines = []
        for src_text, tgt_text in self.val_rows[:SHOWN]:
            out = translate_texts(model, self.tokenizer, [src_text], max_len=self.config.max_len)
            lines += [
                f"source:    {src_text}",
                f"reference: {tgt_text}",
                f"model:     {out[0]}",
                "",
            ]
        return "\n".join(lines)
