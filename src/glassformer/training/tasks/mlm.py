"""Masked-language-model pretraining: an encoder learns to fill in hidden words (BERT).

Training batches are random windows of ``max_len`` WordPiece tokens of the text, 15% of
them masked BERT's way (``glassformer.data.masking``; whole words with
``whole_word_mask``); only the masked positions are scored. Evaluation is the loss and the
accuracy on fixed masked windows of the validation split; the held-out report is the same
on the test split; the show is the model's top guesses for a hidden word of a validation
text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inference import fill_mask
from glassformer.models import EncoderLM, EncoderLMConfig
from glassformer.models.base import PretrainedModel
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    Task,
    load_splits,
    model_overrides,
    text_tokenizer,
    tokenizer_files,
)

EVAL_SEED = 1234  # the validation and test masks are the same at every evaluation
EVAL_BATCHES = 20  # validation windows scored at each evaluation, in global batches


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> MLMTask:
    """An encoder LM of the config's preset, its WordPiece tokenizer (``tokenizer``, or one
    trained on the text) and masked windows of the text."""
    from glassformer.data.masking import MaskedLMBatches

    train_text, val_text, test_text, description = load_splits(config)
    tok = text_tokenizer(config, tokenizer, [train_text])
    if getattr(tok, "mask_id", None) is None:
        raise ValueError(
            f"masked-LM training needs a tokenizer with a [MASK] token (wordpiece), "
            f"not {config.tokenizer!r}"
        )
    max_len, batch_size = filled(config.max_len), filled(config.batch_size)
    (train_ids, train_flags), (val_ids, val_flags) = (
        stream(config, tok, train_text),
        stream(config, tok, val_text),
    )
    if len(train_ids) <= max_len + 1 or len(val_ids) <= max_len + 1:
        raise ValueError(
            f"need more than {max_len + 1} tokens in each split for --max-len {max_len}; "
            f"got {len(train_ids)} training and {len(val_ids)} validation tokens"
        )
    shape = dict(vocab_size=tok.vocab_size, max_len=max_len, pad_id=tok.pad_id)
    model = EncoderLM(EncoderLMConfig.preset(config.preset, **shape, **model_overrides(config)))
    batches = MaskedLMBatches(
        train_ids, max_len, batch_size, prob=config.mask_prob, continues=train_flags,
        seed=config.seed, rank=world.rank, world_size=world.world_size, **masking(tok),
    )  # fmt: skip
    global_batch = batch_size * world.world_size  # the same windows whatever the processes
    val_batches = masked_windows(config, tok, val_ids, val_flags, global_batch, EVAL_BATCHES)
    return MLMTask(
        config=config,
        tokenizer=tok,
        model=model,
        batches=batches,
        loss_fn=loss_for("mlm"),
        extra_files=tokenizer_files(tok),
        description=description,
        val_text=val_text,
        val_batches=val_batches,
        test_text=test_text,
        global_batch=global_batch,
    )


def masking(tokenizer: Any) -> dict[str, Any]:
    """How ``glassformer.data.masking`` masks this tokenizer's ids."""
    specials = sorted({tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id})
    return dict(mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size, special_ids=specials)


def stream(config: RunConfig, tokenizer: Tokenizer, text: str) -> tuple[Tensor, Tensor | None]:
    """A text's ids, and with ``whole_word_mask`` which of them continue a word."""
    ids = tokenizer.encode(text)
    flags = None
    if config.whole_word_mask:  # WordPiece marks a word's later pieces with ##
        flags = torch.tensor([tokenizer.id_to_token(i).startswith("##") for i in ids])
    return torch.tensor(ids, dtype=torch.long), flags


def masked_windows(
    config: RunConfig,
    tokenizer: Tokenizer,
    ids: Tensor,
    flags: Tensor | None,
    batch: int,
    limit: int | None,
) -> list[tuple[Tensor, Tensor]]:
    """Fixed masked windows of a split's ids (the same masks at every evaluation)."""
    from glassformer.data.batching import eval_batches
    from glassformer.data.masking import mask_tokens

    g = torch.Generator().manual_seed(EVAL_SEED)
    positions = torch.arange(len(ids))  # windows of positions cut the ids and flags alike
    windows = eval_batches(positions, filled(config.max_len), batch, max_batches=limit)
    return [
        mask_tokens(ids[where], prob=config.mask_prob, generator=g, **masking(tokenizer),
                    word_continues=None if flags is None else flags[where])
        for where, _ in windows
    ]  # fmt: skip


@dataclass(kw_only=True)
class MLMTask(Task):
    """An encoder LM on masked windows of text."""

    name = "mlm"
    tokenizer: Tokenizer
    val_text: str
    val_batches: list
    test_text: str
    global_batch: int

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        loss, accuracy = masked_scores(model, self.val_batches)
        return {"val_loss": loss, "val_masked_accuracy": accuracy}

    def _scores(self, model: nn.Module, text: str) -> tuple[float, float]:
        ids, flags = stream(self.config, self.tokenizer, text)
        windows = masked_windows(self.config, self.tokenizer, ids, flags, self.global_batch, None)
        return masked_scores(model, windows)

    def test(self, model: nn.Module) -> dict[str, float]:
        """Loss and masked-token accuracy over every window of the validation and test
        splits (a user's file has no test split)."""
        with torch.no_grad():
            loss, accuracy = self._scores(model, self.val_text)
            out = {"val_loss_full": loss, "val_masked_accuracy_full": accuracy}
            if len(self.tokenizer.encode(self.test_text)) > filled(self.config.max_len) + 1:
                loss, accuracy = self._scores(model, self.test_text)
                out.update(test_loss=loss, test_masked_accuracy=accuracy)
        return out

    def show(self, model: nn.Module) -> str:
        """A validation text with a word hidden, and the model's five best guesses."""
        words, max_len = self.val_text[:400].split()[:40], filled(self.config.max_len)
        while len(words) > 2 and len(self.tokenizer.encode(" ".join(words) + " [MASK]")) > max_len:
            words = words[: len(words) * 3 // 4]  # a text that fits the model
        if len(words) < 3:
            return ""
        hidden = len(words) // 2
        text = " ".join(words[:hidden] + ["[MASK]"] + words[hidden + 1 :])
        guesses = fill_mask(cast(PretrainedModel, model), self.tokenizer, text, top_k=5)[0]
        listed = ", ".join(f"{word} ({p:.2f})" for word, p in guesses)
        return f"{text}\n[MASK] = {words[hidden]!r}; the model's guesses: {listed}"


def masked_scores(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """(mean loss, accuracy) over the masked positions of ``batches``."""
    scores = score(model, batches, outputs=_masked_outputs)
    return scores["loss"], scores["accuracy"]


def _masked_outputs(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The logits and labels of the masked positions only."""
    inputs, labels = batch
    return model(inputs, labels=labels, labelled_only=True).logits, labels[labels != -100]
