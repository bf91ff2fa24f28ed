"""Masked-language-model pretraining: an encoder learns to fill in hidden words (BERT).

Training batches are random windows of ``max_len`` WordPiece tokens of the text, 15% of
them masked BERT's way (``glassformer.data.masking``; whole words with
``whole_word_mask``); only the masked positions are scored. Evaluation is the loss and the
accuracy on fixed masked windows of the validation split; the held-out report is the same
on the test split; the show is the model's top guesses for a hidden word of a validation
text.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from glassformer.inference import fill_mask
from glassformer.models import EncoderLM, EncoderLMConfig
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import DataOptions, Task, load_splits, tokenizer_files

EVAL_SEED = 1234  # the validation and test masks are the same at every evaluation


def mlm_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    max_len: int = 256,
    mask_prob: float = 0.15,
    whole_word_mask: bool = False,
    tokenizer=None,
    eval_batches: int = 20,
) -> Task:
    from glassformer.data.batching import eval_batches as eval_windows
    from glassformer.data.masking import MaskedLMBatches, mask_tokens
    from glassformer.data.tokenizers import train_tokenizer

    train_text, val_text, test_text, description = load_splits(opts)
    tok = tokenizer or train_tokenizer(
        opts.tokenizer_kind, [train_text], vocab_size=opts.vocab_size, lowercase=opts.lowercase
    )
    mask_id = getattr(tok, "mask_id", None)
    if mask_id is None:
        raise ValueError(
            f"masked-LM training needs a tokenizer with a [MASK] token (wordpiece), "
            f"not {opts.tokenizer_kind!r}"
        )
    specials = sorted({tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id})
    masking = dict(mask_id=mask_id, vocab_size=tok.vocab_size, special_ids=specials)

    def stream(text: str) -> tuple[Tensor, Tensor | None]:
        ids = tok.encode(text)
        flags = None
        if whole_word_mask:  # WordPiece marks a word's later pieces with ##
            flags = torch.tensor([tok.id_to_token(i).startswith("##") for i in ids])
        return torch.tensor(ids, dtype=torch.long), flags

    train_ids, train_flags = stream(train_text)
    val_ids, val_flags = stream(val_text)
    if len(train_ids) <= max_len + 1 or len(val_ids) <= max_len + 1:
        raise ValueError(
            f"need more than {max_len + 1} tokens in each split for --max-len {max_len}; "
            f"got {len(train_ids)} training and {len(val_ids)} validation tokens"
        )
    config = EncoderLMConfig.preset(
        preset,
        **{"vocab_size": tok.vocab_size, "max_len": max_len, "pad_id": tok.pad_id},
        **model_overrides,
    )
    model = EncoderLM(config)
    batches = MaskedLMBatches(
        train_ids,
        max_len,
        batch_size,
        prob=mask_prob,
        continues=train_flags,
        seed=seed,
        rank=rank,
        world_size=world_size,
        **masking,
    )
    loss_fn = loss_for("mlm")

    def masked(ids: Tensor, flags: Tensor | None, limit: int | None) -> list[tuple[Tensor, Tensor]]:
        """Fixed masked windows of a split (the same masks at every evaluation)."""
        g = torch.Generator().manual_seed(EVAL_SEED)
        positions = torch.arange(len(ids))  # windows of positions cut the ids and flags alike
        out = []
        for where, _ in eval_windows(
            positions, max_len, batch_size * world_size, max_batches=limit
        ):
            continues = None if flags is None else flags[where]
            out.append(
                mask_tokens(
                    ids[where], prob=mask_prob, word_continues=continues, generator=g, **masking
                )
            )
        return out

    val_batches = masked(val_ids, val_flags, eval_batches)

    def evaluate(m: nn.Module) -> dict[str, float]:
        loss, accuracy = masked_scores(m, val_batches)
        return {"val_loss": loss, "val_masked_accuracy": accuracy}

    def test(m: nn.Module) -> dict[str, float]:
        """Loss and masked-token accuracy over every window of the validation and test
        splits (a user's file has no test split)."""
        with torch.no_grad():
            loss, accuracy = masked_scores(m, masked(val_ids, val_flags, None))
            out = {"val_loss_full": loss, "val_masked_accuracy_full": accuracy}
            test_ids, test_flags = stream(test_text) if test_text else (torch.empty(0), None)
            if len(test_ids) > max_len + 1:
                loss, accuracy = masked_scores(m, masked(test_ids, test_flags, None))
                out.update(test_loss=loss, test_masked_accuracy=accuracy)
        return out

    def show(m: Any) -> str:
        words = val_text[:400].split()[:40]
        while len(words) > 2 and len(tok.encode(" ".join(words) + " [MASK]")) > max_len:
            words = words[: len(words) * 3 // 4]  # a text that fits the model
        if len(words) < 3:
            return ""
        hidden = len(words) // 2
        text = " ".join(words[:hidden] + ["[MASK]"] + words[hidden + 1 :])
        guesses = fill_mask(m, tok, text, top_k=5)[0]
        listed = ", ".join(f"{word} ({p:.2f})" for word, p in guesses)
        return f"{text}\n[MASK] = {words[hidden]!r}; the model's guesses: {listed}"

    return Task(
        name="mlm",
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


def masked_scores(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """(mean loss, accuracy) over the masked positions of ``batches``."""
    scores = score(model, batches, outputs=_masked_outputs)
    return scores["loss"], scores["accuracy"]


def _masked_outputs(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The logits and labels of the masked positions only."""
    inputs, labels = batch
    return model(inputs, labels=labels, labelled_only=True).logits, labels[labels != -100]
