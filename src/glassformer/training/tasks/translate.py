"""Translation: an encoder-decoder learns sentence pairs with one shared BPE vocabulary.

Training batches are buckets of pairs of similar length; evaluation is the plain
(unsmoothed) loss on validation pairs; the held-out report is sacreBLEU of greedy
translations of the test split; the show is a few validation sentences translated.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from glassformer.inference import translate_texts
from glassformer.models import Seq2SeqConfig, Seq2SeqTransformer
from glassformer.training.evaluation import bleu, mean_loss
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    DataOptions,
    MappedBatches,
    Task,
    load_splits,
    tokenizer_files,
)


def translate_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    max_len: int = 128,
    tokenizer=None,
    label_smoothing: float = 0.1,
    show_count: int = 5,
) -> Task:
    from glassformer.data.batching import BucketBatches, collate_pairs
    from glassformer.data.tokenizers import train_tokenizer

    train_rows, val_rows, test_rows, description = load_splits(opts)
    if opts.max_examples:
        train_rows = train_rows[: opts.max_examples]
    texts = [s for pair in train_rows for s in pair]
    tok = tokenizer or train_tokenizer(
        opts.tokenizer_kind, texts, vocab_size=opts.vocab_size, lowercase=opts.lowercase
    )

    def encode(rows):
        src = tok.encode_batch([s for s, _ in rows])
        tgt = tok.encode_batch([t for _, t in rows])
        # One position each side is for BOS/EOS; longer pairs are dropped, not cut.
        return [
            (s, t)
            for s, t in zip(src, tgt, strict=True)
            if 0 < len(s) <= max_len and 0 < len(t) < max_len
        ]

    train_pairs, val_pairs = encode(train_rows), encode(val_rows)
    if not train_pairs:
        raise ValueError(f"no training pair fits in max_len={max_len} tokens")
    config = Seq2SeqConfig.preset(
        preset,
        **{
            "src_vocab_size": tok.vocab_size,
            "tgt_vocab_size": tok.vocab_size,
            "max_len": max_len + 1,
            "pad_id": tok.pad_id,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "share_embeddings": True,
            "tie_output": True,
            **model_overrides,
        },
    )
    model = Seq2SeqTransformer(config)

    def collate(pairs):
        return collate_pairs(pairs, tok.pad_id, tok.bos_id, tok.eos_id)

    buckets = BucketBatches(
        train_pairs,
        batch_size,
        key=lambda p: len(p[0]) + len(p[1]),
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    batches = MappedBatches(buckets, collate)
    val_batches = [
        collate(b)
        for b in BucketBatches(
            val_pairs[:2000], batch_size, shuffle=False, key=lambda p: len(p[0]) + len(p[1]), seed=0
        )
    ]
    loss_fn = loss_for("translate", label_smoothing)
    plain_loss = loss_for("translate")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(m, plain_loss, val_batches)}

    def test(m: nn.Module) -> dict[str, float]:
        """sacreBLEU of greedy translations of the test split (or validation, if none)."""
        rows = test_rows or val_rows
        hyps = translate_texts(m, tok, [s for s, _ in rows], max_len=max_len)
        name = "test_bleu" if test_rows else "val_bleu"
        return {name: bleu(hyps, [t for _, t in rows]), f"{name}_sentences": len(rows)}

    def show(m: nn.Module) -> str:
        lines = []
        for src_text, tgt_text in val_rows[:show_count]:
            out = translate_texts(m, tok, [src_text], max_len=max_len)[0]
            lines += [f"source:    {src_text}", f"reference: {tgt_text}", f"model:     {out}", ""]
        return "\n".join(lines)

    return Task(
        name="translate",
        tokenizer=tok,
        model=model,
        batches=batches,
        loss_fn=loss_fn,
        evaluate=evaluate,
        show=show,
        unit="tok",
        extra_files=tokenizer_files(tok),
        description=description,
        test=test,
    )
