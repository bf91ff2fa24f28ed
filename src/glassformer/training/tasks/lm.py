"""Language modelling: a GPT learns to continue text (characters, BPE or WordPiece).

Training batches are random windows of ``block_size + 1`` tokens; evaluation is the mean
loss over fixed validation windows; the held-out report is the loss over every window of
the validation and test splits; the show is a sampled continuation of a validation prompt.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glassformer.inference import device_of
from glassformer.models import GPT, GPTConfig
from glassformer.training.evaluation import mean_loss
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import DataOptions, Task, load_splits, tokenizer_files


def lm_task(
    opts: DataOptions,
    *,
    preset: str,
    block_size: int,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    tokenizer=None,
    eval_batches: int = 50,
) -> Task:
    from glassformer.data.batching import LMBatches
    from glassformer.data.batching import eval_batches as eval_windows
    from glassformer.data.tokenizers import train_tokenizer

    train_text, val_text, test_text, description = load_splits(opts)
    if not val_text:
        raise ValueError("the validation split is empty; give more text")
    tok = tokenizer or train_tokenizer(
        opts.tokenizer_kind, [train_text], vocab_size=opts.vocab_size, lowercase=opts.lowercase
    )
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text), dtype=torch.long)
    if len(train_ids) <= block_size + 1 or len(val_ids) <= block_size + 1:
        raise ValueError(
            f"need more than {block_size + 1} tokens in each split for --block-size {block_size}; "
            f"got {len(train_ids)} training and {len(val_ids)} validation tokens"
        )
    config = GPTConfig.preset(
        preset,
        **{
            "vocab_size": tok.vocab_size,
            "max_len": block_size,
            "pad_id": tok.pad_id,
            **model_overrides,
        },
    )
    model = GPT(config)
    batches = LMBatches(
        train_ids, block_size, batch_size, seed=seed, rank=rank, world_size=world_size
    )
    # the same windows however many processes share the global batch
    global_batch = batch_size * world_size
    val_windows = list(eval_windows(val_ids, block_size, global_batch, max_batches=eval_batches))
    loss_fn = loss_for("lm")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(m, loss_fn, val_windows)}

    def test(m: nn.Module) -> dict[str, float]:
        """Loss over every window of the validation and test splits."""
        out = {"val_loss_full": mean_loss(m, loss_fn, eval_windows(val_ids, block_size, 64))}
        if len(test_text) > block_size + 1:
            test_ids = torch.tensor(tok.encode(test_text), dtype=torch.long)
            out["test_loss"] = mean_loss(m, loss_fn, eval_windows(test_ids, block_size, 64))
        return out

    def show(m: Any) -> str:
        prompt = val_text[: min(32, len(val_text))]
        device = device_of(m)
        ids = torch.tensor([tok.encode(prompt)], device=device)
        g = torch.Generator(device).manual_seed(seed)
        out = m.generate(ids, 300, do_sample=True, temperature=0.8, top_k=50, generator=g)
        return f"prompt: {prompt!r}\n{tok.decode(out[0].tolist())}"

    return Task(
        name="lm",
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
