"""Language modelling: a GPT learns to continue text (characters, BPE or WordPiece).

Training batches are random windows of ``block_size + 1`` tokens; evaluation is the mean
loss over fixed validation windows; the held-out report is the loss over every window of
the validation and test splits; the show is a sampled continuation of a validation prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inference import device_of
from glassformer.models import GPT, GPTConfig
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.evaluation import mean_loss
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    Task,
    load_splits,
    model_overrides,
    text_tokenizer,
    tokenizer_files,
)

EVAL_BATCHES = 50  # validation windows scored at each evaluation, in global batches


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> LMTask:
    """A GPT of the config's preset and shape, its tokenizer (``tokenizer``, or one trained
    on the text) and windows of the text."""
    from glassformer.data.batching import LMBatches

    train_text, val_text, test_text, description = load_splits(config)
    if not val_text:
        raise ValueError("the validation split is empty; give more text")
    tok = text_tokenizer(config, tokenizer, [train_text])
    block = config.block_size
    train_ids, val_ids = _ids(tok, train_text), _ids(tok, val_text)
    if len(train_ids) <= block + 1 or len(val_ids) <= block + 1:
        raise ValueError(
            f"need more than {block + 1} tokens in each split for --block-size {block}; "
            f"got {len(train_ids)} training and {len(val_ids)} validation tokens"
        )
    shape = dict(vocab_size=tok.vocab_size, max_len=block, pad_id=tok.pad_id)
    model = GPT(GPTConfig.preset(config.preset, **{**shape, **model_overrides(config)}))
    batch_size = filled(config.batch_size)
    # the same validation windows however many processes share the global batch
    val_windows = windows(val_ids, block, batch_size * world.world_size, EVAL_BATCHES)
    return LMTask(
        config=config,
        tokenizer=tok,
        model=model,
        batches=LMBatches(
            train_ids,
            block,
            batch_size,
            seed=config.seed,
            rank=world.rank,
            world_size=world.world_size,
        ),  # fmt: skip
        loss_fn=loss_for("lm"),
        extra_files=tokenizer_files(tok),
        description=description,
        val_text=val_text,
        val_ids=val_ids,
        val_windows=val_windows,
        test_text=test_text,
    )


def _ids(tokenizer: Tokenizer, text: str) -> Tensor:
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def windows(ids: Tensor, block: int, batch: int, limit: int | None = None) -> list:
    """Fixed (input, target) windows of ``ids``, ``batch`` a batch, at most ``limit`` batches."""
    from glassformer.data.batching import eval_batches

    return list(eval_batches(ids, block, batch, max_batches=limit))


@dataclass(kw_only=True)
class LMTask(Task):
    """A GPT on windows of text."""

    name = "lm"
    tokenizer: Tokenizer
    val_text: str
    val_ids: Tensor
    val_windows: list
    test_text: str

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(model, self.loss_fn, self.val_windows)}

    def test(self, model: nn.Module) -> dict[str, float]:
        """Loss over every window of the validation and test splits."""
        block = self.config.block_size
        out = {"val_loss_full": mean_loss(model, self.loss_fn, windows(self.val_ids, block, 64))}
        if len(self.test_text) > block + 1:
            test_ids = _ids(self.tokenizer, self.test_text)
            out["test_loss"] = mean_loss(model, self.loss_fn, windows(test_ids, block, 64))
        return out

    def show(self, model: nn.Module) -> str:
        """A sampled continuation of the validation text's first 32 characters."""
        prompt = self.val_text[: min(32, len(self.val_text))]
        device = device_of(model)
        ids = torch.tensor([self.tokenizer.encode(prompt)], device=device)
        g = torch.Generator(device).manual_seed(self.config.seed)
        out = model.generate(ids, 300, do_sample=True, temperature=0.8, top_k=50, generator=g)  # type: ignore[operator]
        return f"prompt: {prompt!r}\n{self.tokenizer.decode(out[0].tolist())}"
