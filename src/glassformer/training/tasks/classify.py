"""Classification: an encoder reads a text and names its label (Bloem's classifier).

Training batches are buckets of texts of similar length (long texts keep their head and
tail); evaluation is loss and accuracy on the validation split; the held-out report is
accuracy on the test split; the show is a few validation texts with their verdicts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torch import nn

from glassformer.inference import classifier_inputs, classify_texts
from glassformer.models import (
    BertClassifier,
    BertClassifierConfig,
    BertConfig,
    ClassifierConfig,
    GPTClassifier,
    GPTClassifierConfig,
    GPTConfig,
    TransformerClassifier,
)
from glassformer.models.base import ModelConfig
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    DataOptions,
    MappedBatches,
    Task,
    load_splits,
    tokenizer_files,
)


def classify_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    max_len: int = 256,
    tokenizer=None,
    labels: list[str] | None = None,
    init: str | None = None,
    linear_probe: bool = False,
    show_count: int = 6,
) -> Task:
    from glassformer.data.batching import BucketBatches, collate_labelled
    from glassformer.data.tokenizers import train_tokenizer

    source = None
    if init is not None:  # the encoder, and its tokenizer, come from a pretrained model
        source, init_tokenizer = load_pretrained_encoder(init, max_len, model_overrides)
        if tokenizer is not None and tokenizer.to_json() != init_tokenizer.to_json():
            raise ValueError(f"the run's tokenizer is not the one of --init {init}")
        tokenizer = init_tokenizer
    train_rows, val_rows, test_rows, description = load_splits(opts)
    if opts.max_examples:
        train_rows = train_rows[: opts.max_examples]
    resumed = labels is not None
    labels = labels or sorted({label for _, label in train_rows})
    if len(labels) < 2:
        raise ValueError(f"classification needs at least 2 labels, found {labels}")
    label_id = {label: i for i, label in enumerate(labels)}
    _check_labels(opts, train_rows if resumed else val_rows, labels, resumed)
    tok = tokenizer or train_tokenizer(
        opts.tokenizer_kind,
        [t for t, _ in train_rows],
        vocab_size=opts.vocab_size,
        lowercase=opts.lowercase,
    )

    if source is not None:
        model = classifier_from_encoder(source, len(labels), linear_probe=linear_probe)
    else:
        config = ClassifierConfig.preset(
            preset,
            **{
                "vocab_size": tok.vocab_size,
                "num_classes": len(labels),
                "max_len": max_len,
                "pad_id": tok.pad_id,
                **model_overrides,
            },
        )
        model = TransformerClassifier(config)

    def encode(rows):
        ids = classifier_inputs(model, tok, [t for t, _ in rows], max_len)
        return [(i, label_id[y]) for i, (_, y) in zip(ids, rows, strict=True)]

    train_ex, val_ex = encode(train_rows), encode(val_rows)

    def collate(examples):
        return collate_labelled([i for i, _ in examples], [y for _, y in examples], tok.pad_id)

    buckets = BucketBatches(
        train_ex, batch_size, key=lambda e: len(e[0]), seed=seed, rank=rank, world_size=world_size
    )
    batches = MappedBatches(buckets, collate)
    val_batches = [
        collate(b)
        for b in BucketBatches(val_ex, 64, key=lambda e: len(e[0]), shuffle=False, seed=0)
    ]
    loss_fn = loss_for("classify")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return score(m, val_batches, prefix="val_")

    def test(m: nn.Module) -> dict[str, float]:
        """Accuracy on the test split (or validation, if the data has none)."""
        prefix = "test_" if test_rows else "val_"
        rows = [r for r in (test_rows or val_rows) if r[1] in label_id]
        examples = encode(rows)
        batches = [
            collate(b)
            for b in BucketBatches(examples, 64, key=lambda e: len(e[0]), shuffle=False, seed=0)
        ]
        return {**score(m, batches, prefix=prefix), f"{prefix}examples": len(rows)}

    def show(m: nn.Module) -> str:
        lines = []
        texts = [t for t, _ in val_rows[:show_count]]
        for (text, gold), (pred, p) in zip(
            val_rows[:show_count],
            classify_texts(m, tok, labels, texts, max_len=max_len),
            strict=True,
        ):
            snippet = text[:90].replace("\n", " ") + ("..." if len(text) > 90 else "")
            mark = "ok" if pred == gold else "WRONG"
            lines.append(f"[{mark:>5}] {pred} ({p:.2f}) vs {gold}: {snippet}")
        return "\n".join(lines)

    extra = {
        **tokenizer_files(tok),
        "labels.json": (json.dumps(labels, indent=1) + "\n").encode(),
    }
    return Task(
        name="classify",
        tokenizer=tok,
        model=model,
        batches=batches,
        loss_fn=loss_fn,
        evaluate=evaluate,
        show=show,
        unit="ex",
        extra_files=extra,
        description=description,
        test=test,
    )


# The parts of a model that a classifier's backbone is (the same modules, the same names
# in every model kind), and the kinds of model a classifier can start from.
ENCODER_PARTS = ("embed", "pos_embed", "token_type", "ln_embed", "blocks", "ln_final")
ENCODER_KINDS = ("encoder_lm", "bert", "sentence", "gpt")


def load_pretrained_encoder(
    init: str, max_len: int, model_overrides: dict[str, Any]
) -> tuple[Any, Any]:
    """(model, tokenizer) of what ``--init`` names, checked to be one a classifier can start
    from: a ``glassformer train mlm`` or ``lm`` run (or its checkpoint directory), another
    GPT, all-MiniLM-L6-v2, a sentence-transformers directory or a Hugging Face BERT
    directory."""
    from glassformer.inference import load_run

    if model_overrides:
        raise ValueError(
            f"--init {init} gives the model's shape; leave out "
            f"{', '.join('--' + k.replace('_', '-') for k in sorted(model_overrides))}"
        )
    model, tokenizer = load_run(init)
    kind = getattr(model, "kind", type(model).__name__)
    if kind not in ENCODER_KINDS:
        raise ValueError(
            f"--init {init} holds a {kind!r} model; a classifier starts from a pretrained "
            "encoder or decoder: an mlm or lm run, all-MiniLM-L6-v2, a BERT directory"
        )
    if max_len > model.config.max_len:
        raise ValueError(
            f"--max-len {max_len} is longer than --init {init} reads ({model.config.max_len})"
        )
    return model, tokenizer


def classifier_from_encoder(source: Any, num_classes: int, *, linear_probe: bool = False) -> Any:
    """A classifier whose embeddings and encoder are ``source``'s (copied; its head is new):
    a ``TransformerClassifier`` for glassformer's encoder LM, a ``GPTClassifier`` (the last
    real token's state) for a GPT, a ``BertClassifier`` (mean pooling) for a BERT-style
    encoder. ``linear_probe`` freezes what was copied."""
    model: Any
    if source.kind == "encoder_lm":
        shared = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(ModelConfig)}
        config = ClassifierConfig(
            vocab_size=source.config.vocab_size,
            num_classes=num_classes,
            num_layers=source.config.num_layers,
            **shared,
        )
        model = TransformerClassifier(config)
    elif source.kind == "gpt":  # the causal blocks, and a head on the last real token
        gpt = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(GPTConfig)}
        model = GPTClassifier(GPTClassifierConfig(**gpt, num_classes=num_classes))
    else:  # bert, sentence: BertConfig's fields are the encoder's shape
        bert = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(BertConfig)}
        bert.pop("pooler")
        model = BertClassifier(BertClassifierConfig(**bert, num_classes=num_classes))
    missing, unexpected = model.load_state_dict(source.backbone_state_dict(), strict=False)
    if unexpected or any(not name.startswith("head.") for name in missing):
        raise ValueError(f"the backbones differ: missing {missing}, unexpected {unexpected}")
    for part in ENCODER_PARTS:
        if getattr(model, part, None) is not None:
            getattr(model, part).requires_grad_(not linear_probe)
    return model


def _check_labels(
    opts: DataOptions, rows: list[tuple[str, str]], labels: list[str], resumed: bool
) -> None:
    """Every label in ``rows`` must be one the classifier was (or is being) trained on."""
    unseen = sorted({label for _, label in rows} - set(labels))
    if not unseen:
        return
    source = opts.data or f"corpus {opts.corpus!r}"
    names = ", ".join(repr(label) for label in unseen)
    which = f"label {names}" if len(unseen) == 1 else f"labels {names}"
    where = (
        "was not seen in training" if resumed else "is only in the held-out rows, never in training"
    )
    if len(unseen) > 1:
        where = where.replace("was ", "were ").replace("is only", "are only")
    raise ValueError(f"{source}: {which} {where} (known: {', '.join(labels)})")
