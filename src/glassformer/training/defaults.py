"""What a ``RunConfig`` field left at None becomes, per task (``TASK_DEFAULTS``) and for
every task (``COMMON_DEFAULTS``): the recipes measured to learn fastest in CPU-minutes."""

from __future__ import annotations

from typing import Any

# Per task: the values the None-defaulted fields take. The paper's Adam + noam warm-up
# (optimizer="adam", schedule="noam", lr=1.0) spends too much of a CPU-minutes budget
# warming up; AdamW + cosine learns faster here. For classify, lower-cased WordPiece (16k
# tokens), lr 1e-3 and the one-layer small preset gave 0.84 test accuracy on IMDb after
# 4 minutes; cased, lr 5e-4 and four layers 0.81 after 20.
_CLASSIFY = dict(
    batch_size=32,
    lr=1e-3,
    warmup=200,
    tokenizer="wordpiece",
    corpus="imdb",
    max_len=256,
    vocab_size=16000,
    lowercase=True,
)
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "lm": dict(batch_size=32, lr=2e-3, warmup=100, tokenizer="char", corpus="austen"),
    # In 30 minutes the translator sees each of the Bible's 28,818 training pairs six or
    # seven times; at that budget dropout only slowed it (and cost a sixth of the step
    # time). Without it, validation loss after 1,500 steps fell from 2.94 to 2.52 and
    # greedy sacreBLEU after 30 minutes rose from 24.65 to 32.10 (docs/performance.md).
    "translate": dict(
        batch_size=64,
        lr=1e-3,
        warmup=200,
        tokenizer="bpe",
        corpus="bible-en-es",
        max_len=128,
        dropout=0.0,
    ),
    "classify": _CLASSIFY,
    # The classifier's tokenizer and length, so that `train classify --init` can start from
    # it. With learned positions (nn.Embedding's N(0, 1) start) a masked LM sat at the
    # unigram plateau (12% masked accuracy) for 5,000 steps; with the paper's sinusoids,
    # pre-norm, lr 3e-3 and no dropout it reached 19% at 1,500 steps and 24% at 3,000.
    "mlm": dict(
        _CLASSIFY, lr=3e-3, warmup=100, positional="sinusoidal", norm_first=True, dropout=0.0
    ),
    # images, not text: no tokenizer; the ViT reads patch_size × patch_size patches
    "vision": dict(batch_size=64, lr=1e-3, warmup=100, corpus="digits", patch_size=2),
    # a batch is activations (one per token); Adam without weight decay. On SmolLM2's layer
    # 15 (Austen), batch 1024 at lr 4e-4 explained 0.81 of the variance after 800 steps.
    "sae": dict(batch_size=1024, lr=4e-4, warmup=100, corpus="austen", optimizer="adam", k=32),
    # every layer's MLP input and output per token; Adam without weight decay, as the SAE. On
    # SmolLM2's blocks 3, 6 and 9 (Austen, --skip, k 64), 150 steps at lr 3e-3 left 0.354 of
    # the MLP outputs' variance unexplained, 0.426 at 1.2e-3 and 0.762 at 4e-4 (the last
    # without the skip term's starting fit).
    "transcoder": dict(
        batch_size=1024, lr=3e-3, warmup=100, corpus="austen", optimizer="adam", k=64
    ),
}
# What None meant in a run.json written before a field had its task default (such a run
# resumes as it was trained): the model preset's value. Runs written since hold the value.
BEFORE_TASK_DEFAULT: dict[str, dict[str, Any]] = {"translate": {"dropout": 0.1}}
COMMON_DEFAULTS: dict[str, Any] = dict(
    optimizer="adamw", schedule="cosine", vocab_size=8000, lowercase=False
)
